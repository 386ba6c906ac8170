"""accelshare.web"""
