"""The ``agent.toml`` file: schema, discovery and loading (spec 04-agent.md).

Discovery order (first existing file wins)::

    1. the explicit path (``--config``); it must exist
    2. ./agent.toml
    3. ~/.config/accelshare/agent.toml
    4. /etc/accelshare/agent.toml

Every problem is reported as :class:`AgentConfigError` naming the file, the key
(``agent.rpc-listen-addr``), what was expected and what was received::

    agent.toml: key 'resource.reserved-cpu': expected an integer >= 0 (cores), received -1

"Expected" is said in agent.toml's terms (:data:`EXPECTED`, one entry per key: never a
Python type such as "a valid tuple"); "received" is the value exactly as the file holds
it (not as a validator transformed it, e.g. upper-cased), except for the secret.

Unknown keys are kept out of the model but listed in :attr:`AgentConfig.unknown_keys`
so the agent can warn about typos while still accepting a Backend.AI ``agent.toml``
that carries sections accelshare does not use.

Keys the daemon adds (docs/agent.md has the full table)::

    [agent]
    cluster-secret = "..."            # or cluster-secret-file = "/etc/accelshare/secret"
                                      # (or $ACCELSHARE_CLUSTER_SECRET); required unless
    dev-mode = true                   # ... and rpc-listen-addr is a loopback address
    heartbeat-interval-s = 3.0
    rpc-advertise-url = "http://10.0.0.5:6001"   # what the manager calls (default: from
                                                 # rpc-listen-addr)
    [container]
    keep-scratch = false              # keep a destroyed kernel's scratch dir
    stop-grace-s = 5.0                # SIGTERM -> SIGKILL on destroy
    use-cgroups = true
    cgroup-parent = "accelshare"
    sandbox = "auto"                  # process runtime: kernels in a bubblewrap sandbox where the
                                      # host can ("auto"), always ("required") or never ("off")
    sandbox-network = "none"          # or "outbound" (slirp4netns: other hosts, not the host's loopback)
    sandbox-ro-paths = []             # more host folders every sandbox sees read-only
    sandbox-syscall-filter = true     # seccomp: no new user namespaces, keyrings, bpf, userfaultfd
    rlimit-memory = "data"            # or "as"
    launcher-fork-server = true       # process runtime: creates fork one kept launcher
    prespawn-launchers = 2            # kernel launchers started ahead (when it is off)
    start-in-background = false       # answer creates once allocated (events report)
    docker-url = "unix:///run/docker.sock"
    docker-network = "bridge"         # or "host", "none", "container:NAME", a network name
    port-range = [30000, 31000]       # host ports for the kernels' app services
    kernel-uid = 1000                 # the non-root user kernels run as (both runtimes)
    kernel-gid = 1000
    file-upload-max-bytes = "1g"      # one file put into a kernel's work folder (`session upload`)
    [container.environments.torch]    # more process-runtime "images"
    command-prefix = ["/opt/venvs/torch/bin/python"]
    [cuda]                            # real NVIDIA GPUs (the cuda plugin)
    enforce = "mps"                   # fractional shares enforced through MPS, or "none"
    mps-missing = "warn"              # no MPS in fractional mode: "warn" (advisory) or "refuse"
    mps-control = "nvidia-cuda-mps-control"   # a path, or a name on PATH / the driver's bin
    mps-dir = "/run/accelshare-mps"   # pipe/ and log/ (default: <scratch-root>/.mps)
    mps-check-interval-s = 2.0        # how often the MPS control daemon is checked
"""

from __future__ import annotations

import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from accelshare.common import BinarySize, CommonValueError
from accelshare.config.errors import MISSING, ConfigKeyError

__all__ = [
    "AgentConfig",
    "AgentConfigError",
    "AgentSection",
    "ContainerSection",
    "CudaSection",
    "EtcdSection",
    "ManagerSection",
    "ResourceSection",
    "agent_config_candidates",
    "find_agent_config",
    "load_agent_config",
    "parse_agent_config",
]

