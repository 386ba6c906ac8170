"""Image catalogue rules (accelshare.sched.images) and placement by image in a pass."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.sched.images import (
    ImageRequirement,
    ImageRuleError,
    apply_minimum,
    check_accelerators,
    close_names,
    image_refusal,
    is_valid_ref,
    resolve_image,
    split_ref,
    unknown_image,
)
from accelshare.sched.outcome import FailureKind
from accelshare.sched.plan import plan_pass
from accelshare.sched.snapshot import AgentSnapshot, SchedulingSnapshot

from .builders import T0, gpu_agent, session, slots

PY311 = ImageRequirement("python:3.11", min_slots=slots(cpu=2, mem=4096))
TORCH = ImageRequirement("pytorch:1.5", accelerators=frozenset({"cuda"}))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("python", "python:3.11", id="alias"),
        pytest.param("python:3.11", "python:3.11", id="reference"),
        pytest.param("py", "python:3.10", id="alias-wins-over-reference-of-same-spelling"),
        pytest.param("python:3.12", None, id="unknown-tag"),
        pytest.param("ruby", None, id="unknown"),
    ],
)
def test_resolve_image(name: str, expected: str | None) -> None:
    refs = {"python:3.11", "python:3.10", "py"}
    aliases = {"python": "python:3.11", "py": "python:3.10"}
    assert resolve_image(name, refs, aliases) == expected


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("python:3.11", ("python", "3.11")),
        ("python", ("python", "latest")),
        ("reg:5000/lablup/py", ("reg:5000/lablup/py", "latest")),
        ("reg:5000/lablup/py:3.9", ("reg:5000/lablup/py", "3.9")),
    ],
)
def test_split_ref(ref: str, parts: tuple[str, str]) -> None:
    assert split_ref(ref) == parts


@pytest.mark.parametrize("ref", ["", " python", "python 3", "-x", "a" * 300])
def test_invalid_refs(ref: str) -> None:
    assert not is_valid_ref(ref)


def test_accelerator_request_on_an_image_without_support_is_refused() -> None:
    with pytest.raises(ImageRuleError) as caught:
        check_accelerators(PY311, slots(cpu=1, cuda_shares="0.5"))
    assert caught.value.field == "resources.cuda.shares"
    assert caught.value.received == "0.5"
    assert "does not support cuda (its accelerators: none)" in str(caught.value)


def test_accelerator_request_on_a_labelled_image_passes() -> None:
    check_accelerators(TORCH, slots(cpu=1, cuda_shares="0.5"))  # no exception
    check_accelerators(PY311, slots(cpu=1, mem=1024, cuda_shares=0))  # zero asks nothing


@pytest.mark.parametrize(
    ("resolved", "explicit", "expected"),
    [
        pytest.param(slots(cpu=1, mem=1024), set(), slots(cpu=2, mem=4096), id="both-raised"),
        pytest.param(slots(cpu=1, mem=8192), {"mem"}, slots(cpu=2, mem=8192), id="cpu-raised"),
        pytest.param(slots(cpu=4, mem=4096), {"cpu", "mem"}, slots(cpu=4, mem=4096), id="kept"),
    ],
)
def test_defaulted_slots_are_raised_to_the_minimum(
    resolved: object, explicit: set[str], expected: object
) -> None:
    assert apply_minimum(PY311, resolved, explicit) == expected  # type: ignore[arg-type]


def test_explicit_amount_below_the_minimum_is_refused() -> None:
    with pytest.raises(ImageRuleError) as caught:
        apply_minimum(PY311, slots(cpu=1, mem=4096), {"cpu"})
    assert (caught.value.field, caught.value.expected, caught.value.received) == (
        "resources.cpu",
        ">= 2",
        "1",
    )


def test_a_memory_minimum_is_named_in_binary_units() -> None:
    image = ImageRequirement("big:1", min_slots=slots(mem=4 << 30))
    with pytest.raises(ImageRuleError, match=r"mem 1g is below the minimum of image big:1 \(4g\)"):
        apply_minimum(image, slots(cpu=1, mem=1 << 30), {"mem"})


def test_accelerator_minimum_applies_only_to_sessions_using_it() -> None:
    image = replace(TORCH, min_slots=slots(cuda_shares="0.5"))
    assert apply_minimum(image, slots(cpu=1), set()) == slots(cpu=1)
    assert apply_minimum(image, slots(cpu=1, cuda_shares="0.2"), set()) == slots(
        cpu=1, cuda_shares="0.5"
    )


@pytest.mark.parametrize(
    ("runtime", "arch", "images", "reason"),
    [
        pytest.param("process", "x86_64", {"python:3.11"}, None, id="has-it"),
        pytest.param(
            "process",
            "x86_64",
            {"python"},
            "does not have image python:3.11 (no such environment configured)",
            id="missing",
        ),
        pytest.param(
            "docker",
            "x86_64",
            {"python:3.11"},
            "runs docker kernels; image python:3.11 needs the process runtime",
            id="other-runtime",
        ),
        pytest.param(
            "process",
            "aarch64",
            {"python:3.11"},
            "is aarch64; image python:3.11 is built for x86_64",
            id="other-architecture",
        ),
    ],
)
def test_image_refusal(runtime: str, arch: str, images: set[str], reason: str | None) -> None:
    got = image_refusal(
        PY311, agent_runtime=runtime, agent_architecture=arch, agent_images=frozenset(images)
    )
    assert got == reason


def test_docker_image_need_not_be_present_it_is_pulled() -> None:
    image = ImageRequirement("busybox:1.36", runtime="docker")
    refusal = image_refusal(
        image, agent_runtime="docker", agent_architecture="x86_64", agent_images=frozenset()
    )
    assert refusal is None
    assert (
        image_refusal(None, agent_runtime="x", agent_architecture="y", agent_images=set()) is None
    )


def _with_images(snapshot: AgentSnapshot, *images: str) -> AgentSnapshot:
    return replace(snapshot, state=replace(snapshot.state, images=frozenset(images)))


def test_pass_places_only_on_agents_that_have_the_image() -> None:
    agents = [
        _with_images(gpu_agent("a-bare", 0, 0)),
        _with_images(gpu_agent("b-demo", "0.5", "0.5"), "python:3.11"),
    ]
    image = ImageRequirement("python:3.11")
    pending = [
        session("s1", requested_slots=slots(cpu=1), image=image),
        session("free", age_s=1, requested_slots=slots(cpu=1)),  # no catalogue image
    ]
    snapshot = SchedulingSnapshot("default", T0 + timedelta(hours=1), tuple(agents), tuple(pending))
    plan = plan_pass(snapshot)
    placed = {a.session_id: a.agent_id for a in plan.assignments}
    # dispersed would prefer the emptier a-bare; the image rules it out for s1 only
    assert placed == {"s1": "b-demo", "free": "a-bare"}


def test_pass_explains_a_missing_image_per_agent() -> None:
    agents = [_with_images(gpu_agent("a", 0, 0), "python"), _with_images(gpu_agent("b", 0))]
    pending = [session("s", requested_slots=slots(cpu=1), image=ImageRequirement("demo:2.0"))]
    snapshot = SchedulingSnapshot("default", T0 + timedelta(hours=1), tuple(agents), tuple(pending))
    plan = plan_pass(snapshot)
    (failure,) = plan.failures
    assert failure.kind is FailureKind.NO_AGENT
    assert failure.agent_reasons == (
        "a: does not have image demo:2.0 (no such environment configured)",
        "b: does not have image demo:2.0 (no such environment configured)",
    )
    assert "does not have image demo:2.0" in failure.scheduler_data(T0)["msg"]


@pytest.mark.parametrize(
    ("name", "catalogue", "reported", "pulls", "expected"),
    [
        pytest.param("pyhton", {"python"}, {"shell"}, False, True, id="nowhere"),
        pytest.param("python", {"python"}, set(), False, False, id="in-the-catalogue"),
        pytest.param("shell", {"python"}, {"shell"}, False, False, id="an-agent-reports-it"),
        pytest.param("shell", set(), {"python"}, False, True, id="agents-only-judge"),
        pytest.param("x", set(), set(), False, False, id="nothing-to-judge-by"),
        pytest.param("lablup/x:1", {"python"}, {"shell"}, True, False, id="a-docker-agent-pulls"),
    ],
)
def test_unknown_image(
    name: str, catalogue: set[str], reported: set[str], pulls: bool, expected: bool
) -> None:
    assert unknown_image(name, catalogue=catalogue, reported=reported, pulls=pulls) is expected


def test_close_names_by_spelling_and_repository() -> None:
    known = {"python", "python:3.11", "demo-lib:1.0", "demo-lib:2.0", "shell"}
    assert close_names("pyhton", known) == ["python", "python:3.11"]
    assert close_names("python:3.12", known)[:2] == ["python:3.11", "python"]
    assert close_names("demo-lib", known) == ["demo-lib:1.0", "demo-lib:2.0"]
    assert close_names("shel", known, limit=1) == ["shell"]
    assert close_names("cobol", known) == []
    assert close_names("x", set()) == []


NAMES = st.text(alphabet="abcdeyhlnopt:.-0123", min_size=1, max_size=12)


@given(name=NAMES, known=st.sets(NAMES, max_size=12), limit=st.integers(0, 6))
def test_close_names_are_known_distinct_bounded_and_exact_first(
    name: str, known: set[str], limit: int
) -> None:
    found = close_names(name, known, limit)
    assert set(found) <= known
    assert len(found) == len(set(found)) <= limit
    if name in known and limit > 0:
        assert found[0] == name  # nothing is closer than the name itself


@given(
    name=NAMES,
    catalogue=st.sets(NAMES, max_size=5),
    reported=st.sets(NAMES, max_size=5),
    pulls=st.booleans(),
)
def test_a_known_name_or_a_pulling_agent_is_never_unknown(
    name: str, catalogue: set[str], reported: set[str], pulls: bool
) -> None:
    unknown = unknown_image(name, catalogue=catalogue, reported=reported, pulls=pulls)
    if pulls or name in catalogue | reported or not (catalogue or reported):
        assert not unknown
    else:
        assert unknown
