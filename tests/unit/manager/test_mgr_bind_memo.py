"""The column types' remembering bind processors (``UTCDateTime``, ``ResourceSlotJSON``):
whatever they remember, each value binds exactly what the plain processor binds."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from accelshare.common import ResourceSlot
from accelshare.manager.models import ResourceSlotJSON, UTCDateTime
from accelshare.manager.models import base as models_base

DIALECTS = [sqlite.dialect(), postgresql.dialect()]  # type: ignore[no-untyped-call]
IDS = ["sqlite", "pg"]
KST = timezone(timedelta(hours=9))


def processors(column: TypeDecorator[Any], dialect: Dialect) -> tuple[Callable[..., Any], Any]:
    """(the remembering processor, the plain one) of ``column`` for ``dialect``."""
    remembered = column.bind_processor(dialect)
    plain = TypeDecorator.bind_processor(column, dialect)
    assert remembered is not None
    assert plain is not None
    return remembered, plain


class CountingDateTime(UTCDateTime):
    calls = 0

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        type(self).calls += 1
        return super().process_bind_param(value, dialect)


@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_datetime_binds_what_the_plain_processor_binds(dialect: Dialect) -> None:
    bind, plain = processors(UTCDateTime(), dialect)
    noon_utc = datetime(2024, 1, 2, 12, 0, tzinfo=UTC)
    values = [
        noon_utc,
        noon_utc,
        noon_utc.astimezone(KST),  # the same instant, another offset: equal
        noon_utc + timedelta(microseconds=1),
        None,
        noon_utc,
        None,
    ]
    for value in values:
        assert bind(value) == plain(value)


def test_datetime_remembers_the_last_value_only() -> None:
    CountingDateTime.calls = 0
    bind, _ = processors(CountingDateTime(), sqlite.dialect())
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    later = now + timedelta(seconds=1)
    for value in (now, now, now.astimezone(KST), later, later, now):
        bind(value)
    assert CountingDateTime.calls == 3  # now, later, now again


def test_datetime_still_refuses_a_naive_value_after_an_equal_looking_aware_one() -> None:
    bind, plain = processors(UTCDateTime(), sqlite.dialect())
    aware = datetime(2024, 1, 2, 3, 0, tzinfo=UTC)
    assert bind(aware) == plain(aware)  # remembered now
    with pytest.raises(ValueError, match="naive"):
        bind(aware.replace(tzinfo=None))


@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_slots_bind_what_the_plain_processor_binds(dialect: Dialect) -> None:
    bind, plain = processors(ResourceSlotJSON(), dialect)
    shapes: list[Any] = [
        ResourceSlot({"cpu": 1, "mem": 2**30}),
        ResourceSlot({"cpu": Decimal("1.0"), "mem": 2**30}),  # equal, same text
        ResourceSlot({"mem": 2**30, "cpu": 1}),  # equal, keys in another order: its own text
        ResourceSlot({"cpu": 1, "mem": 2**30, "cuda.shares": 0}),  # equal, one more key
        ResourceSlot({"cpu": Decimal("-0"), "mem": 2**30}),
        ResourceSlot({"cpu": 0, "mem": 2**30}),
        {"cpu": "1.50"},  # a plain mapping: not remembered
        None,
        ResourceSlot({"cpu": 1, "mem": 2**30}),
    ]
    seen = []
    for value in shapes:
        bound = bind(value)
        assert bound == plain(value)
        # the text the database gets (a driver that takes a dict encodes it in order)
        seen.append(bound if isinstance(bound, str) else json.dumps(bound))
    assert seen[0] == seen[1] == seen[-1]
    assert seen[2] != seen[0]
    assert seen[3] != seen[0]
    assert seen[4] == seen[5]


def test_slots_bind_right_while_the_memo_fills_and_is_emptied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(models_base, "_BOUND_SLOTS_MAX", 4)
    bind, plain = processors(ResourceSlotJSON(), sqlite.dialect())
    slots = [ResourceSlot({"cpu": n}) for n in range(10)]
    for _ in range(3):
        for slot in slots:
            assert bind(slot) == plain(slot)
