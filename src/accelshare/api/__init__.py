"""accelshare.api"""
