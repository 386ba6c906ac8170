"""The docker runtime's container request, as pure data (no engine needed)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel.types import Mount
from accelshare.agent.runtime.base import KernelSpec, ResourceLimits
from accelshare.agent.runtime.docker import (
    DockerRuntimeConfig,
    container_config,
    give_work_dir,
    gpu_device_request,
    repo_tags,
)
from accelshare.agent.scratch import ScratchDir


@dataclass(frozen=True)
class Node:  # same shape as accelshare.accel.types.DeviceNode
    host_path: str
    container_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Bind:  # same shape as accelshare.accel.types.Mount
    source: str
    target: str
    read_only: bool = True


def test_full_container_request(tmp_path: Path) -> None:
    config = DockerRuntimeConfig(scratch_root=tmp_path, agent_id="i-node01", network_mode="none")
    scratch = ScratchDir(tmp_path, "k1")
    spec = KernelSpec(
        kernel_id="k1",
        image="cr.example/python:3.11",
        resource_txt="",
        command=("python", "-c", "print(1)"),
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
        limits=ResourceLimits(
            cpu_count=Decimal("1.5"), cpuset_cpus=(3, 1), mem_bytes=2 << 30, pids_max=100
        ),
        device_nodes=(Node("/dev/nvidia0", "/dev/nvidia0"),),
        mounts=(Bind("/data", "/home/work/data"),),
        device_requests=(gpu_device_request(["GPU-aaa", "GPU-bbb"]),),
        labels={"ai.accelshare.session-id": "s1"},
    )
    body = container_config(spec, scratch, config)
    assert body["Image"] == "cr.example/python:3.11"
    assert body["Cmd"] == ["python", "-c", "print(1)"]
    assert "CUDA_VISIBLE_DEVICES=0,1" in body["Env"]
    assert "ACCELSHARE_KERNEL_ID=k1" in body["Env"]
    assert "BACKENDAI_KERNEL_ID=k1" in body["Env"]
    assert "ACCELSHARE_RESOURCE_TXT=/home/config/resource.txt" in body["Env"]
    assert body["Labels"] == {
        "ai.accelshare.session-id": "s1",
        "ai.accelshare.kernel-id": "k1",
        "ai.accelshare.agent-id": "i-node01",
    }
    assert body["WorkingDir"] == "/home/work"
    host = body["HostConfig"]
    assert host["NanoCpus"] == 1_500_000_000
    assert host["Memory"] == host["MemorySwap"] == 2 << 30
    assert host["PidsLimit"] == 100
    assert host["CpusetCpus"] == "1,3"
    assert host["NetworkMode"] == "none"
    assert host["Mounts"] == [
        {
            "Type": "bind",
            "Source": str(scratch.config_dir),
            "Target": "/home/config",
            "ReadOnly": True,
        },
        {
            "Type": "bind",
            "Source": str(scratch.work_dir),
            "Target": "/home/work",
            "ReadOnly": False,
        },
        {"Type": "bind", "Source": "/data", "Target": "/home/work/data", "ReadOnly": True},
    ]
    assert host["Devices"] == [
        {
            "PathOnHost": "/dev/nvidia0",
            "PathInContainer": "/dev/nvidia0",
            "CgroupPermissions": "rwm",
        }
    ]
    assert host["DeviceRequests"] == [
        {"Capabilities": [["gpu"]], "DeviceIDs": ["GPU-aaa", "GPU-bbb"], "Driver": "nvidia"}
    ]


def test_minimal_request_idles_and_sets_no_limits(tmp_path: Path) -> None:
    config = DockerRuntimeConfig(scratch_root=tmp_path, host_config={"ShmSize": 64 << 20})
    body = container_config(KernelSpec("k2", "busybox", ""), ScratchDir(tmp_path, "k2"), config)
    assert body["Cmd"] == list(config.idle_command)
    host = body["HostConfig"]
    assert not {
        "NanoCpus",
        "Memory",
        "PidsLimit",
        "CpusetCpus",
        "DeviceRequests",
        "Devices",
        "IpcMode",
    } & set(host)
    assert host["ShmSize"] == 64 << 20


def test_mps_clients_get_the_pipe_directory_and_the_hosts_ipc(tmp_path: Path) -> None:
    """A kernel holding enforced GPU shares reaches the agent's MPS daemon from inside
    its container: the pipe directory at the same path, and the host's IPC namespace."""
    pipe = str(tmp_path / ".mps" / "pipe")
    spec = KernelSpec(
        "k4",
        "torch:2",
        "",
        env={"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"},
        mounts=(Mount(pipe, pipe, read_only=False),),
        ipc_host=True,
    )
    body = container_config(spec, ScratchDir(tmp_path, "k4"), DockerRuntimeConfig(tmp_path))
    assert body["HostConfig"]["IpcMode"] == "host"
    assert {"Type": "bind", "Source": pipe, "Target": pipe, "ReadOnly": False} in body[
        "HostConfig"
    ]["Mounts"]
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in body["Env"]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"Drvier": "nvidia"}, "unknown keys"),
        ({"Count": 1, "DeviceIDs": ["a"]}, "Count or DeviceIDs"),
    ],
)
def test_bad_device_requests_are_refused(
    tmp_path: Path, request_: dict[str, object], message: str
) -> None:
    spec = KernelSpec("k3", "busybox", "", device_requests=(request_,))
    with pytest.raises(ValueError, match=message):
        container_config(
            spec, ScratchDir(tmp_path, "k3"), DockerRuntimeConfig(scratch_root=tmp_path)
        )


