"""The process runtime's sandbox: each kernel in its own bubblewrap (``bwrap``) sandbox.

What a sandboxed kernel gets (``[container] sandbox``, docs/agent-runtimes.md)::

    user        an unprivileged uid/gid ([container] kernel-uid / kernel-gid) with no
                capabilities and no way to gain any (no-new-privileges); an agent that
                is not root cannot change user: its kernels then run as its own uid, in
                a user namespace that maps only that uid and allows no further ones
    namespaces  its own mount, PID, network, IPC, UTS and cgroup namespaces
    files       the host's system folders read-only (/usr, /etc, /sys; /bin, /lib ... as
                the host has them), its environment's interpreter read-only, its own
                work/ folder writable (HOME), its config/ folder (resource.txt, the
                plugins' tools) read-only, the session's storage folders (read-write or
                read-only, :mod:`.folder_mounts`), a private /tmp, /dev and /proc; nothing else
                of the host: not the agent's or manager's data, configuration or secrets,
                not the other kernels' folders.  ``/etc/accelshare`` and the agent's own
                configuration files are hidden even though /etc is visible.
    network     a private loopback only (``sandbox-network = "none"``), or with
                ``"outbound"`` a user-mode network (slirp4netns) to other hosts and the
                internet, never to the host's loopback
    signals     the kernel sees only its own processes; it cannot signal others

The agent reaches a kernel's app ports through :mod:`.netns_forward` (the host port is
bridged into the kernel's network namespace) and starts web terminals inside the same
namespaces as the same user (``nsenter``, see ``_terminal_exec.py``).

This module decides *what* the sandbox holds (:func:`sandbox_record`, stored in the
kernel's ``launch.json``); the launcher (``_launcher.py``, standard library only) runs
bwrap with it.  As root, bwrap sets the sandbox up with the agent's rights, so a source
under a folder the kernel's user cannot enter (a Python under ``/root/.pyenv``) is still
bound; the folders above each bound path are created inside with mode 0755, and nothing
but what is listed becomes visible.

:func:`probe` tells whether this host can sandbox at all (bwrap present, user and
network namespaces allowed); the agent says so at start and, where it cannot, runs its
sessions unsandboxed for a single user only (``[container] sandbox``).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ._launcher import ENV_APPLIER, ENV_FD_ARG, env_file, fill_env_fd
from .folder_mounts import FolderMount, MountRefused, check_target

__all__ = [
    "DEFAULT_HIDDEN",
    "SandboxConfig",
    "folder_target",
    "interpreter_paths",
    "probe",
    "sandbox_record",
]

#: Hidden inside the sandbox even though /etc is visible (the product's own settings).
DEFAULT_HIDDEN = ("/etc/accelshare",)
#: System folders bound read-only (a symlink such as Debian's /bin -> usr/bin is
#: recreated as the same symlink).
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The device nodes of NVIDIA GPUs, bound when a kernel holds CUDA devices.
_NVIDIA_GLOBS = ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
#: bwrap's own option for the command's process group: the sandbox's init (and so the
#: command, its child) ``setsid()``s, so the command's process group is the init's pid
#: (``proc.json``'s ``sandbox_pid``): a destroy's SIGTERM goes to that group and reaches
#: the command and its children, never bwrap outside (which keeps the default
#: dispositions, as the command does: nothing is ignored, nothing to give back).
SESSION_ARGS = ("--new-session",)


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How kernels are sandboxed.

    * ``uid`` / ``gid``: the kernels' user (never 0).  An agent that is not root cannot
      change user: its kernels run as the agent's own uid (:func:`probe` says so).
    * ``network``: ``"none"`` (a private loopback) or ``"outbound"`` (slirp4netns).
    * ``ro_paths``: more host folders every kernel sees read-only (datasets, shared
      virtualenvs), at the same path.
    * ``hidden``: paths made empty inside the sandbox (``/etc/accelshare``, the agent's
      configuration and secret files).
    * ``syscall_filter``: the compiled seccomp filter (:func:`write_syscall_filter`) every
      process of the sandbox, and its terminals, runs under.
    * ``exec_helper``: the agent's exec helper (:mod:`.exec_helper`), bound read-only at
      its own path: a root agent's kernels change user with its ``drop`` mode instead of
      ``setpriv``, and it applies the kernel's environment after the change of user (its
      ``env`` mode for an agent that is not root).  None: ``setpriv`` and the agent's
      interpreter (``_launcher.ENV_APPLIER``).
    """

    uid: int = 1000
    gid: int = 1000
    network: Literal["none", "outbound"] = "none"
    ro_paths: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = tuple(Path(p) for p in DEFAULT_HIDDEN)
    bwrap: str = "bwrap"
    slirp4netns: str = "slirp4netns"
    setpriv: str = "/usr/bin/setpriv"
    extra_args: tuple[str, ...] = field(default=())
    # A seccomp filter (SYSCALL_FILTER) on every process of the sandbox: a file the agent
    # writes once (write_syscall_filter); None: no filter.
    syscall_filter: Path | None = None
    exec_helper: Path | None = None

    def effective_ids(self) -> tuple[int, int]:
        """The uid/gid kernels really run as: the configured ones when the agent is root,
        else the agent's own."""
        if os.geteuid() == 0:
            return self.uid, self.gid
        return os.geteuid(), os.getegid()


