"""The cuda plugin against a real NVIDIA GPU: how long the plugin takes to start (NVML +
the CUDA driver's SM counts) and what one stats tick costs the agent (``node_stats`` and
``kernel_stats`` over real NVML).  Prints figures; needs an NVIDIA GPU.

    python bench/cuda_bench.py [--ticks 200] [--kernels 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from decimal import Decimal

from accelshare.accel import PluginContext
from accelshare.accel.cuda import create_plugin
from accelshare.accel.types import KernelStatTarget
from accelshare_testkit.gpu import nvidia_gpu_unavailable
from accelshare_testkit.soak import percentile


def summary(samples: list[float]) -> str:
    return (
        f"median {statistics.median(samples):.0f} µs, p99 {percentile(samples, 99):.0f} µs,"
        f" n={len(samples)}"
    )


async def run(ticks: int, kernels: int) -> None:
    started = time.perf_counter()
    plugin = await create_plugin(PluginContext())
    print(
        f"plugin start (nvmlInit, discovery, cuInit + SM counts): "
        f"{(time.perf_counter() - started) * 1000:.1f} ms"
    )
    try:
        devices = plugin.inventory.devices
        print(f"devices: {', '.join(f'{d.model_name} ({d.processors} SMs)' for d in devices)}")
        share = Decimal(1) / max(kernels, 1)
        targets = {
            f"k{i}": KernelStatTarget(
                {"cuda.device": {devices[i % len(devices)].device_id: share}},
                frozenset({os.getpid()}),
            )
            for i in range(kernels)
        }
        for name, call in (
            ("node_stats", plugin.node_stats),
            (f"kernel_stats ({kernels} kernels with pids)", lambda: plugin.kernel_stats(targets)),
        ):
            await call()  # warm-up
            samples = []
            for _ in range(ticks):
                t0 = time.perf_counter()
                await call()
                samples.append((time.perf_counter() - t0) * 1e6)
            print(f"{name}: {summary(samples)}")
    finally:
        await plugin.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--kernels", type=int, default=8)
    args = parser.parse_args()
    why = nvidia_gpu_unavailable()
    if why is not None:
        print(f"cuda_bench: needs an NVIDIA GPU ({why})", file=sys.stderr)
        return 2
    asyncio.run(run(args.ticks, args.kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
