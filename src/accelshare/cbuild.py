"""Small C programs and libraries shipped as source, compiled on the host with ``cc``.

The agent builds its native parts at start (the CUDA memory interposer,
:mod:`accelshare.accel.cuda.interposer`; the kernels' exec helper,
:mod:`accelshare.agent.runtime.exec_helper`): each with ``cc`` (``$CC`` when set) into a
folder of its own, under a name that carries the hash of the source and the flags, so an
agent compiles again only when either changes and an older build is left in place for
the processes that still name it.  A build is written under a temporary name and
renamed: nobody ever sees half a file.

Several flag sets may be given, best first (a static build, then a dynamic one): a
build of any of them already there is used as it is; otherwise each is tried in turn
and the first that compiles wins.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["BuildFailed", "build", "build_name", "find_compiler"]

BUILD_TIMEOUT_S = 120.0
_OUTPUT_TAIL = 400


class BuildFailed(RuntimeError):
    """The program cannot be built (no compiler, a failed compile); ``str()`` says why."""


def build_name(prefix: str, suffix: str, source: bytes, flags: Sequence[str]) -> str:
    """``<prefix><16 hex digits><suffix>``: the hash of ``source`` and ``flags``."""
    digest = hashlib.sha256(source)
    digest.update(" ".join(flags).encode())
    return f"{prefix}{digest.hexdigest()[:16]}{suffix}"


def find_compiler(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The C compiler's argv: ``$CC`` (split as a shell would) or ``cc``; None when its
    program is not found."""
    environ = os.environ if env is None else env
    argv = shlex.split(environ.get("CC", "")) or ["cc"]
    found = shutil.which(argv[0], path=environ.get("PATH", os.defpath))
    return [found, *argv[1:]] if found is not None else None


def build(
    source: Path,
    folder: Path,
    *,
    prefix: str,
    suffix: str = "",
    variants: Sequence[tuple[Sequence[str], Sequence[str]]],
    env: Mapping[str, str] | None = None,
    timeout_s: float = BUILD_TIMEOUT_S,
) -> Path:
    """``source`` compiled into ``folder`` (made 0755) with the first of ``variants``
    (``(flags, libs)`` pairs, flags before the source and libs after it) that compiles,
    unless a build of the same source with one of them is there already (I/O, blocking).
    The file is made 0755.  :class:`BuildFailed` naming why it cannot be (the first
    variant's failure when every one fails)."""
    if not variants:
        raise ValueError("build: no flags to build with")
    try:
        text = source.read_bytes()
    except OSError as e:
        raise BuildFailed(f"its source {source} cannot be read ({e})") from e
    targets = [
        folder / build_name(prefix, suffix, text, (*flags, *libs)) for flags, libs in variants
    ]
    for target in targets:
        if target.is_file():
            return target
    compiler = find_compiler(env)
    if compiler is None:
        name = (env if env is not None else os.environ).get("CC") or "cc"
        raise BuildFailed(f"no C compiler: {name!r} was not found (install gcc, or set CC)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)  # (processes of other users run or load what is in it)
    except OSError as e:
        raise BuildFailed(f"its folder {folder} cannot be made ({e})") from e
    first_error: BuildFailed | None = None
    for (flags, libs), target in zip(variants, targets, strict=True):
        try:
            _compile(compiler, source, target, flags, libs, env, timeout_s)
        except BuildFailed as e:
            first_error = first_error or e
            continue
        return target
    assert first_error is not None
    raise first_error


def _compile(
    compiler: list[str],
    source: Path,
    target: Path,
    flags: Sequence[str],
    libs: Sequence[str],
    env: Mapping[str, str] | None,
    timeout_s: float,
) -> None:
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    argv = [*compiler, *flags, "-o", str(partial), str(source), *libs]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
            env=dict(env) if env is not None else None,
        )
        if done.returncode != 0:
            output = done.stdout.decode(errors="replace").strip()
            tail = output[-_OUTPUT_TAIL:] if output else "no output"
            raise BuildFailed(f"{shlex.join(argv)} exited with {done.returncode}: {tail}")
        partial.chmod(0o755)
        os.replace(partial, target)
    except subprocess.TimeoutExpired as e:
        raise BuildFailed(f"{compiler[0]} took more than {timeout_s:g} s") from e
    except OSError as e:
        raise BuildFailed(f"{compiler[0]} could not build it ({e})") from e
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