DEFAULT_ALLOCATION_ORDER = ("cuda", "rocm", "tpu", "cpu", "mem")
# A Docker network or container name (what the engine accepts for both).
_DOCKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MOCK_ACCELERATOR_FILENAME = "mock-accelerator.toml"
DEFAULT_RPC_MAX_BODY_BYTES = 4 * 1024 * 1024
_MISSING = MISSING


class AgentConfigError(ConfigKeyError):
    """A bad ``agent.toml``: names the file, key, expected and received value."""


def _byte_size(value: Any) -> int:
    """A binary size (``"1g"``, ``1073741824``) as an int; refuses infinity and negatives."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("a byte size such as '1g' or 1073741824")
    try:
        size = int(BinarySize.finite_from_str(value))
    except CommonValueError as e:
        raise ValueError("a byte size such as '1g' or 1073741824") from e
    if size < 0:
        raise ValueError("a byte size >= 0")
    return size


ByteSize = Annotated[int, BeforeValidator(_byte_size)]


def _host_port(value: Any) -> str:
    expected = "'HOST:PORT' with a port in 1..65535, such as '127.0.0.1:6001'"
    if not isinstance(value, str):
        raise ValueError(expected)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(expected)
    return value


HostPort = Annotated[str, BeforeValidator(_host_port)]


def _list_to_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


StrTuple = Annotated[tuple[str, ...], BeforeValidator(_list_to_tuple)]


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


class _Section(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True, strict=True)


class AgentSection(_Section):
    id: str = Field(default_factory=lambda: f"i-{socket.gethostname()}")
    region: str = "local"
    scaling_group: str = Field("default", alias="scaling-group")
    rpc_listen_addr: HostPort = Field("127.0.0.1:6001", alias="rpc-listen-addr")
    # None = every installed plugin; plugins that find nothing to drive are skipped with a
    # warning.  A plugin named here that cannot run stops the agent instead.
    allowed_compute_plugins: StrTuple | None = Field(
        None,
        alias="allowed-compute-plugins",
        validation_alias=AliasChoices("allowed-compute-plugins", "allow-compute-plugins"),
    )
    blocked_compute_plugins: StrTuple = Field((), alias="blocked-compute-plugins")
    allocation_order: StrTuple = Field(DEFAULT_ALLOCATION_ORDER, alias="allocation-order")
    affinity_policy: Annotated[
        Literal["INTERLEAVED", "PREFER_SINGLE_NODE"], BeforeValidator(_upper)
    ] = Field("INTERLEAVED", alias="affinity-policy")
    # Explicit mock-accelerator.toml (relative paths: from agent.toml's folder).
    mock_accelerator_config: Path | None = Field(None, alias="mock-accelerator-config")
    # The shared secret of the agent RPC and the manager's agent endpoints.  Never shown.
    cluster_secret: str | None = Field(None, alias="cluster-secret", repr=False)
    cluster_secret_file: Path | None = Field(None, alias="cluster-secret-file")
    # Run without a cluster secret; only accepted with a loopback rpc-listen-addr.
    dev_mode: bool = Field(False, alias="dev-mode")
    heartbeat_interval_s: float = Field(3.0, alias="heartbeat-interval-s", gt=0, le=3600)
    # The URL the manager uses to reach this agent (default: http://<rpc-listen-addr>).
    rpc_advertise_url: str | None = Field(None, alias="rpc-advertise-url")
    # Bodies over this get 413 from the RPC (docs/reliability.md).  4 MiB: room above the
    # manager's own 1 MiB limit for what it adds to a user's request.
    rpc_max_body_bytes: ByteSize = Field(DEFAULT_RPC_MAX_BODY_BYTES, alias="rpc-max-body-bytes")

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        if (
            isinstance(data, Mapping)
            and "allowed-compute-plugins" in data
            and "allow-compute-plugins" in data
        ):
            raise ValueError(
                "only one of 'allowed-compute-plugins' and 'allow-compute-plugins' (same meaning)"
            )
        return data

    @field_validator("mock_accelerator_config", "cluster_secret_file", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        return Path(value) if isinstance(value, str) else value

    @field_validator("rpc_advertise_url")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("an http(s) URL such as 'http://10.0.0.5:6001'")
        return value.rstrip("/") if value is not None else None

    @field_validator("rpc_max_body_bytes")
    @classmethod
    def _body_limit(cls, value: int) -> int:
        if value < 1024:
            raise ValueError(EXPECTED["agent.rpc-max-body-bytes"])
        return value

    @field_validator("id", "region", "scaling_group")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        # the manager's columns hold 64 characters; its heartbeat endpoint refuses more
        if not value.strip() or len(value) > 64 or any(ord(c) < 0x20 for c in value):
            raise ValueError("a non-empty string of at most 64 printable characters")
        return value


class ContainerSection(_Section):
    runtime: Literal["process", "docker"] = "process"
    scratch_root: Path = Field(Path("./scratch"), alias="scratch-root")
    # Keep a kernel's scratch dir (logs, resource.txt) after it is destroyed.
    keep_scratch: bool = Field(False, alias="keep-scratch")
    stop_grace_s: float = Field(5.0, alias="stop-grace-s", ge=0)
    # Process runtime: limits through cgroups (else rlimits), where kernel cgroups go
    # (relative to the agent's own cgroup unless absolute), rlimit kind.
    use_cgroups: bool = Field(True, alias="use-cgroups")
    cgroup_parent: str = Field("accelshare", alias="cgroup-parent")
    # Process runtime: each kernel in a bubblewrap sandbox (agent/runtime/sandbox.py):
    # "auto" where the host can (else unsandboxed and single-user, loudly), "required"
    # (the agent does not start without), "off" (single-user); its network, and more
    # host folders it sees read-only.
    sandbox: Literal["auto", "required", "off"] = "auto"
    sandbox_network: Literal["none", "outbound"] = Field("none", alias="sandbox-network")
    sandbox_ro_paths: list[Path] = Field(default_factory=list, alias="sandbox-ro-paths")
    # A seccomp filter in every sandbox: no new user namespaces, keyrings, bpf,
    # userfaultfd (agent/runtime/sandbox.py, SYSCALL_FILTER_DENIED).
    sandbox_syscall_filter: bool = Field(True, alias="sandbox-syscall-filter")
    rlimit_memory: Literal["data", "as"] = Field("data", alias="rlimit-memory")
    # Process runtime: one launcher kept up as a fork server, forked per create (saves
    # the Python start on each create); false: spare launchers started ahead (0: none).
    launcher_fork_server: bool = Field(True, alias="launcher-fork-server")
    prespawn_launchers: int = Field(2, alias="prespawn-launchers", ge=0, le=16)
    # Answer a create RPC once the kernel's resources are allocated and start it in the
    # background (its started/failed event reports the outcome); false: the answer
    # waits for the start.  Frees the manager's per-agent binds from the start's time.
    start_in_background: bool = Field(False, alias="start-in-background")
    # Docker runtime: the engine (None: DOCKER_HOST or the default socket), and the
    # network of the kernels' containers (HostConfig.NetworkMode).
    docker_url: str | None = Field(None, alias="docker-url")
    docker_network: str = Field("bridge", alias="docker-network")
    # An image absent from the engine is pulled at most this long (keep it below the
    # manager's agent RPC timeout); 0 = never pull.
    docker_pull_timeout_s: float = Field(20.0, alias="docker-pull-timeout-s", ge=0, le=3600)
    # The non-root user kernels run as (docker: Backend.AI's ``work`` user; process: in
    # the sandbox); the agent gives each kernel's work folder to it.
    kernel_uid: int = Field(1000, alias="kernel-uid", ge=1, le=2**31 - 1)
    kernel_gid: int = Field(1000, alias="kernel-gid", ge=1, le=2**31 - 1)
    # Host ports for the kernels' app services (inclusive; Backend.AI's port-range): each
    # declared service of each kernel gets its own (docs/agent.md).
    port_range: tuple[int, int] = Field((30000, 31000), alias="port-range")
    # One file put into a kernel's work folder (`session upload`, agent/kernel_files.py):
    # larger ones get 413 and leave nothing behind.
    file_upload_max_bytes: ByteSize = Field(1 << 30, alias="file-upload-max-bytes", ge=1)
    # Process-runtime environments ("images") beyond the built-in python and shell:
    # name -> {command-prefix, image-dir, env, idle-command}; checked by the agent.
    environments: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("scratch_root", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        return Path(value) if isinstance(value, str) else value

    @field_validator("sandbox_ro_paths", mode="before")
    @classmethod
    def _ro_paths(cls, value: Any) -> Any:
        if not isinstance(value, list) or not all(
            isinstance(v, str) and v.startswith("/") and "\x00" not in v for v in value
        ):
            raise ValueError(EXPECTED["container.sandbox-ro-paths"])
        return [Path(v) for v in value]

    @field_validator("cgroup_parent")
    @classmethod
    def _cgroup_parent(cls, value: str) -> str:
        if not value.strip("/") or ".." in value.split("/"):
            raise ValueError("a cgroup path such as 'accelshare' or '/accelshare'")
        return value

    @field_validator("port_range", mode="before")
    @classmethod
    def _port_range_list(cls, value: Any) -> Any:
        # TOML has arrays, not tuples (the section is strict).
        if isinstance(value, list) and len(value) == 2:
            return tuple(value)
        return value

    @field_validator("port_range")
    @classmethod
    def _port_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not 1024 <= low <= high <= 65535:
            raise ValueError(EXPECTED["container.port-range"])
        return value

    @field_validator("docker_network")
    @classmethod
    def _docker_network(cls, value: str) -> str:
        name = value.removeprefix("container:")
        if not _DOCKER_NAME.fullmatch(name):
            raise ValueError(EXPECTED["container.docker-network"])
        return value


class ResourceSection(_Section):
    reserved_cpu: int = Field(1, alias="reserved-cpu", ge=0)
    reserved_mem: ByteSize = Field(1024**3, alias="reserved-mem")
    # Fixed capacities instead of detection (development clusters, tests, hollow agents).
    cpu_count: int | None = Field(None, alias="cpu-count", ge=1)
    memory_size: ByteSize | None = Field(None, alias="memory-size")

    @field_validator("memory_size")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("a byte size > 0")
        return value


class CudaSection(_Section):
    """``[cuda]``: how the cuda plugin enforces fractional GPU shares (docs/plugins.md)."""

    enforce: Literal["mps", "none"] = "mps"
    mps_missing: Literal["warn", "refuse"] = Field("warn", alias="mps-missing")
    mps_control: str = Field("nvidia-cuda-mps-control", alias="mps-control", min_length=1)
    mps_dir: Path | None = Field(None, alias="mps-dir")
    mps_check_interval_s: float = Field(2.0, alias="mps-check-interval-s", gt=0, le=3600)

    @field_validator("mps_dir", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        return Path(value) if isinstance(value, str) and value else value


class ManagerSection(_Section):
    # one URL, or a list: several manager replicas, tried in order (failover)
    endpoint: str | list[str] = "http://127.0.0.1:8081"

    @field_validator("endpoint", mode="before")  # before: errors name the key, not a union arm
    @classmethod
    def _url(cls, value: object) -> object:
        urls = [value] if isinstance(value, str) else value
        if not isinstance(urls, list) or not urls:
            raise ValueError("an http(s) URL such as 'http://127.0.0.1:8081', or a list of them")
        for url in urls:
            if (
                not isinstance(url, str)
                or not url.startswith(("http://", "https://"))
                or len(url.split("://", 1)[1]) == 0
            ):
                raise ValueError("an http(s) URL such as 'http://127.0.0.1:8081'")
        return value

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The manager URLs in the order they are tried."""
        return (self.endpoint,) if isinstance(self.endpoint, str) else tuple(self.endpoint)


