"""From an allocated kernel to the runtime spec and resource.txt (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, cast

from accelshare.accel import ComputePlugin, KernelResources, Mount
from accelshare.agent.launch import SESSION_ID_ENV, SESSION_ID_LABEL, build_kernel_spec
from accelshare.agent.resource_txt import parse_resource_txt
from accelshare.agent.runtime import KERNEL_ID_LABEL
from accelshare.common import SlotTypes
from accelshare.protocol import CreateKernelRequest

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
SLOT_TYPES = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES, "cuda.shares": SlotTypes.COUNT}


class StubPlugin:
    def __init__(self, resources: KernelResources) -> None:
        self.resources = resources
        self.seen: list[Any] = []

    def kernel_resources(self, allocation: Mapping[str, Any]) -> KernelResources:
        self.seen.append(allocation)
        return self.resources


def plugins() -> dict[str, ComputePlugin]:
    return {
        "cpu": cast(
            ComputePlugin,
            StubPlugin(KernelResources(env={"OMP_NUM_THREADS": "2"}, cpu_set=(0, 1))),
        ),
        "mem": cast(ComputePlugin, StubPlugin(KernelResources(memory_limit_bytes=2 << 30))),
        "cuda": cast(
            ComputePlugin,
            StubPlugin(
                KernelResources(
                    env={"BACKENDAI_MOCK_CUDA_DEVICES": GPU1},
                    resource_lines={"CUDA_GLOBAL_DEVICE_IDS": f"0:{GPU1}"},
                    mounts=(Mount("/src", "/dst"),),
                    device_requests=({"Driver": "nvidia"},),
                )
            ),
        ),
    }


REQUEST = CreateKernelRequest(
    kernel_id="k1",
    session_id="s1",
    image="python",
    requested_slots={"cpu": "2", "mem": "2g", "cuda.shares": "0.5"},
    command=["-c", "pass"],
    environ={
        "USER_VAR": "1",
        "BACKENDAI_MOCK_CUDA_DEVICES": "spoofed",
        "CUDA_VISIBLE_DEVICES": "GPU-other",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/other",
        "BACKENDAI_SERVICE_PORT_WEB": "8080",
    },
    labels={"team": "a"},
)
REQUESTED = {"cpu": Decimal(2), "mem": Decimal(2 << 30), "cuda.shares": Decimal("0.5")}
ALLOCATION = {
    "cuda": {"cuda.shares": {GPU1: Decimal("0.5")}},
    "cpu": {"cpu": {"0": Decimal(1), "1": Decimal(1)}},
    "mem": {"mem": {"root": Decimal(2 << 30)}},
}


def test_spec_env_limits_devices_and_resource_txt() -> None:
    spec, content = build_kernel_spec(REQUEST, REQUESTED, ALLOCATION, plugins(), SLOT_TYPES)
    assert spec.kernel_id == "k1"
    assert spec.image == "python"
    assert spec.command == ("-c", "pass")
    assert spec.env["USER_VAR"] == "1"
    assert spec.env["BACKENDAI_MOCK_CUDA_DEVICES"] == GPU1  # the plugin wins over the request
    # The agent's variables a request carried are dropped, even where no plugin sets them.
    assert "CUDA_VISIBLE_DEVICES" not in spec.env
    assert "CUDA_MPS_PIPE_DIRECTORY" not in spec.env
    assert spec.env["BACKENDAI_SERVICE_PORT_WEB"] == "8080"
    assert spec.env["OMP_NUM_THREADS"] == "2"
    assert spec.env[SESSION_ID_ENV] == "s1"
    assert spec.limits.cpu_count == Decimal(2)
    assert spec.limits.cpuset_cpus == (0, 1)
    assert spec.limits.mem_bytes == 2 << 30
    assert spec.mounts == (Mount("/src", "/dst"),)
    assert spec.device_requests == ({"Driver": "nvidia"},)
    assert spec.labels == {"team": "a", KERNEL_ID_LABEL: "k1", SESSION_ID_LABEL: "s1"}
    lines = spec.resource_txt.splitlines()
    assert 'SLOTS={"cpu":"2","mem":"2147483648","cuda.shares":"0.5"}' in lines
    assert f"CUDA.SHARES_SHARES={GPU1}:0.5" in lines
    assert "CPU_SHARES=0:1,1:1" in lines
    assert "MEM_SHARES=root:2g" in lines
    assert lines[-1] == f"CUDA_GLOBAL_DEVICE_IDS=0:{GPU1}"  # plugin lines after *_SHARES
    assert not any(line.startswith("CID=") for line in lines)
    parsed = parse_resource_txt(spec.resource_txt, SLOT_TYPES)
    assert parsed.allocations == content.allocations


def test_cpuset_outside_the_host_is_not_applied() -> None:
    spec, _ = build_kernel_spec(
        REQUEST, REQUESTED, ALLOCATION, plugins(), SLOT_TYPES, host_cpus=frozenset({0})
    )
    assert spec.limits.cpuset_cpus == ()
    spec, _ = build_kernel_spec(
        REQUEST, REQUESTED, ALLOCATION, plugins(), SLOT_TYPES, host_cpus=frozenset({0, 1, 2})
    )
    assert spec.limits.cpuset_cpus == (0, 1)


def test_plugins_without_an_allocation_are_not_asked() -> None:
    stubs = plugins()
    allocation = {k: v for k, v in ALLOCATION.items() if k != "cuda"}
    spec, _ = build_kernel_spec(REQUEST, REQUESTED, allocation, stubs, SLOT_TYPES)
    assert cast(StubPlugin, stubs["cuda"]).seen == []
    # No GPU held: the request's device variables are not passed on either.
    assert "BACKENDAI_MOCK_CUDA_DEVICES" not in spec.env
    assert "CUDA_VISIBLE_DEVICES" not in spec.env
    assert spec.env["USER_VAR"] == "1"
    assert spec.device_requests == ()
