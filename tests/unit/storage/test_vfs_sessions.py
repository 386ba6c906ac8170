"""Upload sessions on disk: kept across restarts, swept once expired."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from accelshare.storage.vfs import Volume


def test_expired_sessions_are_swept_with_their_partial_files(tmp_path: Path) -> None:
    volume = Volume("v", tmp_path)
    volume.prepare()
    fid = uuid.uuid4().hex
    volume.create_folder(fid, None)
    session = volume.start_upload(fid, "a/b.bin", 10, ttl_s=60)
    assert (volume.folder_path(fid) / "a").is_dir()  # parents made at the request
    again = Volume("v", tmp_path)  # a restarted proxy finds it
    assert again.load_session(session.session) == session
    assert again.sweep_uploads(now=time.time()) == 0
    assert again.sweep_uploads(now=session.expires + 1) == 1
    assert again.load_session(session.session) is None
    assert list(volume.uploads.iterdir()) == []


def test_deleting_a_folder_drops_its_uploads(tmp_path: Path) -> None:
    volume = Volume("v", tmp_path)
    volume.prepare()
    fid = uuid.uuid4().hex
    volume.create_folder(fid, 100)
    volume.start_upload(fid, "x", 10, ttl_s=60)
    volume.delete_folder(fid)
    assert list(volume.uploads.iterdir()) == []
    assert volume.quota(fid) is None
    assert not volume.folder_path(fid).exists()