class EtcdSection(_Section):
    """[etcd]; the other keys (user, password, timeout-s...) belong to
    :mod:`accelshare.config.settings`, which validates them when the store is opened."""

    model_config = ConfigDict(populate_by_name=True, extra="allow", frozen=True, strict=True)

    addr: HostPort = "127.0.0.1:2379"
    namespace: str = "local"


class AgentConfig(_Section):
    agent: AgentSection = Field(default_factory=AgentSection)
    container: ContainerSection = Field(default_factory=ContainerSection)
    resource: ResourceSection = Field(default_factory=ResourceSection)
    manager: ManagerSection = Field(default_factory=ManagerSection)
    cuda: CudaSection = Field(default_factory=CudaSection)
    etcd: EtcdSection | None = None  # absent: the embedded config store
    # [config-store] belongs to accelshare.config.settings (validated when opening the store)
    config_store: dict[str, Any] = Field(default_factory=dict, alias="config-store")
    # [redis] belongs to accelshare.bus.settings (validated when the agent starts)
    redis: dict[str, Any] = Field(default_factory=dict)
    # Where the file came from (None: built-in defaults); not part of the TOML.
    source_path: Path | None = Field(None, exclude=True)
    unknown_keys: tuple[str, ...] = Field((), exclude=True)

    @property
    def config_dir(self) -> Path:
        """The folder of agent.toml (the working directory for built-in defaults)."""
        return self.source_path.parent if self.source_path is not None else Path.cwd()

    def scratch_root_path(self) -> Path:
        """``[container] scratch-root``, absolute; relative paths from agent.toml's folder."""
        root = self.container.scratch_root
        return (root if root.is_absolute() else self.config_dir / root).absolute()

    def mps_dir_path(self) -> Path:
        """``[cuda] mps-dir``, absolute (relative paths from agent.toml's folder); by
        default ``<scratch-root>/.mps``."""
        explicit = self.cuda.mps_dir
        if explicit is None:
            return self.scratch_root_path() / ".mps"
        return (explicit if explicit.is_absolute() else self.config_dir / explicit).absolute()

    def mock_accelerator_path(self) -> Path:
        """The explicit ``mock-accelerator-config`` or ``mock-accelerator.toml`` next to agent.toml."""
        explicit = self.agent.mock_accelerator_config
        if explicit is None:
            return self.config_dir / MOCK_ACCELERATOR_FILENAME
        return explicit if explicit.is_absolute() else self.config_dir / explicit


