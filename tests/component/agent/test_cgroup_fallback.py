"""Cgroups that exist but cannot be written: the process runtime falls back to rlimits,
says so once in its log, and kernels still start with their memory limit enforced.

The hierarchy is a fake cgroup v1 tree in a temporary directory, found the way the agent
finds the real one (``CgroupLayout.detect`` reading ``self/mountinfo`` and
``self/cgroup`` of a fake proc root) and made read-only the way a container's
``/sys/fs/cgroup`` usually is: a read-only bind mount (``EROFS`` even for root).
Without the privilege to mount, an unprivileged run uses permissions instead (root
ignores those, so root without ``CAP_SYS_ADMIN`` skips, saying why).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.agent.runtime import KernelSpec, ProcessRuntime, ResourceLimits
from accelshare.agent.runtime.cgroups import CgroupLayout, CgroupManager, CgroupVersion

RuntimeFactory = Callable[..., ProcessRuntime]
CONTROLLERS = ("cpu", "memory", "pids")


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def read_only_cgroup_tree(tmp_path: Path) -> Iterator[Path]:
    """A fake proc root whose mountinfo shows cgroup v1 cpu/memory/pids hierarchies in a
    tree under tmp_path that nobody can write into.  Yields the proc root."""
    tree = tmp_path / "cgroup"
    for controller in CONTROLLERS:
        (tree / controller).mkdir(parents=True)
        (tree / controller / "cgroup.procs").write_text("")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        "".join(
            f"{40 + i} 31 0:{50 + i} / {tree / c} ro,relatime - cgroup cgroup ro,{c}\n"
            for i, c in enumerate(CONTROLLERS)
        )
    )
    (proc / "self" / "cgroup").write_text(
        "".join(f"{i + 1}:{c}:/\n" for i, c in enumerate(CONTROLLERS)) + "0::/\n"
    )
    mounted = False
    if os.geteuid() == 0:
        bind = _mount("--bind", str(tree), str(tree))
        if bind.returncode != 0:
            pytest.skip(f"root without the right to mount a read-only tree: {bind.stderr.strip()}")
        mounted = True
        remount = _mount("-o", "remount,bind,ro", str(tree))
        if remount.returncode != 0:
            subprocess.run(["umount", str(tree)], check=False)
            pytest.skip(f"cannot remount the tree read-only: {remount.stderr.strip()}")
    else:
        for controller in CONTROLLERS:
            (tree / controller).chmod(0o555)
    try:
        yield proc
    finally:
        if mounted:
            subprocess.run(["umount", str(tree)], check=False)
        else:
            for controller in CONTROLLERS:
                (tree / controller).chmod(0o755)


async def test_unwritable_cgroups_fall_back_to_rlimits_and_say_so(
    read_only_cgroup_tree: Path,
    make_runtime: RuntimeFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    layout = CgroupLayout.detect(read_only_cgroup_tree)
    assert layout.version is CgroupVersion.V1  # found, as on a real host
    cgroups = CgroupManager(layout, "accelshare-test")
    reasons = cgroups.unwritable()
    assert sorted(reasons) == list(CONTROLLERS)
    expected_why = "read-only file system" if os.geteuid() == 0 else "permission denied"
    assert all(why.startswith(expected_why) for why in reasons.values()), reasons

    with caplog.at_level(logging.INFO, logger="accelshare.agent.runtime.process"):
        runtime = make_runtime(cgroups=cgroups)  # use-cgroups = true (the default)
    assert runtime.cgroups is None
    messages = [r.getMessage() for r in caplog.records]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, messages
    assert "cgroup v1 (cpu, memory, pids) exists but is not writable" in warnings[0]
    assert f"memory: {expected_why} ({layout.v1_mounts['memory']}" in warnings[0]
    assert "fall back to rlimits (memory: RLIMIT_DATA" in warnings[0]
    assert any(
        "limits via rlimits (cgroup v1 (cpu, memory, pids) not writable)" in m for m in messages
    ), messages

    kernel_id = f"fb-{uuid.uuid4().hex[:8]}"
    limits = ResourceLimits(cpu_count=Decimal("0.5"), mem_bytes=192 << 20, pids_max=32)
    info = await runtime.create_kernel(
        KernelSpec(kernel_id, "shell", "SLOTS={}\n", command=("exec sleep 60",), limits=limits)
    )
    assert info.cid is not None
    assert info.limits["memory"] == f"rlimit RLIMIT_DATA={192 << 20}"
    assert info.limits["cpu"] == "not enforced (no writable cgroup cpu controller)"
    assert info.limits["pids"] == "not enforced (no writable cgroup pids controller)"
    proc_limits = Path(f"/proc/{info.cid}/limits").read_text()
    assert re.search(rf"Max data size\s+{192 << 20}\s+{192 << 20}\s+bytes", proc_limits)
    tree = layout.v1_mounts["memory"].parent
    assert sorted(p.name for p in tree.rglob("*")) == sorted(  # nothing was created there
        [*CONTROLLERS, *(["cgroup.procs"] * len(CONTROLLERS))]
    )
    destroyed = await runtime.destroy_kernel(kernel_id, grace_s=1)
    assert destroyed.exit is not None
    await runtime.cleanup_kernel(kernel_id)


async def test_writable_cgroups_are_kept(tmp_path: Path, make_runtime: RuntimeFactory) -> None:
    """The same fake tree, writable: the runtime keeps its cgroups (the check is not a
    blanket refusal)."""
    tree = tmp_path / "cgroup"
    lines = []
    for i, controller in enumerate(CONTROLLERS):
        (tree / controller).mkdir(parents=True)
        lines.append(
            f"{40 + i} 31 0:{50 + i} / {tree / controller} rw - cgroup cgroup rw,{controller}"
        )
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "proc" / "self" / "cgroup").write_text("1:cpu:/\n2:memory:/\n3:pids:/\n")
    cgroups = CgroupManager(CgroupLayout.detect(tmp_path / "proc"), "accelshare-test")
    assert cgroups.unwritable() == {}
    assert make_runtime(cgroups=cgroups).cgroups is cgroups
    assert not (tree / "memory" / "accelshare-test").exists()  # checked, not created


async def test_a_partly_writable_layout_keeps_cgroups_and_warns(
    tmp_path: Path, make_runtime: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """One hierarchy unusable (its mount point is gone): cgroups are kept for the others,
    and the log names the one whose limits fall back."""
    tree = tmp_path / "cgroup"
    for controller in ("cpu", "pids"):
        (tree / controller).mkdir(parents=True)
    layout = CgroupLayout(
        v1_mounts={c: tree / c for c in CONTROLLERS}, v1_self=dict.fromkeys(CONTROLLERS, "/")
    )
    cgroups = CgroupManager(layout, "accelshare-test")
    with caplog.at_level(logging.WARNING, logger="accelshare.agent.runtime.process"):
        assert make_runtime(cgroups=cgroups).cgroups is cgroups
    assert [r.getMessage() for r in caplog.records] == [
        "process runtime: some cgroup hierarchies are not writable (memory: the mount point "
        f"{tree / 'memory'} does not exist); those limits fall back to rlimits or are not "
        "enforced"
    ]
