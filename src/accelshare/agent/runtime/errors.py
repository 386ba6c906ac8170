"""Errors of the kernel runtimes.

Hierarchy::

    Exception
     └── KernelRuntimeError          base: something about a kernel could not be done
          ├── KernelNotFound         no scratch dir, process or container for this kernel id
          ├── KernelConflict         the kernel id is taken by a kernel in the wrong state
          ├── KernelStartFailed      the runtime could not start the kernel (reason inside)
          ├── UnknownEnvironment     the process runtime has no environment of that name
          ├── ImageUnavailable       the docker engine lacks the image and cannot pull it
          └── RuntimeUnavailable     the runtime cannot work here (no Docker engine, no unshare)

Each carries ``kernel_id`` (None for runtime-wide problems) so that the agent can log
and report it against the right kernel.
"""

from __future__ import annotations

__all__ = [
    "ImageUnavailable",
    "KernelConflict",
    "KernelNotFound",
    "KernelRuntimeError",
    "KernelStartFailed",
    "RuntimeUnavailable",
    "UnknownEnvironment",
]


class KernelRuntimeError(Exception):
    def __init__(self, message: str, *, kernel_id: str | None = None) -> None:
        super().__init__(message)
        self.kernel_id = kernel_id


class KernelNotFound(KernelRuntimeError):
    def __init__(self, kernel_id: str) -> None:
        super().__init__(f"Kernel {kernel_id} not found", kernel_id=kernel_id)


class KernelConflict(KernelRuntimeError):
    def __init__(self, kernel_id: str, reason: str) -> None:
        super().__init__(f"Kernel {kernel_id}: {reason}", kernel_id=kernel_id)
        self.reason = reason


class KernelStartFailed(KernelRuntimeError):
    def __init__(self, kernel_id: str, reason: str) -> None:
        super().__init__(f"Kernel {kernel_id} failed to start: {reason}", kernel_id=kernel_id)
        self.reason = reason


class UnknownEnvironment(KernelRuntimeError):
    def __init__(self, name: str, known: list[str], kernel_id: str | None = None) -> None:
        super().__init__(
            f"Unknown environment {name!r} for the process runtime: expected one of "
            f"{', '.join(sorted(known)) or '(none configured)'}",
            kernel_id=kernel_id,
        )
        self.name = name


class ImageUnavailable(KernelRuntimeError):
    """The docker engine does not have the image and cannot get it (the reason says why)."""

    def __init__(self, image: str, reason: str) -> None:
        super().__init__(f"image {image}: {reason}")
        self.image = image


class RuntimeUnavailable(KernelRuntimeError):
    pass