def agent_config_candidates(
    explicit: Path | str | None = None, *, cwd: Path | None = None, home: Path | None = None
) -> list[Path]:
    """The paths tried, in order (the explicit one alone when given)."""
    if explicit is not None:
        return [Path(explicit)]
    cwd = Path.cwd() if cwd is None else cwd
    home = Path.home() if home is None else home
    return [
        cwd / "agent.toml",
        home / ".config" / "accelshare" / "agent.toml",
        Path("/etc/accelshare/agent.toml"),
    ]


def find_agent_config(
    explicit: Path | str | None = None, *, cwd: Path | None = None, home: Path | None = None
) -> Path | None:
    """The first existing candidate; an explicit path that does not exist is an error."""
    candidates = agent_config_candidates(explicit, cwd=cwd, home=home)
    for path in candidates:
        if path.is_file():
            return path
    if explicit is not None:
        raise AgentConfigError(
            str(explicit), "(file)", "an existing agent.toml file", str(explicit)
        )
    return None


# What each key accepts, in the words of agent.toml (shown whenever pydantic's own
# message would name a Python type, e.g. "a valid tuple").  Checked for completeness by
# tests/unit/config/test_agent_file.py: a new key needs an entry here.
_TRUE_FALSE = "true or false"
EXPECTED: dict[str, str] = {
    "agent": "a table ([agent])",
    "agent.id": 'a non-empty string of at most 64 characters such as "i-node01"',
    "agent.region": 'a non-empty string of at most 64 characters such as "local"',
    "agent.scaling-group": 'a non-empty string of at most 64 characters such as "default"',
    "agent.rpc-listen-addr": '"HOST:PORT" with a port in 1..65535, such as "127.0.0.1:6001"',
    "agent.allowed-compute-plugins": 'a list of plugin names such as ["mock"] or ["cuda"]',
    "agent.allow-compute-plugins": 'a list of plugin names such as ["mock"] or ["cuda"]',
    "agent.blocked-compute-plugins": 'a list of plugin names such as ["cuda"]',
    "agent.allocation-order": 'a list of plugin keys such as ["cuda", "cpu", "mem"]',
    "agent.affinity-policy": '"INTERLEAVED" or "PREFER_SINGLE_NODE" (in any case)',
    "agent.mock-accelerator-config": 'a file path such as "mock-accelerator.toml"',
    "agent.cluster-secret": "a string of at least 16 characters",
    "agent.cluster-secret-file": 'a file path such as "/etc/accelshare/secret"',
    "agent.dev-mode": _TRUE_FALSE,
    "agent.heartbeat-interval-s": "a number of seconds > 0 and <= 3600, such as 3.0",
    "agent.rpc-advertise-url": 'an http(s) URL such as "http://10.0.0.5:6001"',
    "agent.rpc-max-body-bytes": 'a byte size of at least 1024 such as "4m" or 4194304',
    "container": "a table ([container])",
    "container.runtime": '"process" or "docker"',
    "container.scratch-root": 'a folder path such as "./scratch"',
    "container.keep-scratch": _TRUE_FALSE,
    "container.file-upload-max-bytes": 'a byte size of at least 1 such as "1g" or 1073741824',
    "container.stop-grace-s": "a number of seconds >= 0, such as 5.0",
    "container.use-cgroups": _TRUE_FALSE,
    "container.cgroup-parent": 'a cgroup path such as "accelshare" or "/accelshare"',
    "container.sandbox": '"auto", "required" or "off"',
    "container.sandbox-network": '"none" or "outbound"',
    "container.sandbox-ro-paths": 'a list of absolute folder paths such as ["/data/datasets"]',
    "container.sandbox-syscall-filter": _TRUE_FALSE,
    "container.rlimit-memory": '"data" or "as"',
    "container.launcher-fork-server": _TRUE_FALSE,
    "container.prespawn-launchers": "an integer from 0 to 16",
    "container.port-range": "[low, high] with 1024 <= low <= high <= 65535, such as [30000, 31000]",
    "container.start-in-background": _TRUE_FALSE,
    "container.docker-url": 'a Docker engine URL such as "unix:///run/docker.sock"',
    "container.docker-network": (
        '"bridge", "host", "none", "container:NAME" or the name of a Docker network'
    ),
    "container.docker-pull-timeout-s": "a number of seconds from 0 to 3600, such as 20",
    "container.kernel-uid": "a user id from 1 to 2147483647 (not root), such as 1000",
    "container.kernel-gid": "a group id from 1 to 2147483647 (not root), such as 1000",
    "container.environments": "a table of environments ([container.environments.NAME])",
    "resource": "a table ([resource])",
    "resource.reserved-cpu": "an integer >= 0 (cores)",
    "resource.reserved-mem": 'a byte size such as "1g" or 1073741824',
    "resource.cpu-count": "an integer >= 1 (cores)",
    "resource.memory-size": 'a byte size > 0 such as "32g"',
    "cuda": "a table ([cuda])",
    "cuda.enforce": '"mps" or "none"',
    "cuda.mps-missing": '"warn" or "refuse"',
    "cuda.mps-control": 'a program path or name such as "nvidia-cuda-mps-control"',
    "cuda.mps-dir": 'a folder path such as "/run/accelshare-mps"',
    "cuda.mps-check-interval-s": "a number of seconds > 0 and <= 3600, such as 2.0",
    "manager": "a table ([manager])",
    "manager.endpoint": 'an http(s) URL such as "http://127.0.0.1:8081", or a list of them',
    "etcd": "a table ([etcd])",
    "redis": "a table ([redis]; see docs/operations.md)",
    "etcd.addr": '"HOST:PORT" with a port in 1..65535, such as "127.0.0.1:2379"',
    "etcd.namespace": 'a non-empty string such as "local"',
    "config-store": "a table ([config-store])",
}
# One item of a list key (``agent.allocation-order[1]``).
EXPECTED_ITEM: dict[str, str] = {
    "agent.allowed-compute-plugins": 'a plugin name (a string) such as "mock"',
    "agent.allow-compute-plugins": 'a plugin name (a string) such as "mock"',
    "agent.blocked-compute-plugins": 'a plugin name (a string) such as "cuda"',
    "agent.allocation-order": 'a plugin key (a string) such as "cuda"',
}
_ENVIRONMENT = 'a table such as { command-prefix = ["/opt/venvs/torch/bin/python"] }'
_HIDDEN_KEYS = frozenset({"agent.cluster-secret"})


