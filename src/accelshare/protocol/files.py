"""A running kernel's working folder, through the agent (``session upload``,
``session download``, ``session ls``).

Agent RPC::

    PUT /v1/kernels/{kernel_id}/files?path=REL        body: the file's bytes (streamed)
                                                      -> FileUploadResult
    GET /v1/kernels/{kernel_id}/files?path=REL        -> application/x-tar (streamed): the
                                                      file, or the folder with everything in it
    GET /v1/kernels/{kernel_id}/files/list?path=REL   -> FileList (one folder's entries)

``REL`` is relative to the kernel's working folder (``/home/work`` inside; empty or
``.`` for the folder itself): :func:`check_relative_path` says what is refused.  Answers
besides 200: 400 a refused path, 404 no such kernel (or not running) or no such file,
409 a path that is a folder where a file is expected (or the reverse), or lies in a
read-only mount, 413 an upload over the agent's ``[container] file-upload-max-bytes``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .fields import WireModel

__all__ = [
    "WORK_HOME",
    "FileEntry",
    "FileList",
    "FileUploadResult",
    "check_relative_path",
    "from_kernel_path",
]

WORK_HOME = "/home/work"
"""The kernel's working folder as its user sees it (docker; the process runtime's
``HOME`` stands for it)."""

MAX_PATH_CHARS = 4096


class FileEntry(WireModel):
    """One entry of a folder, as Backend.AI's ``session ls`` prints it."""

    filename: str
    size: Annotated[int, Field(ge=0)]
    mode: str  # ``stat.filemode``: "-rw-r--r--", "drwxr-xr-x", "lrwxrwxrwx"
    mtime: float
    ctime: float
    atime: float


class FileList(WireModel):
    path: str  # relative to the working folder ("" for itself)
    files: list[FileEntry]


class FileUploadResult(WireModel):
    path: str
    size: Annotated[int, Field(ge=0)]


def check_relative_path(path: str) -> str:
    """``path`` cleaned (``a//b/./c`` -> ``a/b/c``; ``.`` and empty -> ``""``), or
    ``ValueError`` naming why it is refused: NUL or another control character, an
    absolute path, a ``..`` part, more than 4096 characters."""
    if len(path) > MAX_PATH_CHARS:
        raise ValueError(f"path: at most {MAX_PATH_CHARS} characters, received {len(path)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError(f"path: control characters (NUL, newline...) are refused: {path!r}")
    if path.startswith("/"):
        raise ValueError(f"path: expected a path relative to the working folder, received {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path: '..' is refused, received {path!r}")
    return "/".join(parts)


def from_kernel_path(path: str) -> str:
    """A path as a client gives it (relative to ``/home/work``, or absolute under it)
    made relative (:func:`check_relative_path`); ``ValueError`` for one outside."""
    if path == WORK_HOME or path.startswith(WORK_HOME + "/"):
        path = path[len(WORK_HOME) :].lstrip("/")
    elif path.startswith("/"):
        raise ValueError(f"path: expected a path in {WORK_HOME}, received {path!r}")
    return check_relative_path(path)
