"""What a local cluster is made of: its options, its files, its generated configs (pure).

The data dir (default ``./.accelshare``)::

    manager.toml               generated at every start
    manager.db                 the manager's SQLite database (kept between runs)
    config-store.db            the embedded config store, shared by manager and agents
    admin-credentials.env      the superadmin's keys, written once by the manager (0600)
    cluster-secret             shared by manager and agents (0600, created once)
    client.env                 ACCELSHARE_ENDPOINT / _ACCESS_KEY / _SECRET_KEY, the config
                               store (ACCELSHARE_CONFIG_STORE...) and PATH (0600)
    mock-accelerator.toml      copy of --mock-config
    storage.toml               the storage proxy's, generated at every start
    storage-secret             the manager's secret for the storage proxy (0600, created once)
    storage/volume1/           the storage proxy's one volume ("local:volume1")
    agents/<id>/agent.toml     generated at every start
    agents/<id>/scratch/       the agent's kernels (scratch dirs, resource.txt)
    logs/manager.log, logs/storage.log, logs/<agent id>.log
    dev-up.lock                held while `accelshare dev up` runs on this dir

Agent ids are stable (``i-dev-01``, ``i-dev-02``...) so that a re-run finds its agents
and their kernels again.
"""

from __future__ import annotations

import json
import shlex
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accelshare.accel.errors import PluginConfigError
from accelshare.accel.options import parse_accelerator_options

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_MOCK_CONFIG",
    "DEFAULT_PORT",
    "STORAGE_PROXY",
    "STORAGE_VOLUME",
    "ClusterLayout",
    "DevClusterOptions",
    "accelerator_options",
    "agent_ids",
    "check_accelerator_options",
    "cli_bin_dir",
    "render_agent_toml",
    "render_client_env",
    "render_manager_toml",
    "render_storage_toml",
    "storage_store_keys",
]

DEFAULT_DATA_DIR = Path(".accelshare")
DEFAULT_PORT = 8081
DEFAULT_MOCK_CONFIG = Path("configs/accelerator/two-fgpu.toml")
HOST = "127.0.0.1"
STORAGE_PROXY = "local"  # the storage proxy's name: volumes are "local:<volume>"
STORAGE_VOLUME = "volume1"


@dataclass(frozen=True, slots=True)
class DevClusterOptions:
    data_dir: Path = DEFAULT_DATA_DIR
    port: int = DEFAULT_PORT
    agents: int = 1
    cpus: int = 8
    mem_bytes: int = 16 * 2**30
    mock_config: Path | None = None  # None: DEFAULT_MOCK_CONFIG, found by resolve_mock_config
    allocation_mode: str = "fractional"
    unit_mem: str | None = None  # None: the plugin's default (2 GiB)
    unit_proc: int | None = None  # None: the plugin's default (8)
    quantum: str | None = None  # None: the plugin's default (0.1 for the mock)
    heartbeat_interval_s: float = 1.0
    # App pages on their own origin: the manager's second listener ([apps] listen-addr);
    # None: on the console's origin.
    apps_port: int | None = None
    # The process runtime's [container] sandbox ("auto", "required", "off"); None: the
    # agent's default (auto)
    sandbox: str | None = None
    # Build the jupyter:4 environment (JupyterLab from the package index) in the
    # background once the cluster is up, and register it when that succeeds.
    jupyter: bool = False
    # Where requirements environments (jupyter:4, `image build`) are built; None:
    # <data-dir>/envs.  A folder shared by several data dirs builds each only once.
    env_cache: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"


