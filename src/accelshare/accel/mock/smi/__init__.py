"""The ``nvidia-smi`` of sessions that hold mock CUDA devices or shares of a real GPU.

The agent gives such a kernel three files in its config dir (next to ``resource.txt``)::

    config/bin/nvidia-smi        exec <agent's python> -I -m accelshare.accel.mock.smi "$@"
                                 (or, where that interpreter is missing, as in a docker
                                 container: python3 bin/mock_smi.py "$@")
    config/bin/mock_smi.py       this module as a stand-alone script (standard library only)
    config/mock-cuda-smi.json    the devices as the session sees them (written once)

and the process runtime puts ``config/bin`` first on the kernel's ``PATH``.  The tool
shows the devices of the allocation, as the agent wrote them in ``mock-cuda-smi.json``
(in that order: GPU 0, 1, ...), never what the environment says: a process of the
session that rewrites its own ``$BACKENDAI_MOCK_CUDA_DEVICES`` or
``$CUDA_VISIBLE_DEVICES`` still sees only its devices.  The stand-alone copy finds the
config dir from where it lies (``config/bin/mock_smi.py``); run otherwise (``python -m``)
it reads ``$ACCELSHARE_RESOURCE_TXT``.  It takes utilisation, memory use, power and
temperature from the node statistics file the mock plugin rewrites on every collection
tick (``<scratch-root>/.mock-cuda-stats.json``).

What a session sees, per device (the spec's inverse of the share formula)::

    whole device / MIG slice:   memory.total = the device's memory_size
    s fractional shares:        memory.total = unit_mem × s   (spec 03, CUDA_MEMORY_LIMITS)
                                utilization  = device util × p
    memory.used                 = memory.total × the device's sampled memory fraction

where ``p``, the session's part of the device's load, is ``min(1, s / device shares)``
(1 for a whole device or MIG slice).  Mock devices also say which fraction of them is
allocated (``allocated`` in the stats file): their load follows the allocations, so
there ``p = min(1, (s / device shares) / allocated)``, the session's part of what is
allocated, and ``memory.used = min(memory.total, device memory used × p)``.

e.g. ``two-fgpu.toml`` (2 GiB GPUs, default unit_mem 2 GiB) at 0.5 shares: ``1024MiB``.
Without statistics (no stats tick yet, the last one over :data:`STALE_AFTER_S` old, or
a runtime that cannot see the agent's scratch root) the readings are 0 and
power/temperature show ``N/A``; the memory total is exact.

Supported: the default table, ``-L`` / ``--list-gpus``, ``--query-gpu=F1,F2,...
--format=csv[,noheader][,nounits]`` (fields in :data:`QUERY_FIELDS`), ``-h``.  An unknown
option or field exits 2 with the real tool's message, except where the devices file says
``fallback`` (shares of a real GPU): the real ``nvidia-smi`` then runs with the same
arguments (:func:`real_tool`) and shows the whole device.  Arithmetic is exact (``Decimal``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICES_FILE",
    "QUERY_FIELDS",
    "SmiDevice",
    "SmiError",
    "SmiReading",
    "SmiView",
    "list_gpus",
    "main",
    "own_config_dir",
    "query_gpu",
    "read_view",
    "real_tool",
    "render_table",
    "script_source",
    "stats_json",
]

DEVICES_FILE = "mock-cuda-smi.json"
SCRIPT_FILE = "mock_smi.py"  # the stand-alone copy of this module, next to the wrapper
STATS_FILE = ".mock-cuda-stats.json"
RESOURCE_TXT_ENV = "ACCELSHARE_RESOURCE_TXT"  # accelshare.agent.runtime.base (not imported:
# the tool must start fast and the accel package must not depend on the agent)
MIB = 1 << 20
STALE_AFTER_S = 60.0  # stats older than this are not shown (no collector is running)
# nvidia-smi's exit codes: 2 invalid argument, 6 no devices, 9 cannot talk to the driver.
EXIT_INVALID_ARGUMENT = 2
EXIT_NO_DEVICES = 6
EXIT_NO_DRIVER = 9


class SmiError(Exception):
    """A message for stderr and the exit code the real tool would use."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _decimal(value: Any, field: str, source: str) -> Decimal:
    try:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidOperation
        result = Decimal(value)
        if not result.is_finite() or result < 0:
            raise InvalidOperation
    except InvalidOperation:
        raise SmiError(
            f"{source}: field {field!r}: expected a decimal string >= 0, received {value!r}",
            EXIT_NO_DRIVER,
        ) from None
    return result