def _describe_expected(err: Mapping[str, Any]) -> str:
    """What the key accepts, from :data:`EXPECTED` (pydantic's own messages name Python
    types); a section-level check (``value_error`` on a table) has its own message."""
    loc: Sequence[int | str] = err["loc"]
    key = _key_of(loc)
    if err["type"] == "value_error" and ("." not in key or key not in EXPECTED):
        return str(err["msg"]).removeprefix("Value error, ")
    if loc and isinstance(loc[-1], int):
        item = EXPECTED_ITEM.get(_key_of(loc[:-1]))
        if item is not None:
            return item
    if key in EXPECTED:
        return EXPECTED[key]
    if key.startswith("container.environments."):
        return _ENVIRONMENT
    if err["type"] == "missing":
        return "a value (the key is required)"
    return str(err["msg"]).removeprefix("Input should be ")


def _received(data: Mapping[str, Any], err: Mapping[str, Any]) -> Any:
    """The value as written in the file (pydantic's ``input`` may be a transformed one,
    e.g. upper-cased by a validator); hidden for secrets."""
    if err["type"] == "missing":
        return _MISSING
    loc: Sequence[int | str] = err["loc"]
    if _key_of(loc) in _HIDDEN_KEYS:
        return "(hidden)"
    value: Any = data
    for part in loc:
        in_table = isinstance(value, Mapping) and part in value
        in_list = isinstance(value, list | tuple) and isinstance(part, int) and part < len(value)
        if not (in_table or in_list):
            return err.get("input", _MISSING)
        value = value[part]
    return value


