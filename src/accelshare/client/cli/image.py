"""``accelshare image list|info`` (any user) and ``accelshare admin image
add|list|info|alias|unalias|remove`` (superadmin): the image catalogue (docs/images.md).

    accelshare admin image add python:3.11 --alias python --min cpu=1 --min mem=512m \\
        --description "Python 3.11"
    accelshare admin image add pytorch:1.5 --runtime docker --accelerator cuda
    accelshare admin image alias torch pytorch:1.5
    accelshare image list
"""

from __future__ import annotations

import platform
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from accelshare.client.models import ImageInfo

from .args import ArgumentError, parse_pairs
from .common import EXIT_USAGE, JsonOption, call_api, console, fail, print_json

__all__ = ["admin_image_app", "image_app"]

image_app = typer.Typer(help="The image catalogue: what sessions can run.", no_args_is_help=True)
admin_image_app = typer.Typer(help="Manage the image catalogue (superadmin).", no_args_is_help=True)

NameArgument = Annotated[str, typer.Argument(help="A reference (python:3.11) or an alias.")]


def _print_images(images: Sequence[ImageInfo], as_json: bool) -> None:
    if as_json:
        print_json([i.to_json() for i in images])
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("image", "aliases", "runtime", "arch", "accelerators", "minimum", "description"):
        table.add_column(column, overflow="fold")
    for i in images:
        table.add_row(
            i.ref,
            ", ".join(i.aliases) or "-",
            i.runtime,
            i.architecture,
            ", ".join(i.accelerators) or "-",
            " ".join(f"{k}={v}" for k, v in i.to_json().get("min_slots", {}).items()) or "-",
            i.description or "-",
        )
    console().print(table)


def _print_image(image: ImageInfo, as_json: bool) -> None:
    if as_json:
        print_json(image.to_json())
        return
    shown = image.to_json()
    for key in ("ref", "aliases", "runtime", "architecture", "accelerators", "min_slots"):
        value = shown.get(key)
        if isinstance(value, list):
            text = ", ".join(value) or "-"
        elif isinstance(value, dict):
            text = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
        else:
            text = str(value)
        typer.echo(f"{key:<13} {text}")
    typer.echo(f"{'description':<13} {image.description or '-'}")


def image_list(as_json: JsonOption = False) -> None:
    """List the catalogue's images with their aliases."""
    _print_images(call_api(lambda c: c.images.list()), as_json)


def image_info(name: NameArgument, as_json: JsonOption = False) -> None:
    """Show one image (an alias is resolved)."""
    _print_image(call_api(lambda c: c.images.info(name)), as_json)


for _app in (image_app, admin_image_app):
    _app.command("list")(image_list)
    _app.command("info")(image_info)


@admin_image_app.command("add")
def image_add(
    ref: Annotated[str, typer.Argument(help="name:tag, e.g. python:3.11 (no tag: latest).")],
    runtime: Annotated[
        str, typer.Option("--runtime", help="process (an agent environment) or docker.")
    ] = "process",
    architecture: Annotated[str, typer.Option("--arch", help="CPU architecture.")] = "x86_64",
    accelerators: Annotated[
        list[str] | None,
        typer.Option("--accelerator", help="An accelerator it supports (repeat): cuda, rocm."),
    ] = None,
    minimum: Annotated[
        list[str] | None,
        typer.Option("--min", help="Minimum resources KEY=VALUE (repeat): --min cpu=2."),
    ] = None,
    aliases: Annotated[list[str] | None, typer.Option("--alias", help="An alias (repeat).")] = None,
    description: Annotated[str, typer.Option("--description", help="Shown in the UI.")] = "",
    as_json: JsonOption = False,
) -> None:
    """Add an image to the catalogue."""
    try:
        min_slots = parse_pairs(minimum, "--min", "cpu=2") if minimum else {}
    except ArgumentError as e:
        fail(str(e), code=EXIT_USAGE)
    image = call_api(
        lambda c: c.images.add(
            ref,
            runtime=runtime,
            architecture=architecture,
            accelerators=accelerators or (),
            min_slots=min_slots,
            description=description,
            aliases=aliases or (),
        )
    )
    if as_json:
        print_json(image.to_json())
    else:
        typer.echo(f"Image {image.ref} added.")


