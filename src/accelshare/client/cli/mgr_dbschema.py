"""``accelshare mgr dbschema ...``: create and migrate the manager database.

Mounted in ``mgr.py`` with ``mgr_app.add_typer(dbschema_app, name="dbschema")``.

* ``oneshot`` — an empty database: create every table from the models and stamp the
  newest migration (refuses a database that already has a schema);
* ``upgrade`` — run the migrations up to the newest;
* ``show`` — the current and the newest revision.

``--json`` prints ``{"database", "exists", "current", "head", "is_current"}`` instead
of the two lines (``current`` is null for an empty or missing database).

The database comes from ``--config manager.toml`` (``[db] url``), default: the
embedded SQLite file under ``./.accelshare``.

SQLAlchemy and Alembic are imported when a command runs, not when the CLI starts
(they cost half a second that every other ``accelshare`` command would pay).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from .common import JsonOption, print_json

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

__all__ = ["dbschema_app"]

dbschema_app = typer.Typer(
    help="Create and migrate the manager database schema (Alembic).", no_args_is_help=True
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-f",
        help="manager.toml to read its [db] table from (default: embedded SQLite in"
        " ./.accelshare).",
        exists=True,
        dir_okay=False,
        readable=True,
    ),
]


def _is_missing_sqlite_file(url: URL) -> bool:
    return (
        url.get_backend_name() == "sqlite"
        and bool(url.database)
        and not Path(str(url.database)).exists()
    )


def _run(
    config_path: Path | None,
    action_name: Literal["oneshot", "upgrade", "show"],
    *,
    as_json: bool = False,
) -> None:
    from accelshare.common import CommonValueError
    from accelshare.manager.config import load_manager_config
    from accelshare.manager.db import Database
    from accelshare.manager.schema import (
        SchemaError,
        SchemaState,
        create_schema_oneshot,
        get_schema_state,
        head_revision,
        upgrade_schema,
    )

    action = {
        "oneshot": create_schema_oneshot,
        "upgrade": upgrade_schema,
        "show": get_schema_state,
    }[action_name]
    try:
        config = load_manager_config(config_path)
    except CommonValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    url = config.db_url
    if action is get_schema_state and _is_missing_sqlite_file(url):  # do not create it to look
        shown = url.render_as_string()
        if as_json:
            print_json(
                {
                    "database": shown,
                    "exists": False,
                    "current": None,
                    "head": head_revision(),
                    "is_current": False,
                }
            )
        else:
            typer.echo(f"database: {shown} (does not exist yet)")
        return
    db = Database.from_config(config)
    if not as_json:
        typer.echo(f"database: {db.safe_url()}")

    async def main() -> SchemaState:
        try:
            return await action(db)
        finally:
            await db.dispose()

    try:
        state = asyncio.run(main())
    except SchemaError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except OSError as e:  # e.g. PostgreSQL not reachable
        typer.echo(f"error: cannot reach the database: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print_json(
            {
                "database": db.safe_url(),
                "exists": True,
                "current": state.current,
                "head": state.head,
                "is_current": state.is_current,
            }
        )
        return
    note = "up to date" if state.is_current else f"behind (newest: {state.head})"
    typer.echo(f"schema revision: {state.current or '(none)'} — {note}")


@dbschema_app.command()
def oneshot(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Create the whole schema in an empty database and stamp the newest revision."""
    _run(config, "oneshot", as_json=as_json)


@dbschema_app.command()
def upgrade(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Apply the pending migrations (creates the schema when the database is empty)."""
    _run(config, "upgrade", as_json=as_json)


@dbschema_app.command()
def show(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Print the database's revision and the newest one."""
    _run(config, "show", as_json=as_json)
