"""Alembic environment for the manager database.

Run through :mod:`accelshare.manager.schema` (``accelshare mgr dbschema ...``), which
hands over an open connection in ``config.attributes["connection"]``.  Without one,
a URL in ``config.attributes["url"]`` is used (async engine, NullPool).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from alembic.autogenerate.render import _repr_type
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.types import TypeDecorator

from accelshare.manager.models import Base

config = context.config
target_metadata = Base.metadata


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render our column types as their plain SQLAlchemy implementation.

    Migrations must not import application types (``ResourceSlotJSON`` ->
    ``sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')``,
    ``UTCDateTime`` -> ``sa.DateTime(timezone=True)``).
    """
    if type_ == "type" and isinstance(obj, TypeDecorator):
        return _repr_type(obj.impl_instance, autogen_context)
    return False


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
        render_item=render_item,
    )


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_url(url: str) -> None:
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=config.attributes.get("url") or config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database: pass config.attributes['connection'] or ['url']")
    asyncio.run(_run_with_url(str(url)))


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
