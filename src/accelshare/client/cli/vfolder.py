"""``accelshare vfolder ...``: storage folders, in the official client's shapes
(docs/folders.md).

    accelshare vfolder list-hosts
    accelshare vfolder create data [local:volume1] [-g PROJECT] [-p ro] [--cloneable]
    accelshare vfolder upload data train.csv         # tus to the storage proxy
    accelshare vfolder ls data [PATH]
    accelshare vfolder download data train.csv [--dest DIR]
    accelshare vfolder invite data bob@example.com -p ro
    accelshare vfolder update-options data -p ro --set-cloneable true
    accelshare vfolder delete data                   # to the trash; `restore`, `purge`
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import JsonOption, call_api, console, fail, print_json

__all__ = ["vfolder_app"]

vfolder_app = typer.Typer(
    help="Storage folders: data in and out of sessions, shared with others.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="The folder's name (or id).")]
Perm = Annotated[str, typer.Option("-p", "--perm", "--permission", help="ro, rw or wd.")]


def _check_perm(value: str) -> str:
    if value not in ("ro", "rw", "wd"):
        fail(f"the permission is ro, rw or wd (received {value!r})", code=2)
    return value


@vfolder_app.command("list-hosts")
def list_hosts(as_json: JsonOption = False) -> None:
    """The storage hosts (proxy:volume) folders can be created on."""
    hosts = call_api(lambda c: c.folders.hosts())
    if as_json:
        print_json(hosts)
        return
    typer.echo(f"Default vfolder host: {hosts.get('default')}")
    typer.echo(f"Usable hosts: {', '.join(hosts.get('allowed', []))}")


@vfolder_app.command("create")
def create(
    name: Name,
    host: Annotated[
        str | None, typer.Argument(help="proxy:volume (default: the default host).")
    ] = None,
    group: Annotated[
        str | None, typer.Option("-g", "--group", help="A project: a project folder.")
    ] = None,
    usage_mode: Annotated[
        str, typer.Option("-m", "--usage-mode", help="general, data or model.")
    ] = "general",
    permission: Perm = "rw",
    cloneable: Annotated[bool, typer.Option("--cloneable", help="Others may clone it.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a folder."""
    _check_perm(permission)
    folder = call_api(
        lambda c: c.folders.create(
            name,
            host=host,
            group=group,
            usage_mode=usage_mode,
            permission=permission,
            cloneable=cloneable,
        )
    )
    if as_json:
        print_json(folder)
        return
    typer.echo(f'Virtual folder "{folder["name"]}" is created.')


