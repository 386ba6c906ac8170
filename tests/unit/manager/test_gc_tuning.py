"""The manager process's garbage-collector settings (manager/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from accelshare.manager.gc_tuning import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_what_exists_and_raises_the_thresholds() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700  # fewer collections than CPython's default
    assert gc.get_freeze_count() > 1000  # the imported modules, classes, functions
    tune_gc()  # idempotent
    assert gc.get_threshold() == GC_THRESHOLDS


@pytest.mark.usefixtures("restored_gc")
def test_cycles_are_still_collected_after_tuning() -> None:
    tune_gc()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2  # the cycle made after the freeze is found and freed
