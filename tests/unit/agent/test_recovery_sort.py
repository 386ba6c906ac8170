"""Sorting scanned kernels into live / exited / unrecoverable (pure part of recovery)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.agent.recovery import sort_kernels
from accelshare.agent.runtime.base import ExitReason, KernelExit, KernelInfo, KernelState
from accelshare.common import SlotTypes

TYPES = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES, "cuda.shares": SlotTypes.COUNT}


def running(kernel_id: str, scratch: Path | None = Path("/s")) -> KernelInfo:
    return KernelInfo(
        kernel_id,
        "process",
        KernelState.RUNNING,
        cid="1",
        scratch_dir=None if scratch is None else scratch / kernel_id,
    )


def test_sorting() -> None:
    exited = KernelInfo(
        "e", "process", KernelState.EXITED, exit=KernelExit(ExitReason.EXITED, exit_code=3)
    )
    infos = [
        running("b"),
        running("a"),
        exited,
        running("orphan", None),
        running("bad"),
        running("gone"),
    ]
    texts: dict[str, str | OSError] = {
        "a": "CPU_SHARES=0:1\nMEM_SHARES=root:1g\nCUDA.SHARES_SHARES=g1:0.5\n",
        "b": "CPU_SHARES=1:1\nCUDA.SHARES_SHARES=g1:0.3,g2:0.2\nCID=9\n",
        "bad": "CPU_SHARES=0:lots\n",
        "gone": FileNotFoundError(2, "No such file"),
    }
    report = sort_kernels(infos, texts, TYPES)
    assert [k.kernel_id for k in report.live] == ["a", "b"]
    assert report.live[0].allocations["mem"] == {"root": Decimal(1 << 30)}
    assert [i.kernel_id for i in report.exited] == ["e"]
    reasons = {u.info.kernel_id: u.reason for u in report.unrecoverable}
    assert set(reasons) == {"bad", "gone", "orphan"}
    assert "/s/bad/config/resource.txt, line 1" in reasons["bad"]
    assert "orphan" in reasons["orphan"]
    assert report.total_allocations() == {
        "cpu": {"0": Decimal(1), "1": Decimal(1)},
        "mem": {"root": Decimal(1 << 30)},
        "cuda.shares": {"g1": Decimal("0.8"), "g2": Decimal("0.2")},
    }


def test_a_kernel_reported_twice_is_a_bug() -> None:
    with pytest.raises(ValueError, match="reported twice"):
        sort_kernels([running("a"), running("a")], {"a": ""}, TYPES)
