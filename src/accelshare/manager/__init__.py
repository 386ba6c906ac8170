"""accelshare.manager"""
