"""First start: default domain, group, scaling group, resource policy and a superadmin.

Contract (idempotent; safe to call on every manager start, even from two replicas):

* missing defaults are created, existing rows are never modified;
* the default scaling group is associated with the default domain when either of them
  is created (so every user of a fresh cluster may use it); an association an operator
  removed later stays removed;
* when no superadmin exists, one is created with a fresh keypair and password and its
  credentials are written **once** to ``<data-dir>/admin-credentials.env`` (mode 0600,
  created atomically: a temporary file hard-linked into place, so a reader never sees
  half a file and an existing file is never replaced);
* when that file already exists but the database has no superadmin (a wiped database),
  the file's credentials are adopted, so that scripts which sourced it keep working;
* secrets are never logged; the log names the file only;
* the data dir is made private first (0700; its secret files and SQLite files lose
  any group/other access, with a warning): :func:`~.private_files.secure_data_dir`.

The file is a dotenv file (``KEY=value``); load it in a shell with
``set -a; . ./.accelshare/admin-credentials.env; set +a``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import DefaultForUnspecified

from .clock import Clock, utcnow
from .config import ManagerConfig
from .credentials import generate_access_key, generate_secret_key
from .db import Database
from .models import (
    Domain,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    ScalingGroupForDomain,
    User,
    UserRole,
    UserStatus,
    email_matches,
)
from .passwords import generate_password, hash_password
from .private_files import ensure_private_dir, secure_data_dir

__all__ = [
    "AdminCredentials",
    "BootstrapError",
    "BootstrapResult",
    "bootstrap",
    "load_or_create_secret",
    "write_private_file_once",
]

log = logging.getLogger(__name__)

_ACCESS_KEY_RE = re.compile(r"^AKIA[A-Z0-9]{16}$")
_SECRET_KEY_RE = re.compile(r"^[A-Za-z0-9]{40}$")


class BootstrapError(RuntimeError):
    """The first-start setup cannot proceed; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class AdminCredentials:
    access_key: str
    secret_key: str = field(repr=False)
    email: str
    password: str = field(repr=False)

    @classmethod
    def generate(cls, email: str) -> AdminCredentials:
        return cls(generate_access_key(), generate_secret_key(), email, generate_password())

    def to_env(self) -> str:
        return (
            "# accelshare superadmin credentials, written once by the manager's first start.\n"
            "# Keep this file private.  Load it with: set -a; . ./admin-credentials.env; set +a\n"
            f"ACCELSHARE_ACCESS_KEY={self.access_key}\n"
            f"ACCELSHARE_SECRET_KEY={self.secret_key}\n"
            f"ACCELSHARE_ADMIN_EMAIL={shlex.quote(self.email)}\n"
            f"ACCELSHARE_ADMIN_PASSWORD={self.password}\n"
        )

    @classmethod
    def from_env_file(cls, path: Path) -> AdminCredentials:
        values: dict[str, str] = {}
        for raw_line in path.read_text(encoding="utf-8").splitlines():
            line = raw_line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, raw = line.removeprefix("export ").partition("=")
            parts = shlex.split(raw)
            values[key.strip()] = parts[0] if parts else ""
        try:
            creds = cls(
                access_key=values["ACCELSHARE_ACCESS_KEY"],
                secret_key=values["ACCELSHARE_SECRET_KEY"],
                email=values["ACCELSHARE_ADMIN_EMAIL"],
                password=values["ACCELSHARE_ADMIN_PASSWORD"],
            )
        except KeyError as e:
            raise BootstrapError(f"{path}: missing {e.args[0]}") from None
        if not _ACCESS_KEY_RE.match(creds.access_key) or not _SECRET_KEY_RE.match(creds.secret_key):
            raise BootstrapError(
                f"{path}: ACCELSHARE_ACCESS_KEY must be AKIA + 16 upper-case letters/digits "
                "and ACCELSHARE_SECRET_KEY 40 letters/digits"
            )
        return creds


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    created: tuple[str, ...]  # e.g. ("domain:default", "superadmin:admin@accelshare.local")
    credentials_file: Path
    credentials_written: bool  # True only on the call that wrote the file
    superadmin_email: str | None  # None when a superadmin already existed


def write_private_file_once(path: Path, content: str) -> bool:
    """Create ``path`` (mode 0600) with ``content`` unless it exists; True if written.

    Atomic: the content goes to a private temporary file that is hard-linked to
    ``path``; ``link`` fails when ``path`` exists, so an existing file is never replaced.
    """
    if not path.parent.exists():
        ensure_private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, content.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def load_or_create_secret(path: Path, nbytes: int = 32) -> bytes:
    """A server secret (e.g. the cookie-signing key) kept in a 0600 file."""
    write_private_file_once(path, secrets.token_hex(nbytes) + "\n")
    secret = path.read_text(encoding="utf-8").strip()
    if len(secret) < 32:
        raise BootstrapError(f"{path}: the secret is too short (at least 32 characters)")
    return secret.encode("utf-8")


