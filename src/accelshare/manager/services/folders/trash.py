"""The trash: deleting, restoring and purging folders.

Deleting moves a folder to the trash (``delete-pending``), from where it is restored,
or purged (``delete-from-trash-bin``, ``purge``: the bytes go); :meth:`FolderTrash.purge_old_trash`
purges what has been in the trash longer than the configured age.  A folder mounted by
a session that has not ended cannot be deleted: the error names the session.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.sched.lifecycle import FINAL_STATUSES

from ...enums import VFolderStatus
from ...errors import Conflict
from ...models import Session, SessionVFolderMount, VFolder
from ..actor import Actor
from .access import TRASH, FolderCore

__all__ = ["FolderTrash"]


class FolderTrash(FolderCore):
    """Deleting to the trash, restoring and purging."""

    async def _mounting_sessions(self, db: AsyncSession, folder_id: uuid.UUID) -> list[str]:
        rows = await db.execute(
            sa.select(Session.name)
            .join(SessionVFolderMount, SessionVFolderMount.session_id == Session.id)
            .where(SessionVFolderMount.vfolder_id == folder_id)
            .where(Session.status.not_in(list(FINAL_STATUSES)))
            .order_by(Session.name)
        )
        return list(rows.scalars())

    async def delete(self, actor: Actor, ref: str) -> None:
        """Move to the trash (``delete-pending``)."""
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, ref, field="id")
            self._manage(access, "delete")
            folder = access.folder
            if folder.status is TRASH:
                raise Conflict(
                    f"The folder {folder.name!r} is already in the trash", field="id", received=ref
                )
            sessions = await self._mounting_sessions(db, folder.id)
            if sessions:
                raise Conflict(
                    f"The folder {folder.name!r} is mounted in the running session"
                    f"{'s' if len(sessions) > 1 else ''} {', '.join(repr(s) for s in sessions)}:"
                    " end the session first",
                    field="id",
                    received=ref,
                    sessions=sessions,
                )
            await db.execute(
                sa.update(VFolder)
                .where(VFolder.id == folder.id)
                .values(status=TRASH, status_changed_at=self.clock())
            )

    async def restore(self, actor: Actor, ref: str) -> None:
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, ref, field="id")
            self._manage(access, "restore")
            if access.folder.status is not TRASH:
                raise Conflict(
                    f"The folder {access.folder.name!r} is not in the trash"
                    f" ({access.folder.status.value})",
                    field="id",
                    received=ref,
                )
            await db.execute(
                sa.update(VFolder)
                .where(VFolder.id == access.folder.id)
                .values(status=VFolderStatus.READY, status_changed_at=self.clock())
            )

    async def purge(self, actor: Actor, ref: str) -> None:
        """Delete a folder in the trash for good (its bytes on the proxy too)."""
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, ref, field="id")
            self._manage(access, "purge")
            if access.folder.status not in (TRASH, VFolderStatus.DELETE_ERROR):
                raise Conflict(
                    f"The folder {access.folder.name!r} is not in the trash: delete it first",
                    field="id",
                    received=ref,
                )
            await db.execute(
                sa.update(VFolder)
                .where(VFolder.id == access.folder.id)
                .values(status=VFolderStatus.DELETE_ONGOING, status_changed_at=self.clock())
            )
        await self._purge_one(access.folder)

    async def _purge_one(self, folder: VFolder) -> None:
        try:
            proxy, _ = await self.proxies.for_host(folder.host)
            await proxy.delete_folder(self._ref(folder)[1])
        except Exception:
            async with self.db.begin(write=True) as db:
                await db.execute(
                    sa.update(VFolder)
                    .where(VFolder.id == folder.id)
                    .values(status=VFolderStatus.DELETE_ERROR, status_changed_at=self.clock())
                )
            raise
        async with self.db.begin(write=True) as db:
            await db.execute(sa.delete(VFolder).where(VFolder.id == folder.id))

    async def purge_old_trash(self, max_age: timedelta | None = None) -> list[str]:
        """Purge every folder in the trash for longer than ``max_age`` (default: the
        service's ``trash_max_age``; ``None`` there: nothing).  Returns the purged ids;
        a proxy that fails leaves its folder ``delete-error`` for the next round."""
        age = max_age if max_age is not None else self.trash_max_age
        if age is None:
            return []
        cutoff = self.clock() - age
        async with self.db.begin(write=True) as db:
            rows = await db.execute(
                sa.select(VFolder).where(
                    VFolder.status == TRASH, VFolder.status_changed_at <= cutoff
                )
            )
            old = list(rows.scalars())
            if old:
                await db.execute(
                    sa.update(VFolder)
                    .where(VFolder.id.in_([f.id for f in old]))
                    .values(status=VFolderStatus.DELETE_ONGOING)
                )
        purged = []
        for folder in old:
            try:
                await self._purge_one(folder)
            except Exception:
                continue
            purged.append(folder.id.hex)
        return purged