def agent_ids(count: int) -> list[str]:
    return [f"i-dev-{n:02d}" for n in range(1, count + 1)]


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """Paths inside the data dir (always absolute)."""

    root: Path

    @classmethod
    def of(cls, data_dir: Path) -> ClusterLayout:
        return cls(data_dir.expanduser().resolve())

    @property
    def manager_toml(self) -> Path:
        return self.root / "manager.toml"

    @property
    def config_store(self) -> Path:
        return self.root / "config-store.db"

    @property
    def credentials(self) -> Path:
        return self.root / "admin-credentials.env"

    @property
    def cluster_secret(self) -> Path:
        return self.root / "cluster-secret"

    @property
    def client_env(self) -> Path:
        return self.root / "client.env"

    @property
    def mock_config(self) -> Path:
        return self.root / "mock-accelerator.toml"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def lock(self) -> Path:
        return self.root / "dev-up.lock"

    @property
    def storage_toml(self) -> Path:
        return self.root / "storage.toml"

    @property
    def storage_secret(self) -> Path:
        return self.root / "storage-secret"

    def volume_dir(self, volume: str = STORAGE_VOLUME) -> Path:
        return self.root / "storage" / volume

    def agent_dir(self, agent_id: str) -> Path:
        return self.root / "agents" / agent_id

    def agent_toml(self, agent_id: str) -> Path:
        return self.agent_dir(agent_id) / "agent.toml"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def render_manager_toml(layout: ClusterLayout, options: DevClusterOptions) -> str:
    # The cluster secret is read from <data-dir>/cluster-secret (manager.toml's default).
    return (
        "# Generated by `accelshare dev up` at every start; edit the command line instead.\n"
        "[manager]\n"
        f"data-dir = {_toml_str(layout.root)}\n"
        f'service-addr = "{HOST}:{options.port}"\n'
        "\n"
        + (
            f'[apps]\nlisten-addr = "{HOST}:{options.apps_port}"\n\n'
            if options.apps_port is not None
            else ""
        )
        + "[config-store]\n"
        'backend = "embedded"\n'
        f"path = {_toml_str(layout.config_store)}\n"
    )


def render_storage_toml(
    layout: ClusterLayout,
    manager_port: int,
    client_port: int,
    secret: str,
    console_port: int | None = None,
) -> str:
    """``console_port``: the manager's port, whose console (on ``127.0.0.1`` or
    ``localhost``) may upload and download from the browser (``cors-origins``)."""
    origins = (
        f'cors-origins = ["http://{HOST}:{console_port}", "http://localhost:{console_port}"]\n'
        if console_port is not None
        else ""
    )
    return (
        "# Generated by `accelshare dev up` at every start; edit the command line instead.\n"
        "[storage-proxy]\n"
        f"node-id = {_toml_str(STORAGE_PROXY)}\n"
        f"secret = {_toml_str(secret)}\n"
        f'manager-api = "{HOST}:{manager_port}"\n'
        f'client-api = "{HOST}:{client_port}"\n'
        f'client-url = "http://{HOST}:{client_port}"\n' + origins + "\n"
        f"[volume.{STORAGE_VOLUME}]\n"
        'backend = "vfs"\n'
        f"path = {_toml_str(layout.volume_dir())}\n"
    )


def storage_store_keys(manager_port: int, client_port: int, secret: str) -> dict[str, str]:
    """What the manager reads to find the storage proxy (Backend.AI's ``volumes/`` keys)."""
    prefix = f"volumes/proxies/{STORAGE_PROXY}"
    return {
        f"{prefix}/manager_api": f"http://{HOST}:{manager_port}",
        f"{prefix}/client_api": f"http://{HOST}:{client_port}",
        f"{prefix}/secret": secret,
        "volumes/default_host": f"{STORAGE_PROXY}:{STORAGE_VOLUME}",
    }


