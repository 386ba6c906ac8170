"""The storage proxy's two faces: what the manager asks of it, and what clients send it.

A storage proxy serves *volumes* (a ``vfs`` backend on a directory, named ``proxy:volume``
by the manager, Backend.AI's ``host``); a *folder* (Backend.AI's vfolder) is a directory
on one volume, known to the proxy only by its id (a UUID hex string, no dashes).  The
manager keeps who owns a folder, its name and its shares; the proxy keeps its bytes.

**Manager-facing API** (``manager-api`` address; every request carries the proxy's
secret in :data:`STORAGE_SECRET_HEADER`; bodies and answers are JSON)::

    GET  /v1/volumes               -> VolumeList
    POST /v1/folders/create        FolderCreate -> 204   (idempotent: an existing empty folder is fine)
    POST /v1/folders/delete        FolderRef -> 204      (idempotent: a missing folder is fine)
    POST /v1/folders/clone         FolderClone -> 204    (copies every file; the target must not exist)
    POST /v1/folders/usage         FolderRef -> FolderUsage
    POST /v1/folders/quota         FolderQuota -> 204    (None: no limit)
    POST /v1/folders/mount         FolderRef -> FolderMount  (the folder's path on the proxy's host)
    POST /v1/files/list            FileListRequest -> FileListPage
    POST /v1/files/mkdir           MkdirRequest -> 204
    POST /v1/files/move            MoveRequest -> 204    (a rename is a move in one directory)
    POST /v1/files/delete          DeleteRequest -> 204
    POST /v1/files/upload          UploadRequest -> TransferTicket
    POST /v1/files/download        DownloadRequest -> TransferTicket
    GET  /v1/health                -> {"status": "ok"}

A refusal is ``application/problem+json`` (RFC 9457) with ``type`` one of
:class:`StorageErrorType`, ``title``, ``detail`` naming the field, the expected and the
received value, and ``status``.

**Client-facing API** (``client-api`` address; no secret: each request carries a
short-lived ``token`` the proxy issued in a :class:`TransferTicket`, which names the
volume, folder, path and operation, and expires)::

    OPTIONS            /upload?token=T   tus discovery (Tus-Version 1.0.0)
    HEAD               /upload?token=T   tus: Upload-Offset / Upload-Length of the session
    PATCH              /upload?token=T   tus: bytes at Upload-Offset (application/offset+octet-stream)
    GET                /download?token=T a file (Range supported) or a directory as a zip
                                         (``archive=true`` in the DownloadRequest)

An upload is written to a hidden partial file and moved under its final name, at once,
only when its last byte arrived: a reader never sees half a file under the final name.

Paths inside a folder are relative POSIX paths (``data/train.csv``); ``..``, absolute
paths, NUL and symbolic links leading out of the folder are refused (``bad-path``).
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import Field

from .fields import WireModel

__all__ = [
    "MAX_LIST_PAGE",
    "STORAGE_SECRET_HEADER",
    "DeleteRequest",
    "DownloadRequest",
    "FileEntry",
    "FileListPage",
    "FileListRequest",
    "FolderClone",
    "FolderCreate",
    "FolderMount",
    "FolderQuota",
    "FolderRef",
    "FolderUsage",
    "MkdirRequest",
    "MoveRequest",
    "StorageErrorType",
    "TransferTicket",
    "UploadRequest",
    "VolumeInfo",
    "VolumeList",
]

STORAGE_SECRET_HEADER = "X-Accelshare-Storage-Secret"

MAX_LIST_PAGE = 5000  # entries in one FileListPage

FolderId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
VolumeName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
RelPath = Annotated[str, Field(max_length=4096)]  # checked by the proxy: see the module doc


class StorageErrorType(enum.StrEnum):
    BAD_REQUEST = "bad-request"  # a field has the wrong type or value
    BAD_PATH = "bad-path"  # traversal, absolute, NUL, a symlink out of the folder
    NO_VOLUME = "no-volume"
    NO_FOLDER = "no-folder"
    NO_FILE = "no-file"
    EXISTS = "exists"  # the target name is taken
    NOT_EMPTY = "not-empty"  # a directory delete without ``recursive``
    OVER_QUOTA = "over-quota"
    BAD_TOKEN = "bad-token"  # unsigned, expired, or for another operation
    BAD_SECRET = "bad-secret"
    UPLOAD_CONFLICT = "upload-conflict"  # a PATCH at an offset that is not the session's


class VolumeInfo(WireModel):
    name: VolumeName
    backend: Literal["vfs"] = "vfs"
    path: str  # the volume's directory on the proxy's host
    # "quota": the volume enforces folder quotas itself (file system project quotas);
    # without it the proxy enforces them on upload from a usage scan.
    capabilities: list[str] = Field(default_factory=list)
    total_bytes: int | None = None
    used_bytes: int | None = None


class VolumeList(WireModel):
    volumes: list[VolumeInfo]


class FolderRef(WireModel):
    volume: VolumeName
    folder_id: FolderId


class FolderCreate(FolderRef):
    quota_bytes: Annotated[int, Field(ge=0)] | None = None


class FolderQuota(FolderRef):
    quota_bytes: Annotated[int, Field(ge=0)] | None = None


class FolderClone(WireModel):
    source: FolderRef
    target: FolderRef


class FolderUsage(WireModel):
    file_count: int
    used_bytes: int
    quota_bytes: int | None = None


class FolderMount(WireModel):
    path: str  # absolute, on the proxy's host; agents reach it at the same path (NFS)


class FileEntry(WireModel):
    name: str
    type: Literal["file", "dir", "symlink"]
    size: int
    mode: int  # permission bits
    created: float  # POSIX seconds
    modified: float


class FileListRequest(FolderRef):
    path: RelPath = "."
    limit: Annotated[int, Field(ge=1, le=MAX_LIST_PAGE)] = MAX_LIST_PAGE
    cursor: str | None = None  # from the previous page's ``next_cursor``


class FileListPage(WireModel):
    items: list[FileEntry]
    next_cursor: str | None = None  # None: the last page


class MkdirRequest(FolderRef):
    paths: Annotated[list[RelPath], Field(min_length=1, max_length=100)]
    parents: bool = False
    exist_ok: bool = False


class MoveRequest(FolderRef):
    source: RelPath
    target: RelPath


class DeleteRequest(FolderRef):
    paths: Annotated[list[RelPath], Field(min_length=1, max_length=1000)]
    recursive: bool = False


class UploadRequest(FolderRef):
    path: RelPath
    size: Annotated[int, Field(ge=0)]


class DownloadRequest(FolderRef):
    path: RelPath
    archive: bool = False  # a directory as a zip


class TransferTicket(WireModel):
    token: str
    url: str  # the client-facing address: ``.../upload`` or ``.../download``
