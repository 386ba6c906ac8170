"""``images.lookup`` on a real database: one query resolves a name to its catalogue image
by the rule of :func:`accelshare.sched.images.resolve_image` (aliases win)."""

from __future__ import annotations

import pytest

from accelshare.manager.bootstrap import bootstrap
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.images import lookup
from accelshare.manager.models import Image, ImageAlias
from accelshare.manager.schema import upgrade_schema


@pytest.fixture
async def db(database: Database, manager_config: ManagerConfig) -> Database:
    await upgrade_schema(database)
    await bootstrap(database, manager_config)
    async with database.begin(write=True) as session:
        for ref in ("python:3.11", "python:3.12", "ruby:3"):
            name, tag = ref.split(":")
            session.add(Image(ref=ref, name=name, tag=tag))
        await session.flush()
        session.add(ImageAlias(alias="python", ref="python:3.11"))
        # an alias spelled like another image's reference: the alias wins
        session.add(ImageAlias(alias="python:3.12", ref="ruby:3"))
    return database


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("python", "python:3.11", id="alias-only"),
        pytest.param("python:3.11", "python:3.11", id="reference-only"),
        pytest.param("python:3.12", "ruby:3", id="alias-wins-over-the-same-reference"),
        pytest.param("ruby", None, id="unknown-name"),
        pytest.param("ruby:3", "ruby:3", id="reference-that-an-alias-targets"),
    ],
)
async def test_lookup_resolves_like_the_pure_rule(
    db: Database, name: str, expected: str | None
) -> None:
    async with db.begin() as session:
        image = await lookup(session, name)
    assert (None if image is None else image.ref) == expected
