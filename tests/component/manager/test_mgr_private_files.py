"""The manager's state is private: data dir 0700, SQLite files (and their WAL) 0600."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelshare.manager.db import Database
from accelshare.manager.private_files import (
    UnsafePermissions,
    ensure_private_dir,
    prepare_sqlite_file,
    secure_data_dir,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_sqlite_file_and_its_wal_are_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "manager.db"
    prepare_sqlite_file(path)
    assert (mode(path.parent), mode(path)) == (0o700, 0o600)
    conn = sqlite3.connect(path)  # SQLite creates -wal and -shm like the main file
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (secret TEXT)")
        conn.execute("INSERT INTO t VALUES ('x')")
        conn.commit()
        sides = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
        assert {p.name: oct(mode(p)) for p in sides} == {p.name: "0o600" for p in sides}
    finally:
        conn.close()


def test_existing_open_files_are_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "manager.db"
    for name in ("manager.db", "manager.db-wal", "manager.db-shm"):
        (tmp_path / name).write_bytes(b"")
        (tmp_path / name).chmod(0o664)
    caplog.set_level(logging.WARNING)
    prepare_sqlite_file(path)
    for name in ("manager.db", "manager.db-wal", "manager.db-shm"):
        assert mode(tmp_path / name) == 0o600, name
        assert f"{tmp_path / name} was open to other users (mode 0664)" in caplog.text


def test_an_existing_parent_outside_the_data_dir_is_left_alone(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    prepare_sqlite_file(tmp_path / "elsewhere.db")
    assert (mode(tmp_path), mode(tmp_path / "elsewhere.db")) == (0o755, 0o600)


def test_the_data_dir_and_its_secret_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "state"
    ensure_private_dir(data)
    assert mode(data) == 0o700
    data.chmod(0o755)
    names = ["cookie-secret", "config-store.db", "config-store.db-wal", "manager.toml"]
    for name in names:
        (data / name).write_text("x")
        (data / name).chmod(0o644)
    elsewhere = tmp_path / "admin.env"
    elsewhere.write_text("x")
    elsewhere.chmod(0o640)
    caplog.set_level(logging.WARNING)
    secure_data_dir(data, elsewhere, tmp_path / "missing")
    assert mode(data) == 0o700
    assert {n: oct(mode(data / n)) for n in names} == {
        "cookie-secret": "0o600",
        "config-store.db": "0o600",
        "config-store.db-wal": "0o600",
        "manager.toml": "0o644",  # no secret in it: not the manager's to change
    }
    assert mode(elsewhere) == 0o600
    assert f"{data} was open to other users (mode 0755)" in caplog.text
    caplog.clear()
    secure_data_dir(data, elsewhere)  # private already: nothing to say
    assert caplog.text == ""


def test_what_cannot_be_made_private_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "manager.db"
    path.write_bytes(b"")
    path.chmod(0o644)

    def refuse(target: object, _mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(os, "chmod", refuse)  # as for a file another user owns
    with pytest.raises(UnsafePermissions) as caught:
        prepare_sqlite_file(path)
    assert str(caught.value) == (
        f"{path} is open to other users (mode 0644) and cannot be made private"
        f" (Operation not permitted); change its owner or run: chmod 600 {path}"
    )


async def test_the_database_engine_creates_its_file_private(tmp_path: Path) -> None:
    db = Database.from_url(f"sqlite+aiosqlite:///{tmp_path / 'state' / 'manager.db'}")
    try:
        await db.ping()
        async with db.connect(write=True) as conn:
            await conn.exec_driver_sql("CREATE TABLE t (x TEXT)")
        files = {p.name: oct(mode(p)) for p in (tmp_path / "state").iterdir()}
    finally:
        await db.dispose()
    assert files == dict.fromkeys(("manager.db", "manager.db-wal", "manager.db-shm"), "0o600")
    assert mode(tmp_path / "state") == 0o700
