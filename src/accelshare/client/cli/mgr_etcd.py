"""``accelshare mgr etcd ...``: read and write the configuration tree.

Same shape as Backend.AI's ``backend.ai mgr etcd``; works on etcd or the embedded
store, whichever the daemons use (``--config FILE``, ``ACCELSHARE_ETCD_ADDR``,
``ACCELSHARE_CONFIG_STORE``; see docs/config-store.md).

An embedded store that does not exist is never made behind the operator's back: every
command refuses (naming the path and where it came from), and only ``put`` and
``put-json`` with ``--create`` make a new, empty one.  A local cluster's ``client.env``
sets ``ACCELSHARE_CONFIG_STORE``, so after ``source .accelshare/client.env`` these
commands reach that cluster's store from any folder.  ``--verbose`` names the store used
on stderr.

Backup and restore::

    accelshare mgr etcd get --prefix '' > backup.json
    accelshare mgr etcd put-json '' backup.json [--replace]

Every failure prints one ``error: ...`` line on stderr and exits with status 1; input
is validated completely before anything is written.  ``--json`` prints one JSON
document: ``get`` the value (``{"key", "scope", "value"}``) or with ``--prefix`` the
tree itself (so ``get --prefix '' --json`` is a backup too); the writes
``{"ok": true, ...}`` with what was done.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from accelshare.config import (
    ConfigFileError,
    ConfigScopes,
    ConfigStore,
    ConfigStoreError,
    ConfigStoreNotFound,
    ConfigStoreSettings,
    load_config_store_settings,
    open_config_store,
)
from accelshare.config.keys import flatten_tree, split_key
from accelshare.config.settings import ENV_CONFIG_STORE

from .common import JsonOption, print_json

etcd_app = typer.Typer(
    help="Read and write the cluster configuration tree (etcd or the embedded store).",
    no_args_is_help=True,
)


class WriteScope(enum.StrEnum):
    GLOBAL = "global"
    SCALING_GROUP = "sgroup"
    NODE = "node"


class ReadScope(enum.StrEnum):
    MERGED = "merged"
    GLOBAL = "global"
    SCALING_GROUP = "sgroup"
    NODE = "node"


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-f",
        help="A TOML file with an [etcd] or [config-store] table (e.g. agent.toml), or a"
        " manager.toml (its [manager] data-dir). $ACCELSHARE_ETCD_ADDR and"
        " $ACCELSHARE_CONFIG_STORE override it; with none of them:"
        " ./.accelshare/config-store.db (which must exist).",
        dir_okay=False,
    ),
]
ScalingGroupOption = Annotated[
    str | None, typer.Option("--sgroup", help="The scaling group of --scope sgroup / merged.")
]
NodeOption = Annotated[
    str | None, typer.Option("--node", help="The node (agent id) of --scope node / merged.")
]
WriteScopeOption = Annotated[
    WriteScope, typer.Option("--scope", help="Which scope to write.", case_sensitive=False)
]
CreateOption = Annotated[
    bool,
    typer.Option(
        "--create",
        help="Make the embedded store if its file does not exist yet (a new, empty store)."
        " Without it a missing store is an error. No effect on etcd.",
    ),
]
VerboseOption = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Say on stderr which store is used and what selected it."),
]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _run(
    config: Path | None,
    scope: str,
    scaling_group: str | None,
    node: str | None,
    body: Callable[[ConfigStore, ConfigScopes], Awaitable[None]],
    *,
    verbose: bool,
    create: bool | None = None,
) -> None:
    """Open the store, run ``body``, turn every expected failure into one error line.

    ``create``: None for the commands without ``--create`` (a missing embedded store is
    an error and the message does not offer the option); True makes a missing one.
    """
    try:
        settings = load_config_store_settings(config)
    except ConfigFileError as e:
        _fail(str(e))
    scaling_group = scaling_group if scaling_group is not None else settings.scaling_group
    node = node if node is not None else settings.node_id
    if scope == "sgroup" and not scaling_group:
        _fail("--scope sgroup needs --sgroup NAME")
    if scope == "node" and not node:
        _fail("--scope node needs --node ID")
    if verbose:
        typer.echo(f"using {_describe(settings)}", err=True)
    if config is not None:
        _warn_if_overridden(config, settings)

    async def main() -> None:
        store = await open_config_store(
            settings, scaling_group=scaling_group, node_id=node, create=bool(create)
        )
        async with store:
            await body(store, ConfigScopes(scope))

    try:
        asyncio.run(main())
    except ConfigStoreNotFound as e:
        _fail(_not_found(settings, e.path, config, offer_create=create is not None))
    except (ConfigStoreError, ConfigFileError) as e:
        _fail(str(e))


def _warn_if_overridden(config: Path, settings: ConfigStoreSettings) -> None:
    """The environment wins over ``--config`` (as for the daemons); say so when that
    moves the command to another store than the file names (e.g. in a shell that
    sourced a local cluster's client.env)."""
    if not settings.location_source.startswith("$"):
        return
    try:
        named = load_config_store_settings(config, env={})
    except ConfigFileError:
        return  # the file alone is incomplete (e.g. backend = "etcd" and an env address)
    if named.location_source == "the default" or _where(named) == _where(settings):
        return
    typer.echo(
        f"warning: {settings.location_source} overrides {named.location_source}"
        f" ({_where(named)}); using {_where(settings)}; unset the variable to use the file's",
        err=True,
    )


def _where(settings: ConfigStoreSettings) -> str:
    if settings.backend == "etcd":
        return f"etcd at {settings.etcd.addr}"
    return f"the embedded store at {os.path.abspath(settings.embedded.path)}"


def _shown(path: Path) -> str:
    """A relative path with its ``./`` (``.accelshare/...`` reads like a typo)."""
    text = str(path)
    return text if path.is_absolute() or text.startswith(("./", "../")) else f"./{text}"


def _describe(settings: ConfigStoreSettings) -> str:
    """Which store, and which step selected it: ``the embedded store at /abs/path
    (namespace 'local'; from $ACCELSHARE_CONFIG_STORE)``."""
    where = _where(settings)
    return f"{where} (namespace {settings.namespace!r}; from {settings.location_source})"


def _not_found(
    settings: ConfigStoreSettings, path: Path, config: Path | None, *, offer_create: bool
) -> str:
    create = "; --create makes a new, empty store there" if offer_create else ""
    if settings.location_source == "the default":
        unnamed = f"; {config} names none" if config is not None else ""
        return (
            f"no configuration store at {_shown(path)} (in {Path.cwd()}{unnamed}):"
            f" pass --config FILE, or set {ENV_CONFIG_STORE} (`source .accelshare/client.env`"
            f" of a local cluster sets it), or run from the cluster's folder{create}"
        )
    shown = path if path.is_absolute() else f"{_shown(path)} in {Path.cwd()}"
    return (
        f"no configuration store at {shown} (from {settings.location_source}):"
        f" check the path{create}"
    )


@etcd_app.command()
def put(
    key: Annotated[str, typer.Argument(help="Key path, e.g. config/agent/max-container-count.")],
    value: Annotated[str, typer.Argument(help="The value (a string; may be empty).")],
    scope: WriteScopeOption = WriteScope.GLOBAL,
    scaling_group: ScalingGroupOption = None,
    node: NodeOption = None,
    config: ConfigOption = None,
    create: CreateOption = False,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Put a single key-value pair."""
    _check_key(key)

    async def body(store: ConfigStore, scope_: ConfigScopes) -> None:
        await store.put(key, value, scope=scope_)
        if as_json:
            print_json({"ok": True, "key": key, "value": value, "scope": str(scope_)})

    _run(config, scope, scaling_group, node, body, verbose=verbose, create=create)


@etcd_app.command("put-json")
def put_json(
    key: Annotated[str, typer.Argument(help="Where to put the tree ('' = the root).")],
    file: Annotated[str, typer.Argument(help="A JSON file holding an object; '-' = stdin.")],
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="Also delete the keys under KEY that the file does not have."
        ),
    ] = False,
    scope: WriteScopeOption = WriteScope.GLOBAL,
    scaling_group: ScalingGroupOption = None,
    node: NodeOption = None,
    config: ConfigOption = None,
    create: CreateOption = False,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Put a JSON object as a tree under KEY, in one transaction (all or nothing)."""
    tree = _load_json_object(file)
    try:
        flat = flatten_tree(tree)
        if "" in flat and not split_key(key, allow_root=True):
            _fail(f"{_name(file)}: the root cannot hold a value (remove the top-level '' key)")
    except ConfigStoreError as e:
        _fail(f"{_name(file)}: {e}")

    async def body(store: ConfigStore, scope_: ConfigScopes) -> None:
        await store.put_prefix(key, tree, scope=scope_, replace=replace)
        if as_json:
            print_json(
                {
                    "ok": True,
                    "key": key,
                    "keys": len(flat),
                    "replace": replace,
                    "scope": str(scope_),
                }
            )

    _run(config, scope, scaling_group, node, body, verbose=verbose, create=create)


@etcd_app.command()
def get(
    key: Annotated[str, typer.Argument(help="Key path ('' = the root, with --prefix).")],
    prefix: Annotated[
        bool, typer.Option("--prefix", help="Print the whole subtree as nested JSON.")
    ] = False,
    scope: Annotated[
        ReadScope,
        typer.Option(
            "--scope",
            help="Which scope to read (merged: node > sgroup > global).",
            case_sensitive=False,
        ),
    ] = ReadScope.GLOBAL,
    scaling_group: ScalingGroupOption = None,
    node: NodeOption = None,
    config: ConfigOption = None,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Print a value, or with --prefix the nested tree under KEY as JSON."""
    if not prefix:
        _check_key(key)

    async def body(store: ConfigStore, scope_: ConfigScopes) -> None:
        if prefix:
            tree = await store.get_prefix(key, scope=scope_)
            typer.echo(json.dumps(tree, indent=2, ensure_ascii=False))
            return
        value = await store.get(key, scope=scope_)
        if value is None:
            _fail(f"no value at {key!r} in the {scope_} scope")
        if as_json:
            print_json({"key": key, "scope": str(scope_), "value": value})
        else:
            typer.echo(value)

    _run(config, scope, scaling_group, node, body, verbose=verbose)


@etcd_app.command()
def delete(
    key: Annotated[str, typer.Argument(help="Key path ('' = everything, with --prefix).")],
    prefix: Annotated[
        bool, typer.Option("--prefix", help="Delete KEY and everything under it.")
    ] = False,
    scope: WriteScopeOption = WriteScope.GLOBAL,
    scaling_group: ScalingGroupOption = None,
    node: NodeOption = None,
    config: ConfigOption = None,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Delete a key, or with --prefix a whole subtree."""
    if not prefix:
        _check_key(key)

    async def body(store: ConfigStore, scope_: ConfigScopes) -> None:
        if prefix:
            await store.delete_prefix(key, scope=scope_)
        else:
            await store.delete(key, scope=scope_)
        if as_json:
            print_json({"ok": True, "key": key, "prefix": prefix, "scope": str(scope_)})

    _run(config, scope, scaling_group, node, body, verbose=verbose)


@etcd_app.command("move-subtree")
def move_subtree(
    src: Annotated[str, typer.Argument(help="The subtree to move.")],
    dst: Annotated[str, typer.Argument(help="Where to move it.")],
    scope: WriteScopeOption = WriteScope.GLOBAL,
    scaling_group: ScalingGroupOption = None,
    node: NodeOption = None,
    config: ConfigOption = None,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Move the subtree at SRC (with its own value) to DST, in one transaction."""
    _check_key(src, "source key")
    _check_key(dst, "destination key")

    async def body(store: ConfigStore, scope_: ConfigScopes) -> None:
        moved = await store.move_prefix(src, dst, scope=scope_)
        if moved == 0:
            _fail(f"nothing to move: no keys at {src!r} in the {scope_} scope")
        if as_json:
            print_json({"ok": True, "src": src, "dst": dst, "moved": moved, "scope": str(scope_)})
        else:
            typer.echo(f"moved {moved} key(s) from {src!r} to {dst!r}")

    _run(config, scope, scaling_group, node, body, verbose=verbose)


def _check_key(key: str, what: str = "key") -> None:
    try:
        split_key(key, what=what)
    except ConfigStoreError as e:
        _fail(str(e))


def _name(file: str) -> str:
    return "stdin" if file == "-" else file


def _load_json_object(file: str) -> dict[str, Any]:
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as e:
        _fail(f"cannot read {file}: {e.strerror}")
    try:
        tree = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        _fail(f"{_name(file)} is not valid JSON: {e}")
    if not isinstance(tree, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(tree), "a number"
        )
        _fail(f"{_name(file)} must hold a JSON object, got {kind}")
    return tree