async def _ensure_defaults(session: AsyncSession, config: ManagerConfig, clock: Clock) -> list[str]:
    boot, now, created = config.bootstrap, clock(), []
    if await session.get(Domain, boot.domain) is None:
        session.add(Domain(name=boot.domain, description="Default domain", created_at=now))
        created.append(f"domain:{boot.domain}")
    if await session.get(KeypairResourcePolicy, boot.resource_policy) is None:
        session.add(
            KeypairResourcePolicy(
                name=boot.resource_policy,
                default_for_unspecified=DefaultForUnspecified.UNLIMITED,
                created_at=now,
            )
        )
        created.append(f"resource-policy:{boot.resource_policy}")
    if await session.get(ScalingGroup, boot.scaling_group) is None:
        session.add(ScalingGroup(name=boot.scaling_group, created_at=now))
        created.append(f"scaling-group:{boot.scaling_group}")
    await session.flush()
    if f"domain:{boot.domain}" in created or f"scaling-group:{boot.scaling_group}" in created:
        session.add(ScalingGroupForDomain(scaling_group=boot.scaling_group, domain=boot.domain))
        await session.flush()
    group_query = sa.select(Group).where(Group.domain_name == boot.domain, Group.name == boot.group)
    if (await session.execute(group_query)).scalar() is None:
        session.add(Group(name=boot.group, domain_name=boot.domain, created_at=now))
        created.append(f"group:{boot.domain}/{boot.group}")
    await session.flush()
    return created


async def _create_superadmin(
    session: AsyncSession, config: ManagerConfig, creds: AdminCredentials, clock: Clock
) -> None:
    boot, now = config.bootstrap, clock()
    if (await session.execute(sa.select(User.id).where(email_matches(creds.email)))).first():
        raise BootstrapError(
            f"A user {creds.email!r} exists but is not a superadmin; set [bootstrap] "
            "admin-email to another address or give that user the superadmin role."
        )
    password_hash = await asyncio.to_thread(hash_password, creds.password)
    user = User(
        email=creds.email,
        username="admin",
        full_name="accelshare superadmin",
        password_hash=password_hash,
        role=UserRole.SUPERADMIN,
        status=UserStatus.ACTIVE,
        domain_name=boot.domain,
        created_at=now,
        modified_at=now,
    )
    session.add(user)
    await session.flush()
    group_id = (
        await session.execute(
            sa.select(Group.id).where(Group.domain_name == boot.domain, Group.name == boot.group)
        )
    ).scalar_one()
    session.add(GroupMember(group_id=group_id, user_id=user.id))
    session.add(
        Keypair(
            access_key=creds.access_key,
            secret_key=creds.secret_key,
            user_id=user.id,
            resource_policy=boot.resource_policy,
            is_active=True,
            is_admin=True,
            created_at=now,
        )
    )
    await session.flush()


async def _bootstrap_once(db: Database, config: ManagerConfig, clock: Clock) -> BootstrapResult:
    path = config.credentials_file
    written = False
    try:
        async with db.begin(write=True) as session:
            created = await _ensure_defaults(session, config, clock)
            superadmin = (
                await session.execute(
                    sa.select(User.id).where(User.role == UserRole.SUPERADMIN).limit(1)
                )
            ).first()
            if superadmin is not None:
                return BootstrapResult(tuple(created), path, False, None)
            if path.exists():
                creds = AdminCredentials.from_env_file(path)
                log.info("bootstrap: adopting the superadmin credentials in %s", path)
            else:
                creds = AdminCredentials.generate(config.bootstrap.admin_email)
                written = write_private_file_once(path, creds.to_env())
                if not written:  # another process won the race: use its credentials
                    creds = AdminCredentials.from_env_file(path)
            await _create_superadmin(session, config, creds, clock)
            created.append(f"superadmin:{creds.email}")
    except BaseException:
        if written:  # the database does not hold these credentials: do not keep them
            path.unlink(missing_ok=True)
        raise
    if written:
        log.info("bootstrap: superadmin credentials written to %s (mode 0600)", path)
    return BootstrapResult(tuple(created), path, written, creds.email)


async def bootstrap(
    db: Database, config: ManagerConfig, *, clock: Clock = utcnow
) -> BootstrapResult:
    """Create what a fresh cluster needs (see the module docstring).  Idempotent."""
    secure_data_dir(
        config.data_dir,
        config.credentials_file,
        config.cookie_secret_file,
        config.cluster_secret_file,
    )
    try:
        result = await _bootstrap_once(db, config, clock)
    except IntegrityError:
        # A concurrent manager created the same rows first; its work is what we wanted.
        log.info("bootstrap: lost a race with another manager; re-checking")
        result = await _bootstrap_once(db, config, clock)
    for item in result.created:
        log.info("bootstrap: created %s", item)
    return result