def render_agent_toml(
    layout: ClusterLayout,
    options: DevClusterOptions,
    agent_id: str,
    rpc_port: int,
    environments: str = "",
) -> str:
    """``environments``: extra ``[container.environments."<ref>"]`` tables (the demo
    catalogue's, :mod:`.catalogue`), appended as they are."""
    return (
        "# Generated by `accelshare dev up` at every start; edit the command line instead.\n"
        "[agent]\n"
        f"id = {_toml_str(agent_id)}\n"
        'scaling-group = "default"\n'
        f'rpc-listen-addr = "{HOST}:{rpc_port}"\n'
        'allowed-compute-plugins = ["mock"]\n'
        f"mock-accelerator-config = {_toml_str(layout.mock_config)}\n"
        f"cluster-secret-file = {_toml_str(layout.cluster_secret)}\n"
        f"heartbeat-interval-s = {options.heartbeat_interval_s}\n"
        "\n"
        "[container]\n"
        'runtime = "process"\n'
        "# A development cluster keeps ended kernels' scratch dirs (logs, resource.txt)\n"
        "# so that `accelshare session logs` works after a batch session has finished.\n"
        "keep-scratch = true\n"
        "# Creates are answered once allocated; the kernel's started event follows.\n"
        "start-in-background = true\n"
        f"scratch-root = {_toml_str(layout.agent_dir(agent_id) / 'scratch')}\n"
        + (f"sandbox = {_toml_str(options.sandbox)}\n" if options.sandbox else "")
        + "\n"
        "[resource]\n"
        f"cpu-count = {options.cpus}\n"
        f"memory-size = {options.mem_bytes}\n"
        "\n"
        "[manager]\n"
        f"endpoint = {_toml_str(options.endpoint)}\n"
        "\n"
        "[config-store]\n"
        'backend = "embedded"\n'
        f"path = {_toml_str(layout.config_store)}\n"
        + (
            f"\n# The demo image catalogue's environments (docs/images.md)\n{environments}"
            if environments
            else ""
        )
    )


def render_client_env(
    endpoint: str,
    access_key: str,
    secret_key: str,
    *,
    bin_dir: Path | None = None,
    store_env: Mapping[str, str] | None = None,
) -> str:
    """Sourceable by a shell (``source client.env``) and readable by the SDK (which
    reads the three ``ACCELSHARE_*`` lines and ignores the rest).

    ``bin_dir``: where the ``accelshare`` command lives (``.venv/bin`` after ``make
    run``); put in front of ``PATH`` unless it is there already, so that the README's
    ``accelshare ...`` commands work in a new shell without activating the venv.
    ``store_env``: the variables that select the cluster's configuration store
    (:func:`accelshare.config.config_store_env`), so that ``accelshare mgr etcd ...``
    reaches it from any folder; an empty value is written as ``NAME=''`` (clears it).
    """
    lines = [
        "# accelshare local cluster: `source` this file, then use `accelshare ...`.",
        f"export ACCELSHARE_ENDPOINT={shlex.quote(endpoint)}",
        f"export ACCELSHARE_ACCESS_KEY={shlex.quote(access_key)}",
        f"export ACCELSHARE_SECRET_KEY={shlex.quote(secret_key)}",
    ]
    if store_env:
        lines.append(
            "# the cluster's configuration store, for `accelshare mgr etcd ...` from any folder"
        )
        lines += [f"export {name}={shlex.quote(value)}" for name, value in store_env.items()]
    if bin_dir is not None:
        quoted = shlex.quote(str(bin_dir))
        lines += [
            "# the `accelshare` command of the Python that runs this cluster",
            f'case ":$PATH:" in *:{quoted}:*) ;; *) export PATH={quoted}":$PATH" ;; esac',
        ]
    return "\n".join(lines) + "\n"


def cli_bin_dir() -> Path | None:
    """The folder of the ``accelshare`` script that belongs to the running Python (its
    virtualenv's ``bin``), absolute; None when this Python has none (no PATH line)."""
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / "accelshare").is_file():
            return folder.absolute()
    return None


_OPTION_FLAGS = {
    "allocation_mode": "--allocation-mode",
    "unit_mem": "--unit-mem",
    "unit_proc": "--unit-proc",
    "quantum_size": "--quantum",
}


def accelerator_options(options: DevClusterOptions) -> dict[str, str | None]:
    """Options written under ``config/plugins/accelerator/<slot>/``, as given (None:
    delete the key, so the plugin's default applies); check them with
    :func:`check_accelerator_options` first."""
    return {
        "allocation_mode": options.allocation_mode,
        "unit_mem": options.unit_mem,
        "unit_proc": str(options.unit_proc) if options.unit_proc is not None else None,
        "quantum_size": options.quantum,
    }


def check_accelerator_options(options: DevClusterOptions) -> str | None:
    """The plugin's own validation; returns the error line naming the flag, or None."""
    given = {k: v for k, v in accelerator_options(options).items() if v is not None}
    try:
        parse_accelerator_options(given)
    except PluginConfigError as e:
        flag = _OPTION_FLAGS.get(e.key, e.key)
        return f"{flag} {e.received!r}: expected {e.expected}"
    return None