def _key_of(loc: Sequence[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(item)
    return ".".join(parts) or "(file)"


def _unknown_keys(model: type[BaseModel], data: Mapping[str, Any], prefix: str = "") -> list[str]:
    known: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.exclude:
            continue
        names = {name, info.alias or name}
        if isinstance(info.validation_alias, AliasChoices):
            names.update(str(c) for c in info.validation_alias.choices)
        for spelled in names:
            known[spelled] = info.annotation
    unknown: list[str] = []
    for key, value in data.items():
        if key not in known:
            unknown.append(f"{prefix}{key}")
            continue
        annotation = known[key]
        sub = next(
            (
                t
                for t in (annotation, *getattr(annotation, "__args__", ()))
                if isinstance(t, type) and issubclass(t, BaseModel)
            ),
            None,
        )
        if (
            sub is not None
            and isinstance(value, Mapping)
            and sub.model_config.get("extra") != "allow"
        ):
            unknown.extend(_unknown_keys(sub, value, f"{prefix}{key}."))
    return unknown


def parse_agent_config(
    data: Mapping[str, Any], *, source: str = "agent.toml", source_path: Path | None = None
) -> AgentConfig:
    """Validate parsed TOML data (pure); errors name ``source``, key, expected, received."""
    try:
        config = AgentConfig.model_validate(dict(data))
    except ValidationError as e:
        err = e.errors()[0]
        raise AgentConfigError(
            source, _key_of(err["loc"]), _describe_expected(err), _received(data, err)
        ) from None
    return config.model_copy(
        update={
            "source_path": source_path,
            "unknown_keys": tuple(_unknown_keys(AgentConfig, data)),
        }
    )


def load_agent_config(
    explicit: Path | str | None = None, *, cwd: Path | None = None, home: Path | None = None
) -> AgentConfig:
    """Find and load agent.toml (see the module docstring for the order).

    When no file exists anywhere (and none was given) the built-in defaults are used and
    ``source_path`` is None.
    """
    path = find_agent_config(explicit, cwd=cwd, home=home)
    if path is None:
        return AgentConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise AgentConfigError(str(path), "(file)", "valid TOML", str(e)) from None
    except OSError as e:
        raise AgentConfigError(str(path), "(file)", "a readable file", str(e)) from None
    return parse_agent_config(data, source=str(path), source_path=path.resolve())
