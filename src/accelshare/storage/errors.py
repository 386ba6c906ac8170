"""The proxy's refusals: a :class:`StorageError` becomes an ``application/problem+json``
answer (RFC 9457) whose ``type`` is one of :class:`StorageErrorType`."""

from __future__ import annotations

from accelshare.protocol.storage import StorageErrorType

__all__ = ["STATUS", "StorageError"]

STATUS: dict[StorageErrorType, int] = {
    StorageErrorType.BAD_REQUEST: 400,
    StorageErrorType.BAD_PATH: 400,
    StorageErrorType.NO_VOLUME: 404,
    StorageErrorType.NO_FOLDER: 404,
    StorageErrorType.NO_FILE: 404,
    StorageErrorType.EXISTS: 409,
    StorageErrorType.NOT_EMPTY: 409,
    StorageErrorType.OVER_QUOTA: 413,
    StorageErrorType.BAD_TOKEN: 403,
    StorageErrorType.BAD_SECRET: 401,
    StorageErrorType.UPLOAD_CONFLICT: 409,
}

_TITLES: dict[StorageErrorType, str] = {
    StorageErrorType.BAD_REQUEST: "Bad request",
    StorageErrorType.BAD_PATH: "Bad path",
    StorageErrorType.NO_VOLUME: "No such volume",
    StorageErrorType.NO_FOLDER: "No such folder",
    StorageErrorType.NO_FILE: "No such file or directory",
    StorageErrorType.EXISTS: "The name is taken",
    StorageErrorType.NOT_EMPTY: "The directory is not empty",
    StorageErrorType.OVER_QUOTA: "Over the folder's quota",
    StorageErrorType.BAD_TOKEN: "Bad transfer token",
    StorageErrorType.BAD_SECRET: "Bad storage proxy secret",
    StorageErrorType.UPLOAD_CONFLICT: "Upload offset conflict",
}


class StorageError(Exception):
    """A refusal; ``detail`` names the field, the expected and the received value."""

    def __init__(self, type_: StorageErrorType, detail: str, *, status: int | None = None) -> None:
        super().__init__(detail)
        self.type = type_
        self.detail = detail
        self.status = status if status is not None else STATUS[type_]

    @property
    def title(self) -> str:
        return _TITLES[self.type]

    def problem(self) -> dict[str, object]:
        return {
            "type": str(self.type),
            "title": self.title,
            "detail": self.detail,
            "status": self.status,
        }
