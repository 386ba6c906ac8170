"""Test helpers of the manager that other packages' tests and benchmarks reuse."""

from .hollow_agent import TWO_FGPU, HollowAgent, HollowCluster, HollowSpec, serve_on_loopback

__all__ = ["TWO_FGPU", "HollowAgent", "HollowCluster", "HollowSpec", "serve_on_loopback"]
