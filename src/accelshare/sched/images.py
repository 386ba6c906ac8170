"""Image catalogue rules (pure): references, aliases, accelerator support, minimum
resources, and the placement check "this agent has the image".

The manager keeps the catalogue in its database (``images``, ``image_aliases``) and
calls these functions at enqueue and in every scheduling pass; nothing here does I/O.

**Resolution** (:func:`resolve_image`): an alias maps to a reference (``python`` ->
``python:3.11``); a registered reference is itself; a name without a tag that has
one registered tag is *not* guessed (it would turn ambiguous as soon as a second
tag is added) -- register an alias instead.  A name the catalogue does not know resolves to
``None``: the session keeps that name and is placed without an image check (the
behaviour before the catalogue existed; documented in docs/images.md).

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
    "image_refusal",
    "is_valid_ref",
    "resolve_image",
    "split_ref",
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
