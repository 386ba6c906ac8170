"""The mock devices' simulated readings follow what is allocated on them (issue #33).

Property checks over :class:`~accelshare.accel.stats.MockStatsGenerator`: a free device
idles at the low end, readings stay inside their ranges and memory inside what is held
(plus the baseline), more allocated never means less load once smoothing has converged,
and smoothing bounds how far a reading moves in one tick.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from decimal import Decimal
from statistics import fmean

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelshare.accel.stats import (
    MEM_BASELINE_MAX,
    POWER_MAX_W,
    TEMPERATURE_MAX_C,
    DeviceLoad,
    DeviceSample,
    MockStatsGenerator,
    memory_baseline,
)

D = Decimal
GIB = 2**30
MEM = 40 * GIB
GPU = "gpu-0"
KINDS = ("none", "ema", "random-walk")
SMOOTHED = ("ema", "random-walk")
ROUNDING = D("0.1")  # readings are printed to one decimal

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same examples on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
fractions = st.decimals(min_value=0, max_value=1, places=2)
seeds = st.integers(min_value=0, max_value=2**16)
factors = st.sampled_from([D("0.05"), D("0.1"), D("0.3"), D("0.7"), D("1")])


FACTOR = D("0.3")


def generator(
    smoothing: str, seed: int = 7, factor: Decimal = FACTOR, memory: int = MEM
) -> MockStatsGenerator:
    return MockStatsGenerator([(GPU, memory)], smoothing=smoothing, factor=factor, seed=seed)


def readings(sample: DeviceSample) -> tuple[Decimal, Decimal, Decimal]:
    """Utilisation, power and temperature (a mock device gives all three)."""
    assert sample.util is not None
    assert sample.power is not None
    assert sample.temperature is not None
    return sample.util, sample.power, sample.temperature


def load(fraction: Decimal, memory: int = MEM) -> DeviceLoad:
    """``fraction`` of the device held, with the same fraction of its memory."""
    return DeviceLoad(fraction, int(memory * fraction))


def run(gen: MockStatsGenerator, fractions: Sequence[Decimal]) -> list[DeviceSample]:
    return [gen.tick({GPU: load(a)} if a else None)[GPU] for a in fractions]


def levels(samples: Sequence[DeviceSample]) -> dict[str, float]:
    """Average readings (the expectation, once converged)."""
    return {
        "util": fmean(float(s.util or 0) for s in samples),
        "mem": fmean(s.mem_used for s in samples),
        "power": fmean(float(s.power or 0) for s in samples),
        "temperature": fmean(float(s.temperature or 0) for s in samples),
    }


# -- the low end: a free device --------------------------------------------------------


def test_memory_baseline_is_small() -> None:
    assert memory_baseline(2 * GIB) == 2 * GIB // 100
    assert memory_baseline(MEM) == MEM_BASELINE_MAX == 256 * 2**20
    assert memory_baseline(0) == 0


@PROPERTY
@given(smoothing=st.sampled_from(KINDS), seed=seeds)
def test_a_free_device_idles_at_the_low_end(smoothing: str, seed: int) -> None:
    for sample in run(generator(smoothing, seed), [D(0)] * 40):
        assert sample.util == 0
        assert sample.mem_used == memory_baseline(MEM)
        assert sample.allocated == 0
        _, power, temperature = readings(sample)
        assert 30 <= power <= 70  # idle: ~50 W
        assert 28 <= temperature <= 42  # idle: ~35 °C


def test_nothing_said_means_free() -> None:
    gen = generator("none")
    assert gen.current()[GPU].util == 0
    assert gen.tick()[GPU].util == 0
    assert gen.tick({"another-device": load(D(1))})[GPU].util == 0


@pytest.mark.parametrize("smoothing", KINDS)
def test_released_work_and_memory_go_at_once_heat_fades(smoothing: str) -> None:
    busy = run(gen := generator(smoothing), [D(1)] * 60)[-1]
    busy_util, _, busy_temperature = readings(busy)
    assert busy_util >= 60
    after = run(gen, [D(0)] * 40)
    util, _, temperature = readings(after[0])
    assert util == 0
    assert after[0].mem_used == memory_baseline(MEM)
    if smoothing != "none":  # heat fades over ticks, bounded by the smoothing
        assert temperature > 50
        assert busy_temperature - temperature <= FACTOR * TEMPERATURE_MAX_C + ROUNDING
    assert readings(after[-1])[2] < 45


# -- ranges ----------------------------------------------------------------------------


@PROPERTY
@given(
    smoothing=st.sampled_from(KINDS),
    seed=seeds,
    factor=factors,
    memory=st.sampled_from([5 * GIB, 2 * GIB, MEM, 3 * 2**20]),
    series=st.lists(fractions, min_size=1, max_size=40),
)
def test_readings_stay_in_their_ranges_and_memory_in_what_is_held(
    smoothing: str, seed: int, factor: Decimal, memory: int, series: list[Decimal]
) -> None:
    gen = generator(smoothing, seed, factor, memory)
    for a in series:
        held = load(a, memory)
        sample = gen.tick({GPU: held})[GPU]
        util, power, temperature = readings(sample)
        assert 0 <= util <= 100 * a + ROUNDING / 2
        assert 0 <= sample.mem_used <= memory_baseline(memory) + held.held_bytes
        assert sample.mem_used <= sample.mem_total == memory
        assert 0 <= power <= sample.power_max == POWER_MAX_W
        assert 0 <= temperature <= sample.temperature_max == TEMPERATURE_MAX_C
        assert sample.allocated == a


def test_held_memory_beyond_the_device_is_capped() -> None:
    sample = generator("none").tick({GPU: DeviceLoad(D(1), 2 * MEM)})[GPU]
    assert sample.mem_used <= MEM


@pytest.mark.parametrize(
    ("fraction", "held"), [(D("-0.1"), 0), (D("1.01"), 0), (D("0.5"), -1)], ids=str
)
def test_a_load_outside_its_range_is_refused(fraction: Decimal, held: int) -> None:
    with pytest.raises(ValueError, match=r"negative|not within"):
        DeviceLoad(fraction, held)


# -- monotone in the allocation --------------------------------------------------------


@PROPERTY
@given(smoothing=st.sampled_from(KINDS), seed=seeds, a=fractions, b=fractions)
def test_more_allocated_is_no_less_load_once_converged(
    smoothing: str, seed: int, a: Decimal, b: Decimal
) -> None:
    low, high = sorted((a, b))
    converged = slice(60, None)
    less = levels(run(generator(smoothing, seed), [low] * 260)[converged])
    more = levels(run(generator(smoothing, seed), [high] * 260)[converged])
    for name, value in less.items():
        assert more[name] >= value, name


@pytest.mark.parametrize("smoothing", KINDS)
def test_expected_load_rises_from_idle_to_the_high_end(smoothing: str) -> None:
    """Independent noise per level (other seeds): strictly rising expectations."""
    steps = [D(0), D("0.25"), D("0.5"), D("0.75"), D(1)]
    found = [
        levels(run(generator(smoothing, seed=100 + i), [a] * 460)[60:]) for i, a in enumerate(steps)
    ]
    for name in ("util", "mem", "power", "temperature"):
        values = [level[name] for level in found]
        assert all(a < b for a, b in itertools.pairwise(values)), (name, values)
    idle, full = found[0], found[-1]
    assert idle["util"] == 0
    assert idle["mem"] == memory_baseline(MEM)
    assert 47 <= idle["power"] <= 53  # N(50, 3)
    assert 34 <= idle["temperature"] <= 36  # N(35, 1)
    assert 80 <= full["util"] <= 90  # a × U(70, 100)
    assert 195 <= full["power"] <= 205  # N(200, 15)
    assert 82 <= full["temperature"] <= 88  # N(85, 5)
    expected_mem = memory_baseline(MEM) + 0.6 * MEM  # B + H × U(0.2, 1.0)
    assert abs(full["mem"] - expected_mem) <= 0.05 * MEM


# -- smoothing -------------------------------------------------------------------------


@PROPERTY
@given(
    smoothing=st.sampled_from(SMOOTHED),
    seed=seeds,
    factor=factors,
    series=st.lists(fractions, min_size=2, max_size=40),
)
def test_smoothing_bounds_the_step_per_tick(
    smoothing: str, seed: int, factor: Decimal, series: list[Decimal]
) -> None:
    samples = run(generator(smoothing, seed, factor), series)
    ticks = zip(series, samples, strict=True)
    for (a0, before), (a1, after) in itertools.pairwise(ticks):
        util0, power0, temperature0 = readings(before)
        util1, power1, temperature1 = readings(after)
        assert abs(power1 - power0) <= factor * POWER_MAX_W + ROUNDING
        assert abs(temperature1 - temperature0) <= factor * TEMPERATURE_MAX_C + ROUNDING
        if a1 >= a0:  # nothing released: utilisation and memory move gradually too
            assert abs(util1 - util0) <= factor * 100 + ROUNDING
            assert abs(after.mem_used - before.mem_used) <= factor * MEM + 1
        else:  # released: they fall at once to what is still held
            assert util1 <= 100 * a1 + ROUNDING / 2


def test_smoothing_makes_readings_move_less() -> None:
    def total_jump(samples: list[DeviceSample]) -> Decimal:
        utils = [readings(s)[0] for s in samples]
        return sum((abs(b - a) for a, b in itertools.pairwise(utils)), D(0))

    jumps = {kind: total_jump(run(generator(kind), [D("0.8")] * 200)) for kind in KINDS}
    assert jumps["ema"] < jumps["none"] / 2
    assert jumps["random-walk"] < jumps["none"] / 2


# -- determinism -----------------------------------------------------------------------


@pytest.mark.parametrize("smoothing", KINDS)
def test_a_seed_or_an_injected_random_source_reproduces_a_run(smoothing: str) -> None:
    series = [D(0), D("0.3"), D(1), D(1), D("0.5"), D(0)]
    injected = MockStatsGenerator([(GPU, MEM)], smoothing=smoothing, rng=random.Random(11))
    assert run(injected, series) == run(generator(smoothing, seed=11), series)
    assert run(generator(smoothing, seed=1), series) != run(generator(smoothing, seed=2), series)


# -- a holder's part of the readings ---------------------------------------------------


def test_part_of_the_load_is_the_share_of_what_is_allocated() -> None:
    def sample(allocated: Decimal | None) -> DeviceSample:
        return DeviceSample(GIB, 2 * GIB, D(60), D(100), D(50), allocated=allocated)

    assert sample(D("0.6")).part(D("0.2")) == D("0.2") / D("0.6")
    assert sample(D("0.6")).part(D("0.6")) == 1
    assert sample(D("0.5")).part(D(1)) == 1  # capped
    assert sample(None).part(D("0.25")) == D("0.25")  # real GPUs: the share itself
    assert sample(D(0)).part(D("0.25")) == D("0.25")  # nothing recorded yet
