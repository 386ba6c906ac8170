"""``accelshare mgr ...``: manager-side administration (config tree, database schema)."""

from __future__ import annotations

import typer

from .mgr_dbschema import dbschema_app
from .mgr_etcd import etcd_app

mgr_app = typer.Typer(help="Manager-side administration.", no_args_is_help=True)
mgr_app.add_typer(etcd_app, name="etcd")
mgr_app.add_typer(dbschema_app, name="dbschema")