def probe(config: SandboxConfig, *, timeout_s: float = 10.0) -> str | None:
    """Why this host cannot sandbox kernels (``None``: it can).

    Runs a real sandbox once, as the kernels' user, with every namespace a kernel gets
    (so a host that forbids unprivileged user namespaces, or a container without them,
    is found here rather than at the first create)."""
    bwrap = shutil.which(config.bwrap)
    if bwrap is None:
        return (
            f"bubblewrap ({config.bwrap!r}) is not installed (Debian/Ubuntu: apt-get install"
            " bubblewrap)"
        )
    helper = _sandbox_helper(config)
    if os.geteuid() == 0 and helper is None and not os.access(config.setpriv, os.X_OK):
        return f"{config.setpriv} (util-linux) is not there"
    if config.network == "outbound" and shutil.which(config.slirp4netns) is None:
        return (
            f"sandbox-network = 'outbound' needs slirp4netns ({config.slirp4netns!r}), not"
            " installed (apt-get install slirp4netns)"
        )
    argv = [
        bwrap,
        *_identity_args(),
        *_NAMESPACE_ARGS,
        *SESSION_ARGS,
        *_system_args(),
        *_probe_binds(helper),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        *_command_prefix(config),
        "true",
    ]
    filter_fd = None
    if config.syscall_filter is not None:
        try:
            filter_fd = os.open(config.syscall_filter, os.O_RDONLY)
        except OSError as e:
            return f"the syscall filter {config.syscall_filter} cannot be read: {e}"
        argv[1:1] = ["--seccomp", str(filter_fd)]
    env_fd = env_file({"PATH": "/usr/bin:/bin"})  # (the command prefix applies it)
    try:
        done = subprocess.run(
            fill_env_fd(argv, env_fd),
            capture_output=True,
            timeout=timeout_s,
            check=False,
            pass_fds=(env_fd,) if filter_fd is None else (env_fd, filter_fd),
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap could not run: {e}"
    finally:
        os.close(env_fd)
        if filter_fd is not None:
            os.close(filter_fd)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        detail = why[-1] if why else f"exit code {done.returncode}"
        if os.geteuid() == 0:
            return f"bubblewrap cannot create the sandbox ({detail})"
        return (
            f"bubblewrap cannot create the sandbox as uid {os.geteuid()} ({detail});"
            " unprivileged user namespaces may be disabled (sysctl"
            " kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)"
        )
    return None


def _probe_binds(helper: str | None) -> list[str]:
    """What the probe's command prefix needs bound: the exec helper, else the agent's
    interpreter (:data:`ENV_APPLIER`), each under folders made 0755 as in
    :func:`sandbox_record`."""
    paths = [helper] if helper is not None else [str(p) for p in interpreter_paths(sys.executable)]
    args: list[str] = []
    made: set[str] = set()
    for path in paths:
        for parent in _parents(path):
            if parent not in made and not _under_system(parent):
                made.add(parent)
                args += ["--dir", parent]
        args += ["--ro-bind", path, path]
        made.add(path)
    return args


#: What the sandbox's syscall filter refuses, and with which error (everything else is
#: allowed).  New user namespaces (``unshare``/``clone`` with ``CLONE_NEWUSER``: the
#: kernel's largest attack surface reachable without privileges; under a root agent the
#: sandbox has no user namespace of its own to forbid them in); ``clone3``, whose flags a
#: filter cannot read, answers ENOSYS so that the C library falls back to ``clone`` (as
#: Docker's default profile does); the kernel keyrings (every kernel runs as the same uid:
#: its user keyring would be shared); ``bpf`` and ``userfaultfd``.
SYSCALL_FILTER_DENIED = ("keyctl", "add_key", "request_key", "bpf", "userfaultfd")
_CLONE_NEWUSER = 0x10000000


def write_syscall_filter(path: Path) -> None:
    """Compile the sandbox's seccomp filter (libseccomp, through pyseccomp) for this
    host's architecture into ``path`` (bwrap's ``--seccomp`` format: raw BPF).  Raises
    ``OSError`` when libseccomp is not there."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as e:  # the module loads libseccomp.so.2 on import
        raise OSError(
            f"the syscall filter needs libseccomp (apt-get install libseccomp2): {e}"
        ) from e
    denied = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    newuser = seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER)
    rules.add_rule(denied, "unshare", newuser)
    rules.add_rule(denied, "clone", newuser)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for name in SYSCALL_FILTER_DENIED:
        rules.add_rule(denied, name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        rules.export_bpf(out)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _identity_args() -> list[str]:
    """Root: bwrap makes the namespaces itself and keeps only the right to change user,
    which ``setpriv`` uses then drops (the kernel's uid is the host's kernel-uid, no user
    namespace: the same uid inside and out).  Not root: a user namespace mapping the
    agent's own uid, and no further user namespaces inside."""
    if os.geteuid() == 0:
        return ["--cap-add", "CAP_SETUID,CAP_SETGID"]
    return ["--unshare-user", "--disable-userns"]


def _sandbox_helper(config: SandboxConfig) -> str | None:
    """The exec helper, bound read-only into every sandbox at its own path: it changes a
    root agent's kernels to their user and applies the kernel's environment (None:
    setpriv and :data:`ENV_APPLIER` do)."""
    return None if config.exec_helper is None else str(config.exec_helper)


def _env_program(config: SandboxConfig) -> list[str]:
    """What applies the kernel's environment inside the sandbox (or a terminal's, after
    nsenter) once the kernel's user is in place, then execs the command: the exec
    helper's ``env`` mode, else the agent's interpreter (bound into every sandbox)
    running :data:`ENV_APPLIER`.  It reads the environment from the descriptor that
    :data:`ENV_FD_ARG` stands for (``_launcher.env_file``)."""
    helper = _sandbox_helper(config)
    if helper is not None:
        return [helper, "env", ENV_FD_ARG, "--"]
    return [sys.executable, "-I", "-S", "-c", ENV_APPLIER, ENV_FD_ARG, "--"]


def _command_prefix(config: SandboxConfig) -> list[str]:
    """What runs inside before the kernel's argv.  Root: the exec helper's ``drop``
    mode, else ``setpriv`` then :func:`_env_program`, to the kernel's user with no
    capabilities left, in no supplementary group.  Not root: :func:`_env_program` (the
    user namespace maps the agent's own uid, and bwrap has dropped every capability).
    bwrap runs with a fixed environment of its own (``_launcher.PRIVILEGED_ENV``), and
    so does what it starts before the kernel's user is in place: the kernel's (the
    session's: a ``LD_PRELOAD`` in it would load the session's code into bwrap, setpriv
    or a dynamically linked helper) is applied only after the change of user."""
    if os.geteuid() != 0:
        return _env_program(config)
    uid, gid = config.effective_ids()
    helper = _sandbox_helper(config)
    if helper is not None:
        return [helper, "drop", str(uid), str(gid), ENV_FD_ARG, "--"]
    return [
        config.setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *_env_program(config),
    ]


_NAMESPACE_ARGS = (
    "--unshare-pid",
    "--unshare-net",
    "--unshare-uts",
    "--unshare-cgroup-try",
)


@functools.cache
def _system_args() -> tuple[str, ...]:
    """bwrap's options for the system folders (the host's layout: read once)."""
    args: list[str] = []
    for name in _SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    return tuple(args)


@functools.lru_cache(maxsize=64)
def interpreter_paths(program: str) -> tuple[Path, ...]:
    """The host folders a program needs to run, for a Python interpreter: each prefix on
    its symlink chain (``.venv/bin/python`` -> ``.venv`` and the base Python it links
    to); for the agent's own interpreter also ``sys.prefix`` and ``sys.base_prefix``.
    Folders under the system folders (``/usr``) are left out: those are bound anyway.

    Kept per program for the agent's life (a create must not walk the same symlinks
    again; an interpreter moved while the agent runs needs an agent restart).

    >>> interpreter_paths("/usr/bin/sh")
    ()
    """
    found = shutil.which(program)
    if found is None:
        return ()
    paths: list[Path] = []
    current = Path(found)
    for _ in range(16):  # a symlink chain, at most this long
        parent = current.parent
        paths.append(parent.parent if parent.name == "bin" else parent)
        if not current.is_symlink():
            break
        current = (current.parent / os.readlink(current)).absolute()
    if Path(found).resolve() == Path(sys.executable).resolve() or found == sys.executable:
        paths += [Path(sys.prefix), Path(sys.base_prefix)]
    return tuple(_outside_system(paths))


def _outside_system(paths: Iterable[Path]) -> list[Path]:
    kept: list[Path] = []
    for given in paths:
        path = Path(os.path.normpath(given))
        if path != Path("/") and not _under_system(path) and path not in kept:
            kept.append(path)
    return kept


def sandbox_record(
    config: SandboxConfig,
    *,
    kernel_id: str,
    work_dir: Path,
    config_dir: Path,
    cwd: Path,
    program: str,
    image_dir: Path | None = None,
    shared_ro: Sequence[Path] = (),
    mounts: Sequence[Any] = (),
    device_nodes: Sequence[Any] = (),
    nvidia: bool = False,
    ipc_host: bool = False,
    resolv_conf: Path | None = None,
    scratch_root: Path | None = None,
    folder_mounts: Sequence[FolderMount] = (),
) -> dict[str, Any]:
    """The sandbox part of a kernel's ``launch.json`` (see ``_launcher.py``).

    ``args`` are bwrap's options (the launcher adds ``--info-fd``, ``--seccomp`` for the
    ``seccomp`` filter file and, for outbound networking, ``--block-fd``), ``command_prefix`` goes between bwrap's ``--`` and the
    kernel's argv; ``uid`` / ``gid`` are the kernel's user.  ``shared_ro``: agent-wide
    folders every kernel reads (the mock GPUs' statistics); ``mounts`` /
    ``device_nodes``: the plugins' (:class:`~accelshare.accel.types.Mount`,
    ``DeviceNode``); ``nvidia``: the kernel holds CUDA devices (the NVIDIA device nodes are bound); ``scratch_root``: the folder
    of every kernel's scratch dir, made empty inside when a read-only path above it is
    bound (``ro_paths = ["/data"]`` with the scratch root in ``/data/scratch`` would
    otherwise show the other kernels' folders), before this kernel's own are bound.
    ``folder_mounts``: storage folders (their host folders checked and prepared by the
    caller), bound after the work folder at :func:`folder_target`; ``MountRefused``
    when one would cover a system folder or another bind of the sandbox.
    """
    uid, gid = config.effective_ids()
    binds: list[list[str]] = []

    def bind(mode: str, host: Path | str, target: Path | str | None = None) -> None:
        entry = [mode, str(host), str(target if target is not None else host)]
        if entry not in binds:
            binds.append(entry)

    # The environment's interpreter, and the agent's own (the plugins' tools in config/bin,
    # such as the mock nvidia-smi, run under it).
    for path in (*interpreter_paths(program), *interpreter_paths(sys.executable)):
        if path.is_dir():
            bind("ro", path)
    if image_dir is not None and image_dir.is_dir():
        bind("ro", image_dir)
    for path in (*config.ro_paths, *shared_ro):
        if path.exists():
            bind("ro", path)
    bind("ro", config_dir)
    helper = _sandbox_helper(config)
    if helper is not None:
        bind("ro", helper)  # (after the ro_paths: the scratch root is hidden first)
    bind("rw", work_dir)
    resolved_work = work_dir.resolve()
    resolved_cwd = resolved_work if cwd == work_dir else cwd.resolve()
    if not resolved_cwd.is_relative_to(resolved_work):
        bind("rw", resolved_cwd)  # an environment's work-dir outside the scratch dir
    for mount in mounts:
        bind("ro" if mount.read_only else "rw", mount.source, mount.target)
    own = [b[2] for b in binds if b[2] != str(work_dir)]
    own += [str(config_dir.parent)] + ([str(scratch_root)] if scratch_root is not None else [])
    own += [str(h) for h in config.hidden]
    for folder in folder_mounts:
        inside = folder_target(folder, work_dir)
        if folder.work_relative() is None:
            check_target(folder.name, folder.kernel_path, own)
        elif not inside.resolve().is_relative_to(resolved_work):
            raise MountRefused(folder.name, f"{inside} leads out of the work folder")
        bind("ro" if folder.read_only else "rw", folder.host_path, inside)
    devices = [(d.host_path, d.container_path) for d in device_nodes]
    if nvidia:
        dev = Path("/dev")
        for pattern in _NVIDIA_GLOBS:
            devices += [(str(p), str(p)) for p in sorted(dev.glob(pattern))]
        if (dev / "nvidia-caps").is_dir():
            devices.append(("/dev/nvidia-caps", "/dev/nvidia-caps"))
    for host, target in devices:
        bind("dev", host, target)
    if resolv_conf is not None:
        bind("ro", resolv_conf, "/etc/resolv.conf")
    args = [
        *_identity_args(),
        *_NAMESPACE_ARGS,
        *([] if ipc_host else ["--unshare-ipc"]),
        *SESSION_ARGS,
        *_system_args(),
        "--ro-bind-try",
        "/sys",
        "/sys",
    ]
    # The cgroup tree names every kernel on the host: an empty folder instead.
    args += ["--tmpfs", "/sys/fs/cgroup"] if Path("/sys/fs/cgroup").is_dir() else []
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    made: set[str] = set()
    root = Path(os.path.normpath(scratch_root)) if scratch_root is not None else None
    root_text = str(root)
    root_shown = False  # a bind so far holds the scratch root (a ro_path above it)
    for mode, host, target in binds:
        # (paths compared as normalized strings: this runs for every create)
        target_text = str(PurePosixPath(target))
        if root is not None and mode != "dev":
            if _within(root_text, target_text):
                root_shown = True
            elif root_shown and _within(target_text, root_text):
                # the other kernels' folders: an empty one instead, ours bound on top
                args += ["--tmpfs", root_text]
                made = {m for m in made if not Path(m).is_relative_to(root)} | {root_text}
                root_shown = False
        # bwrap would create a missing parent with the host folder's mode (/root: 0700,
        # then nothing below it is reachable for the kernel's user): make them 0755.
        for parent_text in _parents(target_text):
            if parent_text not in made and not _under_system(parent_text):
                made.add(parent_text)
                args += ["--dir", parent_text]
        option = {"ro": "--ro-bind", "rw": "--bind", "dev": "--dev-bind"}[mode]
        args += [option, host, target]
        made.add(target)
    for hidden in config.hidden:  # after the binds: none of them may show it again
        if hidden.is_dir():
            args += ["--tmpfs", str(hidden)]
        elif hidden.exists():
            args += ["--ro-bind", "/dev/null", str(hidden)]
    args += ["--hostname", _hostname(kernel_id), "--chdir", str(resolved_cwd)]
    args += list(config.extra_args)
    return {
        "bwrap": _program(config.bwrap),
        "uid": uid,
        "gid": gid,
        "userns": os.geteuid() != 0,  # see _identity_args
        "args": args,
        "command_prefix": _command_prefix(config),
        "env_program": _env_program(config),
        "network": config.network,
        "slirp4netns": _program(config.slirp4netns),
        "seccomp": None if config.syscall_filter is None else str(config.syscall_filter),
    }


@functools.lru_cache(maxsize=16)
def _program(name: str) -> str:
    """Where ``PATH`` finds a program (``name`` itself when it does not): looked up once
    per agent, as :func:`interpreter_paths` does (a create must not search ``PATH``
    again; a program moved while the agent runs needs an agent restart)."""
    return shutil.which(name) or name


def folder_target(folder: FolderMount, work_dir: Path) -> Path:
    """Where a storage folder is bound inside the sandbox: ``/home/work/<x>`` at
    ``<work_dir>/<x>`` (the kernel's work folder stands for /home/work), any other
    kernel path as it is."""
    relative = folder.work_relative()
    return work_dir / relative if relative is not None else Path(folder.kernel_path)


_SYSTEM_PREFIXES = tuple(f"{name}/" for name in _SYSTEM_DIRS)


def _within(path: str, base: str) -> bool:
    """``PurePosixPath(path).is_relative_to(base)`` for absolute paths in normal form
    (as ``str(PurePosixPath(...))`` writes them), compared as strings: no path objects
    built and no exception raised for the usual answer, False.  (POSIX's ``//`` root is
    a root of its own, as for ``PurePosixPath``.)

    >>> _within("/usr/lib", "/usr"), _within("/usr", "/usr"), _within("/usrx", "/usr")
    (True, True, False)
    >>> _within("/tmp/a", "/"), _within("//tmp", "/")
    (True, False)
    """
    if base == "/":
        return path.startswith("/") and not path.startswith("//")
    return path == base or path.startswith(base if base.endswith("/") else f"{base}/")


def _parents(path: str) -> list[str]:
    """The folders above ``path`` (absolute, in normal form), outermost first, the root
    left out: ``reversed(PurePosixPath(path).parents[:-1])`` without path objects.

    >>> _parents("/a/b/c"), _parents("/a"), _parents("//a/b")
    (['/a', '/a/b'], [], ['//a'])
    """
    found: list[str] = []
    index = path.find("/", 1)
    while index != -1:
        if index > 1:  # (POSIX's "//" root: a root of its own)
            found.append(path[:index])
        index = path.find("/", index + 1)
    return found


def _under_system(path: Path | str) -> bool:
    """Whether ``path`` (normalized) is one of the system folders or lies under one.

    >>> _under_system(Path("/usr/lib")), _under_system("/usr"), _under_system("/usrx")
    (True, True, False)
    """
    text = str(path)
    return text in _SYSTEM_DIRS or text.startswith(_SYSTEM_PREFIXES)


def _hostname(kernel_id: str) -> str:
    """A valid host name from the kernel id (letters, digits, '-'; at most 63)."""
    name = "".join(c if c.isalnum() and c.isascii() else "-" for c in kernel_id)[:63]
    return name.strip("-") or "kernel"


def hidden_defaults(extra: Iterable[Path | str]) -> tuple[Path, ...]:
    """``DEFAULT_HIDDEN`` plus ``extra`` (the agent's config and secret files), each once."""
    seen: list[Path] = []
    for path in (*DEFAULT_HIDDEN, *extra):
        p = Path(path).absolute()
        if p not in seen:
            seen.append(p)
    return tuple(seen)


#: The sandbox's ``/etc/resolv.conf`` with outbound networking: slirp4netns's DNS
#: forwarder (the host's may name a resolver on its own loopback, unreachable here).
OUTBOUND_RESOLV_CONF = "nameserver 10.0.2.3\n"
