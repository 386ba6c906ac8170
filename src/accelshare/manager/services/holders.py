"""Which sessions hold which kernels: what the agents' routes and the agents stream
need to show (or hide) the holders of the devices in an allocation map."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from accelshare.sched.lifecycle import FINAL_STATUSES

from ..db import Database
from ..models import Kernel, Session

__all__ = ["KernelHolders"]


class KernelHolders:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def in_domain(self, domain: str, kernel_ids: Iterable[str]) -> set[str]:
        """Those of ``kernel_ids`` that belong to sessions of ``domain`` (an id that is no
        UUID is no kernel the manager could know: left out)."""
        wanted = []
        for kernel_id in kernel_ids:
            try:
                wanted.append(uuid.UUID(kernel_id))
            except ValueError:
                continue
        if not wanted:
            return set()
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(Kernel.id)
                .join(Session, Kernel.session_id == Session.id)
                .where(Kernel.id.in_(wanted), Session.domain_name == domain)
            )
            return {str(kernel_id) for (kernel_id,) in rows}

    async def live(self) -> dict[str, dict[str, Any]]:
        """kernel id -> the session holding it (live kernels only): ``{sessionId,
        sessionName, accessKey, status, domainName}``."""
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(
                    Kernel.id,
                    Session.id,
                    Session.name,
                    Session.access_key,
                    Session.status,
                    Session.domain_name,
                )
                .join(Session, Kernel.session_id == Session.id)
                .where(Kernel.status.not_in(list(FINAL_STATUSES)))
            )
            return {
                str(kernel_id): {
                    "sessionId": str(session_id),
                    "sessionName": name,
                    "accessKey": access_key,
                    "status": status.value,
                    "domainName": domain,
                }
                for kernel_id, session_id, name, access_key, status, domain in rows
            }
