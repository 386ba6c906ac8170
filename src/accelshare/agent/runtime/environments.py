"""Named environments ("images") of the process runtime.

A docker kernel names an image; a process kernel names an *environment*: a command
prefix, an optional image directory and extra environment variables, so that
``session create python ...`` works the same with both runtimes.  Built in:

    python   the agent's own Python interpreter:  argv = [sys.executable, *command]
    shell    /bin/sh:                              argv = ["/bin/sh", "-c", *command]

so ``command=("-c", "print(1)")`` runs Python code and, for ``shell``,
``command=("echo $0 $1", "a", "b")`` runs a script with its ``$0``/``$1``.  A kernel
with no command runs the environment's ``idle_command`` (``sleep infinity``) and stays
up until it is destroyed.

A batch session's *startup command* is one string, a command line: every environment
runs it as ``/bin/sh -c <startup command>`` (:data:`~.base.STARTUP_SHELL`), as Backend.AI
and the docker runtime run it, in the kernel's work dir (``work-dir``), with the
kernel's environment (the session's ``environ``, the plugins' variables, the
environment's ``env``).  The environment's bin dir is first on the kernel's ``PATH``
(its ``image-dir``'s ``bin/``, else its interpreter's folder unless that is a system
one such as ``/usr/bin``), so ``python train.py`` runs the environment's interpreter,
and ``echo hi; exit 3`` runs the same in every environment.

More come from configuration (:meth:`ProcessEnvironment.from_config`), e.g. a
virtualenv::

    [container.environments.torch]
    command-prefix = ["/opt/venvs/torch/bin/python"]
    image-dir = "/opt/venvs/torch"          # <image-dir>/bin goes first on PATH
    env = { HF_HOME = "/data/hf" }
    work-dir = "{work}/project"             # the kernel's working directory (template)

``work-dir`` is a template with ``{work}`` (the kernel's ``work/`` folder, its HOME),
``{scratch}`` (its scratch dir) and ``{kernel_id}``; default ``{work}``.  A folder inside
the scratch dir is created; any other must exist (``/data/shared/{kernel_id}`` does
not get created on the host by the agent).
"""

from __future__ import annotations

import shutil
import string
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_IDLE_COMMAND",
    "EnvironmentConfigError",
    "ProcessEnvironment",
    "default_environments",
]

DEFAULT_IDLE_COMMAND = ("sleep", "infinity")
_WORK_DIR_FIELDS = frozenset({"work", "scratch", "kernel_id"})


class EnvironmentConfigError(ValueError):
    """A bad environment table: which environment, which of its keys, what that key
    takes and what it holds (the agent turns it into an ``AgentConfigError`` naming
    ``container.environments.<name>.<key>``)."""

    def __init__(self, name: str, key: str, expected: str, received: Any) -> None:
        super().__init__(f"environment {name!r}: {key!r} must be {expected}, got {received!r}")
        self.name = name
        self.key = key
        self.expected = expected
        self.received = received


@dataclass(frozen=True, slots=True)
class ProcessEnvironment:
    name: str
    command_prefix: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    image_dir: Path | None = None
    idle_command: tuple[str, ...] = DEFAULT_IDLE_COMMAND
    work_dir: str = "{work}"

    def work_dir_for(self, *, work: Path, scratch: Path, kernel_id: str) -> Path:
        """The kernel's working directory (see the module docstring); created when it
        lies inside ``scratch``.  Raises ``FileNotFoundError`` for a folder outside the
        scratch dir that does not exist (the kernel then fails with that reason).

        >>> import tempfile; root = Path(tempfile.mkdtemp())
        >>> env = ProcessEnvironment("x", ("python",), work_dir="{work}/{kernel_id}")
        >>> env.work_dir_for(work=root / "work", scratch=root, kernel_id="k1") == root / "work/k1"
        True
        """
        path = Path(self.work_dir.format(work=work, scratch=scratch, kernel_id=kernel_id))
        resolved = path.resolve()
        if resolved.is_relative_to(scratch.resolve()):
            resolved.mkdir(parents=True, exist_ok=True)
            return resolved
        if not resolved.is_dir():
            raise FileNotFoundError(
                f"the work dir {resolved} of environment {self.name!r} is not a folder"
                " (only folders inside the kernel's scratch dir are created)"
            )
        return resolved

    def missing(self) -> str | None:
        """Why this host does not really have the environment (``None``: it has it): its
        interpreter is not an executable file (an absolute path, or a name found on
        ``PATH``), or its image dir is not a folder.  The agent reports only the
        environments it has, so the manager places sessions only where they can run."""
        program = self.command_prefix[0]
        found = shutil.which(program)
        if found is None:
            return f"{program} is not an executable file on this host"
        if self.image_dir is not None and not self.image_dir.is_dir():
            return f"its image dir {self.image_dir} is not a folder on this host"
        return None

    def argv(self, command: tuple[str, ...] | None) -> tuple[str, ...]:
        """The full argv for ``command`` (the idle command when there is none)."""
        if command is None:
            return self.idle_command
        return (*self.command_prefix, *command)

    @classmethod
    def from_config(cls, name: str, data: Mapping[str, Any]) -> ProcessEnvironment:
        """Build one from a config table; errors name the environment and the key."""

        def strings(key: str, default: tuple[str, ...], example: str) -> tuple[str, ...]:
            value = data.get(key, list(default))
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise EnvironmentConfigError(
                    name, key, f"a list of strings such as {example}", value
                )
            return tuple(value)

        prefix_example = '["/opt/venvs/torch/bin/python"]'
        prefix = strings("command-prefix", (), prefix_example)
        if not prefix:
            raise EnvironmentConfigError(
                name,
                "command-prefix",
                f"a non-empty list of strings such as {prefix_example}",
                data.get("command-prefix", []),
            )
        env = data.get("env", {})
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise EnvironmentConfigError(
                name, "env", 'a table of strings such as { HF_HOME = "/data/hf" }', env
            )
        image_dir = data.get("image-dir")
        if image_dir is not None and not isinstance(image_dir, str):
            raise EnvironmentConfigError(
                name, "image-dir", 'a folder path such as "/opt/venvs/torch"', image_dir
            )
        idle = strings("idle-command", DEFAULT_IDLE_COMMAND, '["sleep", "infinity"]')
        work_dir = data.get("work-dir", "{work}")
        work_example = 'a path template such as "{work}/project" (fields: work, scratch, kernel_id)'
        if not isinstance(work_dir, str) or not work_dir:
            raise EnvironmentConfigError(name, "work-dir", work_example, work_dir)
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(work_dir) if f is not None}
        except ValueError:
            raise EnvironmentConfigError(name, "work-dir", work_example, work_dir) from None
        if not fields <= _WORK_DIR_FIELDS:
            raise EnvironmentConfigError(name, "work-dir", work_example, work_dir)
        return cls(
            name=name,
            command_prefix=prefix,
            env=dict(env),
            image_dir=Path(image_dir) if image_dir else None,
            idle_command=idle,
            work_dir=work_dir,
        )


def default_environments() -> dict[str, ProcessEnvironment]:
    return {
        "python": ProcessEnvironment("python", (sys.executable,)),
        "shell": ProcessEnvironment("shell", ("/bin/sh", "-c")),
    }
