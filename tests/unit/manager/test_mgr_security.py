"""Password hashing, key generation, the credentials file and column types (no database)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from accelshare.common import ResourceSlot, SlotValueError
from accelshare.manager.bootstrap import (
    AdminCredentials,
    BootstrapError,
    load_or_create_secret,
    write_private_file_once,
)
from accelshare.manager.credentials import generate_access_key, generate_secret_key
from accelshare.manager.models import ResourceSlotJSON, UserRole, UTCDateTime
from accelshare.manager.passwords import (
    ScryptParams,
    generate_password,
    hash_password,
    verify_password,
)

FAST = ScryptParams(n=2**10)


def test_password_round_trip() -> None:
    stored = hash_password("s3cret", FAST)
    assert stored.startswith("scrypt$1024$8$1$")
    assert verify_password("s3cret", stored)
    assert not verify_password("s3cret ", stored)
    assert hash_password("s3cret", FAST) != stored  # salted


@pytest.mark.parametrize(
    "stored", ["", "plain", "bcrypt$1$2$3$4$5", "scrypt$x$8$1$AA==$AA==", "scrypt$1024$8$1$!$!"]
)
def test_malformed_hashes_never_verify(stored: str) -> None:
    assert not verify_password("anything", stored)


def test_generated_keys_have_the_documented_shape() -> None:
    keys = {generate_access_key() for _ in range(50)}
    assert len(keys) == 50
    assert all(re.fullmatch(r"AKIA[A-Z0-9]{16}", k) for k in keys)
    assert all(re.fullmatch(r"[A-Za-z0-9]{40}", generate_secret_key()) for _ in range(50))
    assert re.fullmatch(r"[A-Za-z0-9]{24}", generate_password())


def test_roles_are_ordered() -> None:
    assert UserRole.SUPERADMIN.includes(UserRole.ADMIN)
    assert UserRole.ADMIN.includes(UserRole.USER)
    assert UserRole.ADMIN.includes(UserRole.ADMIN)
    assert not UserRole.USER.includes(UserRole.ADMIN)
    assert not UserRole.ADMIN.includes(UserRole.SUPERADMIN)


def test_private_file_is_written_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "state" / "secret.env"
    assert write_private_file_once(path, "first\n")
    assert not write_private_file_once(path, "second\n")
    assert path.read_text() == "first\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["secret.env"]  # no temp file left


def test_secret_file(tmp_path: Path) -> None:
    first = load_or_create_secret(tmp_path / "cookie-secret")
    assert len(first) == 64
    assert load_or_create_secret(tmp_path / "cookie-secret") == first
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(BootstrapError, match="too short"):
        load_or_create_secret(tmp_path / "short")


def test_credentials_env_round_trip_and_repr_hides_secrets(tmp_path: Path) -> None:
    creds = AdminCredentials.generate("admin@example.com")
    path = tmp_path / "admin-credentials.env"
    path.write_text(creds.to_env())
    assert AdminCredentials.from_env_file(path) == creds
    assert creds.secret_key not in repr(creds)
    assert creds.password not in repr(creds)
    lines = dict(
        line.split("=", 1) for line in path.read_text().splitlines() if not line.startswith("#")
    )
    assert set(lines) == {
        "ACCELSHARE_ACCESS_KEY",
        "ACCELSHARE_SECRET_KEY",
        "ACCELSHARE_ADMIN_EMAIL",
        "ACCELSHARE_ADMIN_PASSWORD",
    }


def test_credentials_file_must_be_complete(tmp_path: Path) -> None:
    path = tmp_path / "c.env"
    path.write_text("ACCELSHARE_ACCESS_KEY=AKIA0000000000000000\n")
    with pytest.raises(BootstrapError, match="missing ACCELSHARE_SECRET_KEY"):
        AdminCredentials.from_env_file(path)
    path.write_text(
        "ACCELSHARE_ACCESS_KEY=short\nACCELSHARE_SECRET_KEY=x\n"
        "ACCELSHARE_ADMIN_EMAIL=a@b\nACCELSHARE_ADMIN_PASSWORD=p\n"
    )
    with pytest.raises(BootstrapError, match="AKIA"):
        AdminCredentials.from_env_file(path)


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()], ids=["sqlite", "pg"])
def test_resource_slot_column_stores_decimal_strings(dialect: object) -> None:
    column = ResourceSlotJSON()
    stored = column.process_bind_param(
        {"cpu": Decimal("1.50"), "mem": 1 << 30, "cuda.shares": "0.2"},
        dialect,  # type: ignore[arg-type]
    )
    assert stored == {"cpu": "1.5", "mem": "1073741824", "cuda.shares": "0.2"}
    loaded = column.process_result_value(stored, dialect)  # type: ignore[arg-type]
    assert loaded == ResourceSlot({"cpu": "1.5", "mem": 1 << 30, "cuda.shares": "0.2"})
    assert column.process_bind_param(None, dialect) is None  # type: ignore[arg-type]
    with pytest.raises(SlotValueError):
        column.process_bind_param({"cpu": "lots"}, dialect)  # type: ignore[arg-type]


def test_utc_datetime_column() -> None:
    column = UTCDateTime()
    kst = datetime(2024, 1, 2, 12, 0, tzinfo=timezone(timedelta(hours=9)))
    stored = column.process_bind_param(kst, sqlite.dialect())
    assert stored == datetime(2024, 1, 2, 3, 0)  # naive UTC for SQLite
    assert column.process_result_value(stored, sqlite.dialect()) == kst
    assert column.process_bind_param(kst, postgresql.dialect()) == kst.astimezone(UTC)
    with pytest.raises(ValueError, match="naive"):
        column.process_bind_param(datetime(2024, 1, 2), sqlite.dialect())