def test_gpu_device_request_needs_devices() -> None:
    with pytest.raises(ValueError, match="at least one"):
        gpu_device_request([])


def test_startup_command_runs_through_the_containers_shell(tmp_path: Path) -> None:
    config = DockerRuntimeConfig(scratch_root=tmp_path, agent_id="i-node01")
    spec = KernelSpec(
        kernel_id="k1", image="python:3.11", resource_txt="", startup_command="python a.py && ls"
    )
    body = container_config(spec, ScratchDir(tmp_path, "k1"), config)
    assert body["Cmd"] == ["/bin/sh", "-c", "python a.py && ls"]


def test_command_and_startup_command_are_exclusive() -> None:
    with pytest.raises(ValueError, match="not both"):
        KernelSpec(kernel_id="k1", image="i", resource_txt="", command=("a",), startup_command="a")


def test_repo_tags_are_the_images_a_kernel_can_name() -> None:
    listed = [  # GET /images/json, as the engine answers it
        {"Id": "sha256:1", "RepoTags": ["lablup/python:3.11", "python:latest"]},
        {"Id": "sha256:2", "RepoTags": ["<none>:<none>"]},  # dangling
        {"Id": "sha256:3", "RepoTags": None},  # untagged (older engines)
        {"Id": "sha256:4"},  # no key at all
        {"Id": "sha256:5", "RepoTags": ["busybox:1", "python:latest"]},  # a tag seen twice: once
    ]
    assert repo_tags(listed) == ["busybox:1", "lablup/python:3.11", "python:latest"]
    assert repo_tags([]) == []


def test_app_service_ports_are_published_on_their_host_ports(tmp_path: Path) -> None:
    """Published on the address the app proxy connects to only (never all addresses)."""
    config = DockerRuntimeConfig(
        scratch_root=tmp_path, network_mode="bridge", publish_host="10.0.0.5"
    )
    spec = KernelSpec(
        kernel_id="k1",
        image="python:3.11",
        resource_txt="",
        env={"BACKENDAI_SERVICE_PORT_JUPYTER": "8888"},
        published_ports=((8888, 30001), (8080, 30002)),
    )
    body = container_config(spec, ScratchDir(tmp_path, "k1"), config)
    assert body["ExposedPorts"] == {"8888/tcp": {}, "8080/tcp": {}}
    assert body["HostConfig"]["PortBindings"] == {
        "8888/tcp": [{"HostIp": "10.0.0.5", "HostPort": "30001"}],
        "8080/tcp": [{"HostIp": "10.0.0.5", "HostPort": "30002"}],
    }
    single_host = container_config(
        spec, ScratchDir(tmp_path, "k1"), DockerRuntimeConfig(scratch_root=tmp_path)
    )
    assert single_host["HostConfig"]["PortBindings"]["8888/tcp"] == [
        {"HostIp": "127.0.0.1", "HostPort": "30001"}
    ]
    # The kernel keeps listening on its declared port inside the container.
    assert "BACKENDAI_SERVICE_PORT_JUPYTER=8888" in body["Env"]
    plain = container_config(
        KernelSpec(kernel_id="k2", image="python:3.11", resource_txt=""),
        ScratchDir(tmp_path, "k2"),
        config,
    )
    assert "ExposedPorts" not in plain
    assert "PortBindings" not in plain["HostConfig"]


def test_kernels_run_as_the_non_root_user_unprivileged(tmp_path: Path) -> None:
    """Backend.AI's work user by default, all capabilities dropped, no privilege gain,
    and the only host paths mounted are the kernel's own config and work folders."""
    scratch = ScratchDir(tmp_path, "k1")
    body = container_config(KernelSpec("k1", "busybox", ""), scratch, DockerRuntimeConfig(tmp_path))
    assert body["User"] == "1000:1000"
    host = body["HostConfig"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"]
    assert "CapAdd" not in host
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in host["Mounts"]] == [
        (str(scratch.config_dir), "/home/config", True),
        (str(scratch.work_dir), "/home/work", False),
    ]
    assert "HOME=/home/work" in body["Env"]
    custom = container_config(
        KernelSpec("k1", "busybox", "", env={"HOME": "/tmp"}),
        scratch,
        DockerRuntimeConfig(tmp_path, kernel_uid=2001, kernel_gid=3002),
    )
    assert custom["User"] == "2001:3002"
    assert "HOME=/tmp" in custom["Env"]  # the session's own HOME wins


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kernel_uid": 0}, "kernel_uid must be an integer from 1 to 2147483647.*received 0"),
        ({"kernel_gid": -1}, "kernel_gid must be an integer from 1.*received -1"),
        ({"kernel_uid": True}, "kernel_uid.*received True"),
        ({"host_config": {"Privileged": True}}, r"must not set \['Privileged'\]"),
        ({"host_config": {"CapAdd": ["SYS_ADMIN"], "ShmSize": 1}}, r"\['CapAdd'\]"),
        ({"publish_host": "0.0.0.0"}, "publish_host.*received '0.0.0.0'"),
        ({"publish_host": ""}, "publish_host.*received ''"),
    ],
)
def test_bad_security_settings_are_refused(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DockerRuntimeConfig(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_the_work_folder_is_given_to_the_kernel_user(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    if os.geteuid() == 0:
        give_work_dir(work, 2001, 3002)
        assert (work.stat().st_uid, work.stat().st_gid) == (2001, 3002)
        assert work.stat().st_mode & 0o777 == 0o750
    else:  # not root: only to the agent's own uid, else a clear error
        with pytest.raises(PermissionError, match=r"set \[container\] kernel-uid"):
            give_work_dir(work, os.geteuid() + 1, os.getegid())
