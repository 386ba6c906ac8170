"""The ``accelshare`` command line (typer + rich).

Each command group lives in its own module and is mounted here.  Exit codes: 0
success, 1 a failure (the server refused, a daemon died...), 2 bad arguments; every
error is one ``error: ...`` line on stderr (see group.py for those click finds).
"""

from __future__ import annotations

import typer

from .admin import admin_app
from .agent import agent_app
from .config_cmd import config_app
from .dev import dev_app
from .group import CliGroup
from .image import image_app
from .mgr import mgr_app
from .server import server_app
from .server_manager import manager_command
from .session import session_app
from .vfolder import vfolder_app

server_app.command("manager")(manager_command)

app = typer.Typer(
    name="accelshare",
    help="accelshare: a compute-session cluster for sharing GPUs and other accelerators.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help: help texts show as written ("[etcd] table", "[default: 2g]"), never
    # read as rich markup.  Usage errors are one line (group.py).
    rich_markup_mode=None,
    cls=CliGroup,
)
app.add_typer(session_app, name="session")
app.add_typer(agent_app, name="agent")
app.add_typer(admin_app, name="admin")
app.add_typer(image_app, name="image")
app.add_typer(config_app, name="config")
app.add_typer(dev_app, name="dev")
app.add_typer(mgr_app, name="mgr")
app.add_typer(server_app, name="server")
app.add_typer(vfolder_app, name="vfolder")


def main() -> None:
    app()
