"""The apps origin's hand-off tokens already used (see :mod:`accelshare.manager.app_tokens`)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime

__all__ = ["UsedAppToken"]


class UsedAppToken(Base):
    """One redeemed hand-off token (its random ``n``), kept until it has expired."""

    __tablename__ = "used_app_tokens"

    nonce: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