_REF_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}:[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
REQUIREMENTS_LABEL = "accelshare.requirements"


@admin_image_app.command("build")
def image_build(
    ref: Annotated[str, typer.Argument(help="NAME:VERSION, e.g. numpy:1.26.")],
    requirements: Annotated[
        Path,
        typer.Option(
            "--requirements", "-r", help="A pip requirements file (one requirement a line)."
        ),
    ],
    accelerators: Annotated[
        str,
        typer.Option("--accelerators", help="Accelerators it supports, comma-separated: cuda."),
    ] = "",
    description: Annotated[str, typer.Option("--description", help="Shown in the UI.")] = "",
    envs_dir: Annotated[
        Path,
        typer.Option(
            "--envs-dir",
            help="Where the agents' environments live (dev up: DIR/envs, or its --env-cache).",
        ),
    ] = Path(".accelshare/envs"),
    as_json: JsonOption = False,
) -> None:
    """Build a process environment from a requirements list (a virtualenv, pip install
    -r) on this host and add it to the catalogue.

    Run it on the agent host (with dev up, the same machine). The agents report the
    environment once their agent.toml names it: dev up adds every environment built in
    its envs folder when it starts (restart it); other agents need the printed table.
    """
    from accelshare.devcluster.catalogue import (
        EnvBuildError,
        PipEnvironment,
        build_pip_environment,
        environment_tables,
        parse_requirements,
        pip_image,
    )

    if not _REF_RE.fullmatch(ref):
        fail(
            f"NAME:VERSION {ref!r}: expected a lower-case name and a version such as"
            " numpy:1.26 (letters, digits, '.', '_', '-')",
            code=EXIT_USAGE,
        )
    names = [a.strip() for a in accelerators.split(",") if a.strip()]
    for name in names:
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
            fail(f"--accelerators: expected names such as cuda,rocm, got {name!r}", code=EXIT_USAGE)
    try:
        lines = parse_requirements(
            requirements.read_text(), source=f"--requirements {requirements}"
        )
    except OSError as e:
        fail(f"--requirements {requirements}: cannot read it ({e.strerror})", code=EXIT_USAGE)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)
    env = PipEnvironment(ref, lines, accelerators=tuple(names), description=description)
    envs = envs_dir.resolve()
    image = pip_image(envs, env)
    try:
        build_pip_environment(envs / env.folder_name, env, log=lambda m: console().print(m))
    except EnvBuildError as e:
        fail(str(e))
    info = call_api(
        lambda c: c.images.add(
            ref,
            runtime="process",
            architecture=platform.machine() or "x86_64",
            accelerators=names,
            description=description,
            labels={REQUIREMENTS_LABEL: ",".join(lines)},
        )
    )
    if as_json:
        print_json({**info.to_json(), "environment": image.prefix})
        return
    typer.echo(f"Image {info.ref} built in {image.prefix} and added.")
    typer.echo("The agents report it once agent.toml has (dev up: restart it):")
    typer.echo(environment_tables([image]).rstrip())


@admin_image_app.command("alias")
def image_alias(
    alias: Annotated[str, typer.Argument(help="The alias, e.g. python.")],
    target: Annotated[str, typer.Argument(help="The image it names (reference or alias).")],
    as_json: JsonOption = False,
) -> None:
    """Point an alias at an image (moving it if it exists)."""
    image = call_api(lambda c: c.images.alias(alias, target))
    if as_json:
        print_json(image.to_json())
    else:
        typer.echo(f"Alias {alias} -> {image.ref}.")


@admin_image_app.command("unalias")
def image_unalias(
    alias: Annotated[str, typer.Argument(help="The alias to remove.")],
    as_json: JsonOption = False,
) -> None:
    """Remove an alias (the image stays)."""
    call_api(lambda c: c.images.unalias(alias))
    if as_json:
        print_json({"result": "deleted", "alias": alias})
    else:
        typer.echo(f"Alias {alias} removed.")


@admin_image_app.command("remove")
def image_remove(name: NameArgument, as_json: JsonOption = False) -> None:
    """Remove an image and its aliases (sessions that used it keep the name)."""
    ref = call_api(lambda c: c.images.remove(name))
    if as_json:
        print_json({"result": "deleted", "ref": ref})
    else:
        typer.echo(f"Image {ref} removed.")
