"""accelshare.agent"""
