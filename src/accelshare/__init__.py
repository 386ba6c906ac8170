"""accelshare: an open compute-session cluster for sharing GPUs and other accelerators."""

__version__ = "0.1.0"