def _int(value: Any, field: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SmiError(
            f"{source}: field {field!r}: expected an integer >= 0, received {value!r}",
            EXIT_NO_DRIVER,
        )
    return value


@dataclass(frozen=True, slots=True)
class SmiDevice:
    """One device as the session sees it.

    ``shares`` is the fractional amount held (None: a whole device or a MIG slice);
    ``device_shares`` the device's capacity in shares (None in discrete mode).
    ``memory_bytes`` is what the session may use: ``unit_mem × shares`` or the device's
    whole memory.
    """

    device_id: str
    name: str
    bus_id: str
    memory_bytes: int
    device_memory_bytes: int
    processors: int
    shares: Decimal | None = None
    device_shares: Decimal | None = None
    is_mig: bool = False

    @property
    def uuid(self) -> str:
        """``GPU-<id>`` as nvidia-smi prints it (MIG ids already start with ``MIG-``)."""
        if self.device_id.startswith(("GPU-", "MIG-")):
            return self.device_id
        return f"GPU-{self.device_id}"

    @property
    def util_scale(self) -> Decimal:
        """The part of the device's utilisation this session accounts for."""
        if self.shares is None or not self.device_shares:
            return Decimal(1)
        return min(Decimal(1), self.shares / self.device_shares)

    def to_json(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "name": self.name,
            "bus_id": self.bus_id,
            "memory_bytes": self.memory_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "processors": self.processors,
            "shares": None if self.shares is None else str(self.shares),
            "device_shares": None if self.device_shares is None else str(self.device_shares),
            "is_mig": self.is_mig,
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> SmiDevice:
        if not isinstance(data, dict):
            raise SmiError(f"{source}: expected a device object, received {data!r}", EXIT_NO_DRIVER)
        texts = {}
        for key in ("device_id", "name", "bus_id"):
            value = data.get(key)
            if not isinstance(value, str) or not value:
                raise SmiError(
                    f"{source}: field {key!r}: expected a non-empty string, received {value!r}",
                    EXIT_NO_DRIVER,
                )
            texts[key] = value
        shares, device_shares = data.get("shares"), data.get("device_shares")
        return cls(
            **texts,
            memory_bytes=_int(data.get("memory_bytes"), "memory_bytes", source),
            device_memory_bytes=_int(
                data.get("device_memory_bytes"), "device_memory_bytes", source
            ),
            processors=_int(data.get("processors"), "processors", source),
            shares=None if shares is None else _decimal(shares, "shares", source),
            device_shares=(
                None if device_shares is None else _decimal(device_shares, "device_shares", source)
            ),
            is_mig=data.get("is_mig") is True,
        )


@dataclass(frozen=True, slots=True)
class SmiReading:
    """One device's node-wide sample (from the mock plugin's statistics)."""

    util: Decimal  # percent of the whole device
    mem_fraction: Decimal  # 0..1 of the device's memory in use
    power: Decimal | None = None
    power_max: Decimal | None = None
    temperature: Decimal | None = None
    allocated: Decimal | None = None  # 0..1 of the device held (mock devices), else None


@dataclass(frozen=True, slots=True)
class SmiView:
    """Everything the tool prints: versions, the session's devices, their readings."""

    driver_version: str
    cuda_version: str
    devices: tuple[SmiDevice, ...]
    readings: Mapping[str, SmiReading]

    def reading(self, device: SmiDevice) -> SmiReading | None:
        return self.readings.get(device.device_id)

    @staticmethod
    def part(device: SmiDevice, reading: SmiReading) -> Decimal:
        """The session's part of the device's load (see the module docstring)."""
        share = device.util_scale
        if reading.allocated is None or reading.allocated <= 0:
            return share
        return min(Decimal(1), share / reading.allocated)

    def util_percent(self, device: SmiDevice) -> int:
        """The session's utilisation of ``device``, whole percent (rounded down)."""
        reading = self.reading(device)
        if reading is None:
            return 0
        return int((reading.util * self.part(device, reading)).to_integral_value(ROUND_FLOOR))

    def memory_used_mib(self, device: SmiDevice) -> int:
        reading = self.reading(device)
        if reading is None:
            return 0
        fraction = min(Decimal(1), reading.mem_fraction)
        if reading.allocated is None:
            used = Decimal(device.memory_bytes) * fraction
        else:
            device_used = Decimal(device.device_memory_bytes) * fraction
            used = min(Decimal(device.memory_bytes), device_used * self.part(device, reading))
        return int(used.to_integral_value(ROUND_FLOOR)) // MIB


def memory_mib(num_bytes: int) -> int:
    """nvidia-smi prints whole MiB (rounded down): 1073741824 -> 1024."""
    return num_bytes // MIB


# -- files -----------------------------------------------------------------------------------


def devices_json(
    devices: Sequence[SmiDevice],
    *,
    driver_version: str,
    cuda_version: str,
    stats_file: str | None,
    fallback: bool = False,
) -> str:
    """The content of ``config/mock-cuda-smi.json`` (written by the agent's plugin).
    ``fallback``: real GPUs, whose real ``nvidia-smi`` runs for what this tool does not
    render (:func:`real_tool`)."""
    doc = {
        "format": 1,
        "driver_version": driver_version,
        "cuda_version": cuda_version,
        "stats_file": stats_file,
        "devices": [d.to_json() for d in devices],
    }
    if fallback:
        doc["fallback"] = True
    return json.dumps(doc, indent=1) + "\n"


def stats_json(readings: Mapping[str, SmiReading], *, at: float) -> str:
    """The node statistics file the mock plugin rewrites each tick (decimal strings)."""

    def text(value: Decimal | None) -> str | None:
        return None if value is None else str(value)

    return json.dumps(
        {
            "updated_at": at,
            "devices": {
                device_id: {
                    "util": str(r.util),
                    "mem_fraction": str(r.mem_fraction),
                    "power": text(r.power),
                    "power_max": text(r.power_max),
                    "temperature": text(r.temperature),
                    **({} if r.allocated is None else {"allocated": str(r.allocated)}),
                }
                for device_id, r in readings.items()
            },
        }
    )


def _read_readings(path: Path, now: float) -> dict[str, SmiReading]:
    """Readings from the stats file; {} when it is missing, unreadable (no tick yet) or
    older than :data:`STALE_AFTER_S` (nobody collects stats now: old numbers would lie)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not now - float(data["updated_at"]) <= STALE_AFTER_S:
            return {}
        devices = data["devices"]
        readings = {}
        for device_id, raw in devices.items():

            def opt(key: str, raw: Mapping[str, Any] = raw) -> Decimal | None:
                value = raw.get(key)
                return None if value is None else Decimal(str(value))

            readings[str(device_id)] = SmiReading(
                util=Decimal(str(raw["util"])),
                mem_fraction=Decimal(str(raw["mem_fraction"])),
                power=opt("power"),
                power_max=opt("power_max"),
                temperature=opt("temperature"),
                allocated=opt("allocated"),
            )
        return readings
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InvalidOperation):
        return {}


def own_config_dir(script: str = __file__) -> Path | None:
    """The kernel's config dir when ``script`` is the stand-alone copy the agent wrote
    there (``<config>/bin/mock_smi.py`` next to ``<config>/mock-cuda-smi.json``)."""
    here = Path(script).parent
    if here.name == "bin" and (here.parent / DEVICES_FILE).is_file():
        return here.parent
    return None


def read_view(
    environ: Mapping[str, str], *, now: float | None = None, config_dir: Path | None = None
) -> SmiView:
    """The session's view from its config dir (see the module docstring): ``config_dir``,
    else the one ``$ACCELSHARE_RESOURCE_TXT`` lies in.  The devices are those of the
    allocation file, whatever the environment says."""
    if config_dir is None:
        resource_txt = environ.get(RESOURCE_TXT_ENV)
        if not resource_txt:
            raise SmiError(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA"
                f" driver.\n(accelshare mock: ${RESOURCE_TXT_ENV} is not set; run this"
                " inside a session)",
                EXIT_NO_DRIVER,
            )
        config_dir = Path(resource_txt).parent
    source = config_dir / DEVICES_FILE
    try:
        doc = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SmiError(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
            f"(accelshare mock: cannot read {source}: {e})",
            EXIT_NO_DRIVER,
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise SmiError(
            f"{source}: field 'devices': expected a list, received {doc!r:.80}", EXIT_NO_DRIVER
        )
    devices = tuple(SmiDevice.from_json(x, str(source)) for x in doc["devices"])
    stats_file = doc.get("stats_file")
    readings = (
        _read_readings(Path(stats_file), time.time() if now is None else now)
        if isinstance(stats_file, str)
        else {}
    )
    return SmiView(
        driver_version=str(doc.get("driver_version") or "N/A"),
        cuda_version=str(doc.get("cuda_version") or "N/A"),
        devices=devices,
        readings=readings,
    )


# -- output ----------------------------------------------------------------------------------


def list_gpus(view: SmiView) -> str:
    """``nvidia-smi -L``: ``GPU 0: CUDA GPU (UUID: GPU-c59395cd-...)``."""
    return "".join(
        f"GPU {index}: {d.name} (UUID: {d.uuid})\n" for index, d in enumerate(view.devices)
    )


_RULE = "+" + "-" * 41 + "+" + "-" * 22 + "+" + "-" * 22 + "+"
_DOUBLE = "|" + "=" * 41 + "+" + "=" * 22 + "+" + "=" * 22 + "|"
_WIDTH = len(_RULE) - 2  # inside the outer bars


def _boxed(text: str) -> str:
    return f"| {text:<{_WIDTH - 1}}|"


def _fixed(value: Decimal | None, unit: str) -> str:
    return "N/A" if value is None else f"{int(value.to_integral_value(ROUND_FLOOR))}{unit}"


def render_table(view: SmiView, *, now: float | None = None) -> str:
    """The default output: the familiar box with one three-line row per device."""
    stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now))
    lines = [
        stamp,
        "+" + "-" * _WIDTH + "+",
        _boxed(
            f"NVIDIA-SMI {view.driver_version:<21} Driver Version: {view.driver_version:<13}"
            f" CUDA Version: {view.cuda_version}"
        ),
        "|" + _RULE[1:],
        "| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                      |               MIG M. |",
        _DOUBLE,
    ]
    for index, d in enumerate(view.devices):
        reading = view.reading(d)
        power = (
            f"{_fixed(reading.power if reading else None, 'W')} / "
            f"{_fixed(reading.power_max if reading else None, 'W')}"
        )
        temp = _fixed(reading.temperature if reading else None, "C")
        memory = f"{view.memory_used_mib(d)}MiB / {memory_mib(d.memory_bytes)}MiB"
        util = f"{view.util_percent(d)}%"
        name = d.name if len(d.name) <= 28 else d.name[:25] + "..."
        lines += [
            f"| {index:>3}  {name:<28} {'On':>4}  | {d.bus_id:<16} {'Off':>3} | {'0':>20} |",
            f"| {'N/A':>3}  {temp:>4}   {'P0':<2}  {power:>23} | {memory:>20} |"
            f" {util:>8}  {'Default':>10} |",
            f"|{'':41}|{'':22}| {'Enabled' if d.is_mig else 'Disabled':>20} |",
            _RULE,
        ]
    if not view.devices:
        lines[-1:] = ["+" + "-" * _WIDTH + "+"]
    lines += [
        " " * (_WIDTH + 2),
        "+" + "-" * _WIDTH + "+",
        _boxed("Processes:"),
        _boxed(
            " GPU   GI   CI        PID   Type   Process name                            GPU Memory"
        ),
        _boxed("       ID   ID                                                             Usage"),
        "|" + "=" * _WIDTH + "|",
        _boxed(" No running processes found"),
        "+" + "-" * _WIDTH + "+",
    ]
    shared = [
        f"GPU {index}: {d.shares:.2f} of {d.device_shares or 0:.2f} shares = "
        f"{memory_mib(d.memory_bytes)}MiB of {memory_mib(d.device_memory_bytes)}MiB"
        for index, d in enumerate(view.devices)
        if d.shares is not None
    ]
    if shared:
        lines.append(
            "accelshare fractional GPU, memory shown is the session's share: " + "; ".join(shared)
        )
    return "\n".join(lines) + "\n"


def _query_fields() -> dict[str, tuple[str, Callable[[SmiView, int, SmiDevice], str], str]]:
    """field -> (unit for the header, value, unit for the value)."""

    def reading_value(
        attr: str, step: Decimal = Decimal("0.01")
    ) -> Callable[[SmiView, int, SmiDevice], str]:
        def get(view: SmiView, index: int, d: SmiDevice) -> str:
            reading = view.reading(d)
            value = getattr(reading, attr) if reading is not None else None
            return "[N/A]" if value is None else str(value.quantize(step, ROUND_FLOOR))

        return get

    return {
        "index": ("", lambda v, i, d: str(i), ""),
        "count": ("", lambda v, i, d: str(len(v.devices)), ""),
        "name": ("", lambda v, i, d: d.name, ""),
        "gpu_name": ("", lambda v, i, d: d.name, ""),
        "uuid": ("", lambda v, i, d: d.uuid, ""),
        "gpu_uuid": ("", lambda v, i, d: d.uuid, ""),
        "pci.bus_id": ("", lambda v, i, d: d.bus_id, ""),
        "gpu_bus_id": ("", lambda v, i, d: d.bus_id, ""),
        "driver_version": ("", lambda v, i, d: v.driver_version, ""),
        "memory.total": ("MiB", lambda v, i, d: str(memory_mib(d.memory_bytes)), "MiB"),
        "memory.used": ("MiB", lambda v, i, d: str(v.memory_used_mib(d)), "MiB"),
        "memory.free": (
            "MiB",
            lambda v, i, d: str(memory_mib(d.memory_bytes) - v.memory_used_mib(d)),
            "MiB",
        ),
        "utilization.gpu": ("%", lambda v, i, d: str(v.util_percent(d)), "%"),
        "temperature.gpu": ("", reading_value("temperature", Decimal(1)), ""),
        "power.draw": ("W", reading_value("power"), "W"),
        "power.limit": ("W", reading_value("power_max"), "W"),
        "mig.mode.current": ("", lambda v, i, d: "Enabled" if d.is_mig else "Disabled", ""),
    }


QUERY_FIELDS = tuple(_query_fields())


def _csv_options(format_spec: str) -> list[str]:
    options = [o.strip() for o in format_spec.split(",") if o.strip()]
    if "csv" not in options or any(o not in ("csv", "noheader", "nounits") for o in options):
        raise SmiError(
            f'"{format_spec}" is not a valid format: expected csv, optionally with '
            "noheader and/or nounits (e.g. --format=csv,noheader,nounits)",
            EXIT_INVALID_ARGUMENT,
        )
    return options


def query_gpu(view: SmiView, fields: Sequence[str], format_spec: str) -> str:
    """``--query-gpu=...  --format=csv[,noheader][,nounits]``.

    >>> query_gpu(view, ["index", "memory.total"], "csv,noheader,nounits")
    '0, 1024\\n'
    """
    table = _query_fields()
    options = _csv_options(format_spec)
    for name in fields:
        if name not in table:
            raise SmiError(
                f'Field "{name}" is not a valid field to query.\n\n'
                "See 'nvidia-smi --help-query-gpu' for more information.\n"
                f"(accelshare mock supports: {', '.join(QUERY_FIELDS)})",
                EXIT_INVALID_ARGUMENT,
            )
    units = "nounits" not in options
    out = []
    if "noheader" not in options:
        out.append(", ".join(f"{n} [{table[n][0]}]" if table[n][0] else n for n in fields))
    for index, device in enumerate(view.devices):
        values = []
        for name in fields:
            _, get, unit = table[name]
            value = get(view, index, device)
            values.append(f"{value} {unit}" if units and unit and value != "[N/A]" else value)
        out.append(", ".join(values))
    return "".join(line + "\n" for line in out)


# -- command line ----------------------------------------------------------------------------

_USAGE = """\
NVIDIA System Management Interface -- accelshare mock (sessions holding mock CUDA devices)

    nvidia-smi                                 the device table
    nvidia-smi -L | --list-gpus                one line per GPU with its UUID
    nvidia-smi --query-gpu=F1,F2 --format=csv[,noheader][,nounits]

Fields: {fields}
Memory is the session's share (unit_mem x shares) on fractional devices.
"""


def _value(args: list[str], index: int, option: str) -> tuple[str, int]:
    arg = args[index]
    if "=" in arg:
        return arg.split("=", 1)[1], index + 1
    if index + 1 >= len(args):
        raise SmiError(f"Option {option} requires a value.", EXIT_INVALID_ARGUMENT)
    return args[index + 1], index + 2


def run(args: Sequence[str], environ: Mapping[str, str], config_dir: Path | None = None) -> str:
    """The tool's output for ``args``; raises :class:`SmiError` on failure."""
    rest = list(args)
    list_mode = False
    query: str | None = None
    format_spec: str | None = None
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("-h", "--help"):
            return _USAGE.format(fields=", ".join(QUERY_FIELDS))
        if arg in ("-L", "--list-gpus"):
            list_mode, i = True, i + 1
        elif arg.split("=", 1)[0] == "--query-gpu":
            query, i = _value(rest, i, "--query-gpu")
        elif arg.split("=", 1)[0] == "--format":
            format_spec, i = _value(rest, i, "--format")
        else:
            raise SmiError(
                f'Invalid combination of input arguments ("{arg}"). '
                "Please run 'nvidia-smi -h' for help.",
                EXIT_INVALID_ARGUMENT,
            )
    if format_spec is not None and query is None:
        raise SmiError("--format needs --query-gpu=...", EXIT_INVALID_ARGUMENT)
    if query is not None and format_spec is None:
        raise SmiError(
            "Option --format is required with --query-gpu (e.g. --format=csv).",
            EXIT_INVALID_ARGUMENT,
        )
    if format_spec is not None:
        _csv_options(format_spec)  # a bad format is an argument error, before any device
    view = read_view(environ, config_dir=config_dir)
    if not view.devices:
        raise SmiError("No devices were found", EXIT_NO_DEVICES)
    if list_mode:
        return list_gpus(view)
    if query is not None and format_spec is not None:
        fields = [f.strip() for f in query.split(",") if f.strip()]
        return query_gpu(view, fields, format_spec)
    return render_table(view)


@functools.cache
def script_source() -> str:
    """This module as a stand-alone script (it imports only the standard library), for
    containers that have a ``python3`` but not the agent's interpreter."""
    source = Path(__file__).read_text(encoding="utf-8")
    return f'{source}\n\nif __name__ == "__main__":\n    sys.exit(main())\n'


def real_tool(config_dir: Path | None, search_path: str) -> str | None:
    """The real ``nvidia-smi`` for a session whose devices file allows it (real GPUs):
    the first on ``search_path`` that is not this tool's own wrapper; None otherwise."""
    if config_dir is None:
        return None
    try:
        doc = json.loads((config_dir / DEVICES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("fallback") is not True:
        return None
    own = (config_dir / "bin").resolve()
    for folder in search_path.split(os.pathsep):
        if not folder or Path(folder).resolve() == own:
            continue
        candidate = Path(folder) / "nvidia-smi"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        sys.stdout.write(run(args, os.environ, own_config_dir()))
    except SmiError as e:
        if e.exit_code == EXIT_INVALID_ARGUMENT:
            # What this tool does not render, the real one shows (whole devices).
            real = real_tool(own_config_dir(), os.environ.get("PATH", ""))
            if real is not None:
                sys.stdout.flush()
                os.execv(real, [real, *args])
        sys.stderr.write(f"{e}\n")
        return e.exit_code
    return 0
