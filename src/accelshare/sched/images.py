"""Image catalogue rules (pure): references, aliases, accelerator support, minimum
resources, and the placement check "this agent has the image".

The manager keeps the catalogue in its database (``images``, ``image_aliases``) and
calls these functions at enqueue and in every scheduling pass; nothing here does I/O.

**Resolution** (:func:`resolve_image`): an alias maps to a reference (``python`` ->
``python:3.11``); a registered reference is itself; a name without a tag that has
one registered tag is *not* guessed (it would turn ambiguous as soon as a second
tag is added) -- register an alias instead.  A name the catalogue does not know resolves to
``None``; the session may still name it when an agent of its scaling group reports it (a
process environment outside the catalogue), and is then placed without an image check.

**Unknown names** (:func:`unknown_image`): a name that is neither in the catalogue nor
reported by an agent of the scaling group is refused at enqueue, with the close known
names (:func:`close_names`), unless nothing can judge it: a scaling group with a *docker*
agent (it pulls any reference), or no catalogue and no agent reporting any image (no
agent registered yet, agents that do not report images): those are accepted as before.

**Accelerators**: a request for any slot of a device other than ``cpu``/``mem``
(``cuda.shares``, ``cuda.device``, ``rocm.device``...) needs that device name among
the image's ``accelerators`` labels, otherwise it is refused.

**Minimum resources** (:func:`apply_minimum`): a slot the user *did not* ask for (it
came from the scaling group's defaults) is raised to the image's minimum; a slot the
user asked for below the minimum is refused, naming the minimum.  Example, image
minimum ``cpu=2 mem=4g``, scaling-group default ``cpu=1 mem=1g``::

    request {}            -> cpu=2 mem=4g            (raised)
    request {mem: 8g}     -> cpu=2 mem=8g            (cpu raised, mem kept)
    request {cpu: 1}      -> refused: cpu 1 is below the image's minimum 2

**Placement** (:func:`image_refusal`): a catalogue image runs only on an agent of the
same runtime kind and architecture; a *process* image needs the agent to report it
(an environment it really has).  A *docker* image absent from the engine is pulled
when the kernel is prepared (PULLING), so the agent need not report it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping, Set
from dataclasses import dataclass, field
from decimal import Decimal

from accelshare.common import BinarySize, ResourceSlot, canonical_decimal

__all__ = [
    "IMAGE_NAME_PATTERN",
    "RUNTIMES",
    "ImageRequirement",
    "ImageRuleError",
    "apply_minimum",
    "check_accelerators",
    "close_names",
    "image_refusal",
    "is_valid_ref",
    "resolve_image",
    "split_ref",
    "unknown_image",
]

RUNTIMES = ("process", "docker")
IMAGE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,255}$"
"""A reference or alias: ``python:3.11``, ``cr.example.org:5000/lablup/pytorch:1.5``."""
_REF = re.compile(IMAGE_NAME_PATTERN)
_HOST_SLOTS = frozenset({"cpu", "mem"})


class ImageRuleError(ValueError):
    """A request the image cannot take: the field at fault, what it takes, what it got."""

    def __init__(self, message: str, *, field: str, expected: str, received: object) -> None:
        super().__init__(message)
        self.field = field
        self.expected = expected
        self.received = received


def split_ref(ref: str) -> tuple[str, str]:
    """``"python:3.11"`` -> ``("python", "3.11")``; no tag -> ``"latest"``.

    A registry port is not a tag: ``"reg:5000/py"`` -> ``("reg:5000/py", "latest")``.

    >>> split_ref("cr.example.org:5000/lablup/python:3.11")
    ('cr.example.org:5000/lablup/python', '3.11')
    """
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


def is_valid_ref(ref: str) -> bool:
    """Whether ``ref`` is spelled like an image reference (see IMAGE_NAME_PATTERN)."""
    return bool(_REF.match(ref))


def resolve_image(name: str, refs: Set[str], aliases: Mapping[str, str]) -> str | None:
    """The catalogue reference ``name`` stands for, or ``None`` when it is not in the
    catalogue.  Aliases win over references of the same spelling.

    >>> resolve_image("python", {"python:3.11"}, {"python": "python:3.11"})
    'python:3.11'
    >>> resolve_image("python:3.11", {"python:3.11"}, {}) , resolve_image("ruby", set(), {})
    ('python:3.11', None)
    """
    if name in aliases:
        return aliases[name]
    if name in refs:
        return name
    return None


@dataclass(frozen=True, slots=True)
class ImageRequirement:
    """What a catalogue image asks of the agent that runs it."""

    ref: str
    runtime: str = "process"  # one of RUNTIMES
    architecture: str = "x86_64"
    accelerators: frozenset[str] = field(default_factory=frozenset)
    min_slots: ResourceSlot = field(default_factory=ResourceSlot)


def _device(slot: str) -> str:
    return slot.split(".", 1)[0]


def _shown(slot: str, amount: Decimal) -> str:
    """``mem`` in short binary form (``2g``), other slots as plain decimals."""
    if slot == "mem" and amount == amount.to_integral_value():
        return format(BinarySize(int(amount)), "s")
    return canonical_decimal(amount)


def check_accelerators(image: ImageRequirement, requested: ResourceSlot) -> None:
    """Refuse a request for an accelerator the image is not labelled for."""
    for slot, amount in requested.items():
        device = _device(slot)
        if device in _HOST_SLOTS or amount == 0:
            continue
        if device not in image.accelerators:
            supported = ", ".join(sorted(image.accelerators)) or "none"
            raise ImageRuleError(
                f"Image {image.ref} does not support {device} (its accelerators: {supported});"
                f" drop {slot} from the request or choose an image labelled for {device}",
                field=f"resources.{slot}",
                expected=f"no {device} slots for image {image.ref}",
                received=str(amount),
            )


def apply_minimum(
    image: ImageRequirement, resolved: ResourceSlot, explicit: Collection[str]
) -> ResourceSlot:
    """``resolved`` with defaulted slots raised to the image's minimum; an explicit
    amount below it is refused (see the module docstring)."""
    raised: dict[str, Decimal] = dict(resolved.items())
    for slot, minimum in image.min_slots.items():
        have = resolved.get_amount(slot)
        if have >= minimum:
            continue
        if slot in explicit:
            raise ImageRuleError(
                f"{slot} {_shown(slot, have)} is below the minimum of image {image.ref}"
                f" ({_shown(slot, minimum)})",
                field=f"resources.{slot}",
                expected=f">= {_shown(slot, minimum)}",
                received=_shown(slot, have),
            )
        if _device(slot) not in _HOST_SLOTS and have == 0:
            continue  # an accelerator minimum applies to sessions that use it
        raised[slot] = minimum
    return ResourceSlot(raised)


def image_refusal(
    image: ImageRequirement | None,
    *,
    agent_runtime: str,
    agent_architecture: str,
    agent_images: Set[str],
) -> str | None:
    """Why an agent cannot run the image (``None``: it can).  ``image=None`` (a name
    outside the catalogue) is never refused here."""
    if image is None:
        return None
    if agent_runtime != image.runtime:
        return f"runs {agent_runtime} kernels; image {image.ref} needs the {image.runtime} runtime"
    if agent_architecture != image.architecture:
        return f"is {agent_architecture}; image {image.ref} is built for {image.architecture}"
    if image.runtime == "process" and image.ref not in agent_images:
        return f"does not have image {image.ref} (no such environment configured)"
    return None


def unknown_image(name: str, *, catalogue: Set[str], reported: Set[str], pulls: bool) -> bool:
    """Whether ``name`` (outside the catalogue's references and aliases) is certainly not
    runnable in the scaling group: no agent reports it (``reported``: the union of the
    group's agents' images), no agent pulls (``pulls``: a docker agent), and there is
    something to judge by (a catalogue, or an agent reporting images).

    >>> unknown_image("pyhton", catalogue={"python"}, reported={"shell"}, pulls=False)
    True
    >>> unknown_image("shell", catalogue={"python"}, reported={"shell"}, pulls=False)
    False
    >>> unknown_image("x", catalogue=set(), reported=set(), pulls=False)  # nothing to judge by
    False
    """
    if pulls or name in catalogue or name in reported:
        return False
    return bool(catalogue or reported)


def close_names(name: str, known: Set[str], limit: int = 5) -> list[str]:
    """The known names closest to ``name``: at most ``limit``, closest first, by the
    spelling of the whole name or of its repository part (``python:3.11`` is close to
    ``pyhton``), ties by the whole name's, then alphabetically; none when nothing is close.

    >>> close_names("pyhton", {"python", "python:3.11", "shell"})
    ['python', 'python:3.11']
    >>> close_names("demo-lib:3.0", {"demo-lib:1.0", "demo-lib:2.0", "shell"}, limit=1)
    ['demo-lib:1.0']
    >>> close_names("cobol", {"python", "shell"})
    []
    """
    base = split_ref(name)[0].lower()
    scored = []
    for other in known:
        whole = difflib.SequenceMatcher(None, name.lower(), other.lower()).ratio()
        repo = difflib.SequenceMatcher(None, base, split_ref(other)[0].lower()).ratio()
        score = max(whole, repo)
        if score >= _CLOSE:
            scored.append((-score, -whole, other))
    return [other for *_, other in sorted(scored)[:limit]]


_CLOSE = 0.6  # difflib's ratio from which a name counts as close (its get_close_matches default)
