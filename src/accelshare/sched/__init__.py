"""accelshare.sched"""