@vfolder_app.command("list")
def list_folders(
    all_: Annotated[bool, typer.Option("--all", help="Every folder (superadmin).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Your folders, your projects' folders and those shared with you."""
    folders = call_api(lambda c: c.folders.list_folders(all_=all_))
    if as_json:
        print_json(folders)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("name", "id", "host", "status", "type", "permission", "owner", "created"):
        table.add_column(column, overflow="fold")
    for f in folders:
        table.add_row(
            f["name"],
            f["id"],
            f["host"],
            f["status"],
            f["ownership_type"],
            f["permission"],
            "yes" if f["is_owner"] else "no",
            f["created_at"] or "-",
        )
    console().print(table)


@vfolder_app.command("info")
def info(name: Name, as_json: JsonOption = False) -> None:
    """A folder's details and usage."""
    result = call_api(
        lambda c: c.folders.info(name), not_found_hint="see `accelshare vfolder list`"
    )
    if as_json:
        print_json(result)
        return
    typer.echo(f'Virtual folder "{result["name"]}" (ID: {result["id"]})')
    for label, key in (
        ("Host", "host"),
        ("Owner", "is_owner"),
        ("Permission", "permission"),
        ("Status", "status"),
        ("Number of files", "numFiles"),
        ("Used bytes", "used_bytes"),
        ("Size limit", "max_size"),
        ("Ownership Type", "type"),
        ("Usage Mode", "usage_mode"),
        ("Group ID", "group"),
        ("User ID", "user"),
        ("Clone Allowed", "cloneable"),
    ):
        typer.echo(f"- {label}: {result.get(key)}")


def _said(message: str, as_json: bool, doc: Any) -> None:
    """``message``, or with ``--json`` the JSON document ``doc``."""
    if as_json:
        print_json(doc)
    else:
        typer.echo(message)


def _upload_one(name: str, path: Path, target: str) -> None:
    call_api(lambda c: c.folders.upload(name, path, target))


def _download_one(name: str, path: str, dest: Path) -> Path:
    return call_api(lambda c: c.folders.download(name, path, dest))


@vfolder_app.command("upload")
def upload(
    name: Name,
    files: Annotated[list[Path], typer.Argument(help="Files to upload.")],
    base_dir: Annotated[
        Path | None,
        typer.Option("-b", "--base-dir", help="Paths in the folder are relative to it."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Upload files (tus to the storage proxy; a broken connection resumes)."""
    base = (base_dir or Path.cwd()).resolve()
    done: list[dict[str, str]] = []
    for source in files:
        path = source if source.is_absolute() else base / source
        if not path.is_file():
            fail(f"{source}: not a file (directories: `accelshare vfolder mkdir` first)", code=2)
        try:
            target = str(path.resolve().relative_to(base))
        except ValueError:
            target = path.name
        _upload_one(name, path, target)
        done.append({"source": str(source), "path": target})
        if not as_json:
            typer.echo(f"Uploaded {source} as {target}")
    _said("Done.", as_json, {"uploaded": done})


@vfolder_app.command("download")
def download(
    name: Name,
    files: Annotated[list[str], typer.Argument(help="Paths in the folder.")],
    dest: Annotated[Path, typer.Option("--dest", "-d", help="Where to write them.")] = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Download files (written whole, or not at all)."""
    done: list[dict[str, str]] = []
    for path in files:
        try:
            written = _download_one(name, path, dest)
        except FileExistsError as e:
            fail(str(e))
        done.append({"path": path, "file": str(written)})
        if not as_json:
            typer.echo(f"Downloaded {path} to {written}")
    _said("Done.", as_json, {"downloaded": done})


@vfolder_app.command("ls")
def ls(
    name: Name,
    path: Annotated[str, typer.Argument(help="A directory in the folder.")] = ".",
    as_json: JsonOption = False,
) -> None:
    """List a directory of the folder."""
    items = call_api(lambda c: c.folders.ls(name, path))
    if as_json:
        print_json(items)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("file name", "size", "modified", "mode"):
        table.add_column(column, overflow="fold")
    for item in items:
        modified = datetime.fromtimestamp(float(item["mtime"])).strftime("%b %d %Y %H:%M:%S")
        table.add_row(item["name"], str(item["size"]), modified, item["mode"])
    console().print(table)


def _print_results(results: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(results)
        if results.get("failed"):
            raise typer.Exit(1)
        return
    for entry in results.get("success", []):
        typer.echo(f"created {entry['item']}")
    failed = results.get("failed", [])
    for entry in failed:
        typer.echo(f"failed {entry['item']}: {entry['msg']}", err=True)
    if failed:
        raise typer.Exit(1)


@vfolder_app.command("mkdir")
def mkdir(
    name: Name,
    paths: Annotated[list[str], typer.Argument(help="Directories to make.")],
    parents: Annotated[bool, typer.Option("-p", "--parents", help="Make parents too.")] = False,
    exist_ok: Annotated[
        bool, typer.Option("-e", "--exist-ok", help="An existing one is fine.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Make directories in the folder."""
    _print_results(
        call_api(lambda c: c.folders.mkdir(name, paths, parents=parents, exist_ok=exist_ok)),
        as_json,
    )


@vfolder_app.command("rm")
def rm(
    name: Name,
    paths: Annotated[list[str], typer.Argument(help="Files or directories.")],
    recursive: Annotated[
        bool, typer.Option("-r", "--recursive", help="Directories with what is in them.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Delete files of the folder."""
    call_api(lambda c: c.folders.rm(name, paths, recursive=recursive))
    _said("Done.", as_json, {"deleted": paths})


@vfolder_app.command("mv")
def mv(
    name: Name,
    src: Annotated[str, typer.Argument(help="The path now.")],
    dst: Annotated[str, typer.Argument(help="The new path.")],
    as_json: JsonOption = False,
) -> None:
    """Move or rename a file in the folder."""
    call_api(lambda c: c.folders.move(name, src, dst))
    _said("Moved.", as_json, {"moved": src, "to": dst})


@vfolder_app.command("rename")
def rename(
    old_name: Name,
    new_name: Annotated[str, typer.Argument(help="The new name.")],
    as_json: JsonOption = False,
) -> None:
    """Rename the folder."""
    call_api(lambda c: c.folders.rename(old_name, new_name))
    _said("Renamed.", as_json, {"renamed": old_name, "to": new_name})


_BOOLS = {
    **dict.fromkeys(("true", "yes", "on", "1"), True),
    **dict.fromkeys(("false", "no", "off", "0"), False),
}


@vfolder_app.command("update-options")
def update_options(
    name: Name,
    permission: Annotated[
        str | None,
        typer.Option(
            "-p", "--permission", "--perm", help="The folder's own permission: ro, rw or wd."
        ),
    ] = None,
    set_cloneable: Annotated[
        str | None,
        typer.Option(
            "--set-cloneable", metavar="BOOL", help="true or false: whether others may clone it."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Change the folder's own permission or whether it is cloneable (what is not given
    stays as it is)."""
    if permission is not None:
        _check_perm(permission)
    cloneable = None
    if set_cloneable is not None:
        cloneable = _BOOLS.get(set_cloneable.lower())
        if cloneable is None:
            fail(f"--set-cloneable is true or false (received {set_cloneable!r})", code=2)
    folder = call_api(
        lambda c: c.folders.update_options(name, permission=permission, cloneable=cloneable)
    )
    _said("Updated.", as_json, folder)


@vfolder_app.command("delete")
def delete(name: Name, as_json: JsonOption = False) -> None:
    """Move the folder to the trash (`restore` brings it back, `purge` deletes it)."""
    call_api(lambda c: c.folders.delete(name))
    _said("Deleted.", as_json, {"trashed": name})


@vfolder_app.command("restore")
def restore(name: Name, as_json: JsonOption = False) -> None:
    """Bring a folder back from the trash."""
    call_api(lambda c: c.folders.restore(name))
    _said("Restored.", as_json, {"restored": name})


@vfolder_app.command("purge")
def purge(name: Name, as_json: JsonOption = False) -> None:
    """Delete a folder in the trash for good, with its files."""
    call_api(lambda c: c.folders.purge(name))
    _said("Purged.", as_json, {"purged": name})


@vfolder_app.command("invite")
def invite(
    name: Name,
    emails: Annotated[list[str], typer.Argument(help="The users' e-mail addresses.")],
    permission: Perm = "rw",
    as_json: JsonOption = False,
) -> None:
    """Invite users to your folder (they accept with `accelshare vfolder invitations`)."""
    _check_perm(permission)
    invited = call_api(lambda c: c.folders.invite(name, emails, permission=permission))
    if as_json:
        print_json({"invited": invited})
        return
    if not invited:
        typer.echo("No users found. Invitation was not sent.")
        return
    typer.echo("Invitation sent to:")
    for email in invited:
        typer.echo(f"\t- {email}")


@vfolder_app.command("invitations")
def invitations(
    accept: Annotated[
        str | None, typer.Option("--accept", help="Accept this invitation id.")
    ] = None,
    reject: Annotated[
        str | None, typer.Option("--reject", help="Reject this invitation id.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Your pending invitations; accept or reject one."""
    if accept:
        call_api(lambda c: c.folders.accept(accept))
        _said("Accepted.", as_json, {"accepted": accept})
        return
    if reject:
        call_api(lambda c: c.folders.reject(reject))
        _said("Rejected.", as_json, {"rejected": reject})
        return
    pending = call_api(lambda c: c.folders.invitations())
    if as_json:
        print_json(pending)
        return
    if not pending:
        typer.echo("No invitations.")
    for inv in pending:
        typer.echo(f"{inv['id']}  {inv['vfolder_name']} from {inv['inviter']} ({inv['perm']})")


@vfolder_app.command("share")
def share(
    name: Name,
    emails: Annotated[list[str], typer.Argument(help="Members of the folder's project.")],
    permission: Perm = "rw",
    as_json: JsonOption = False,
) -> None:
    """Share a project folder with members of its project, with their own permission."""
    _check_perm(permission)
    shared = call_api(lambda c: c.folders.share(name, emails, permission=permission))
    if as_json:
        print_json({"shared": shared, "permission": permission})
        return
    typer.echo(f"Shared with {permission} permission to:")
    for email in shared:
        typer.echo(f"\t- {email}")


@vfolder_app.command("unshare")
def unshare(
    name: Name,
    emails: Annotated[list[str], typer.Argument(help="E-mail addresses.")],
    as_json: JsonOption = False,
) -> None:
    """Take a project folder's share away from users."""
    unshared = call_api(lambda c: c.folders.unshare(name, emails))
    if as_json:
        print_json({"unshared": unshared})
        return
    typer.echo("Unshared from:" if unshared else "No users found. Folder is not unshared.")
    for email in unshared:
        typer.echo(f"\t- {email}")


@vfolder_app.command("clone")
def clone(
    name: Name,
    target_name: Annotated[str, typer.Argument(help="The new folder's name.")],
    target_host: Annotated[str | None, typer.Option("--target-host", help="proxy:volume.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Copy a folder (yours, or one marked cloneable) into a new folder of yours."""
    cloned = call_api(lambda c: c.folders.clone(name, target_name, target_host=target_host))
    _said("Cloning the vfolder is complete.", as_json, cloned)
