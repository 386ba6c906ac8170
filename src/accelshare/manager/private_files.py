"""Who may read the manager's state: its data dir is 0700, its secret-holding files 0600.

The manager's SQLite database holds every keypair's secret key in plain text, the
data dir holds the cookie and cluster secrets and the superadmin's credentials, and
the embedded config store lives there too.  With the usual umask (022) a directory or
a SQLite file would be created readable by every local user, so:

* :func:`ensure_private_dir` creates a directory 0700, or takes group/other access
  away from an existing one (with a warning naming it and its old mode);
* :func:`prepare_sqlite_file` creates a SQLite database file 0600 *before* SQLite
  opens it, and tightens an existing one and its ``-wal`` / ``-shm`` / ``-journal``
  files.  SQLite's unix VFS creates those side files with the database file's own
  permission bits, whatever the umask, so a private main file keeps them private;
* :func:`secure_data_dir` runs at every start (from :func:`~.bootstrap.bootstrap`):
  the data dir and the files in it that hold secrets (the secret files and every
  SQLite file, the embedded config store's included) lose any group/other access,
  each change logged as a warning.

Worked example (umask 022, a fresh ``./.accelshare``)::

    prepare_sqlite_file(Path(".accelshare/manager.db"))
    # .accelshare      drwx------  (created 0700)
    # manager.db       -rw-------  (created 0600; SQLite adds -wal and -shm as 0600)

A file or directory that cannot be made private (another owner) is an error: the
manager refuses to start rather than serve from state other users can read.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SECRET_FILE_NAMES",
    "SQLITE_SIDE_SUFFIXES",
    "UnsafePermissions",
    "ensure_private_dir",
    "prepare_sqlite_file",
    "secure_data_dir",
    "tighten",
]

log = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_GROUP_OTHER = 0o077
SQLITE_SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
SECRET_FILE_NAMES = frozenset({"admin-credentials.env", "cookie-secret", "cluster-secret"})
_SQLITE_SUFFIXES = (".db", *(".db" + side for side in SQLITE_SIDE_SUFFIXES))


class UnsafePermissions(PermissionError):
    """A path holding secrets is open to other users and cannot be made private."""


def tighten(path: Path) -> bool:
    """Take group and other access away from ``path``; True when its mode changed.

    The owner's bits are kept as they are (a 0644 file becomes 0600, a 0755
    directory 0700).  A missing path is left alone (False).
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return False
    if not mode & _GROUP_OTHER:
        return False
    private = mode & ~_GROUP_OTHER
    try:
        os.chmod(path, private)
    except OSError as e:
        raise UnsafePermissions(
            f"{path} is open to other users (mode {mode:04o}) and cannot be made private"
            f" ({e.strerror}); change its owner or run: chmod {private:o} {path}"
        ) from e
    log.warning(
        "%s was open to other users (mode %04o); it holds manager secrets, made it %04o",
        path,
        mode,
        private,
    )
    return True


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the last component 0700, or tighten it."""
    try:
        path.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
    except FileExistsError:
        tighten(path)
        return
    # mkdir's mode is masked by the umask; set it exactly (an odd umask may drop u+x).
    os.chmod(path, PRIVATE_DIR_MODE)


def prepare_sqlite_file(path: Path) -> None:
    """Make ``path`` a 0600 SQLite file before it is opened (see the module docstring).

    A missing parent directory is created 0700; an existing one is left as it is (it
    may not be the manager's: :func:`secure_data_dir` handles the data dir).  A missing
    database file is created empty (SQLite reads an empty file as an empty database);
    an existing one and its side files are tightened, with a warning.
    """
    if not path.parent.exists():
        ensure_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        finally:
            os.close(fd)
    for candidate in (path, *(path.with_name(path.name + s) for s in SQLITE_SIDE_SUFFIXES)):
        tighten(candidate)


def _holds_secrets(name: str) -> bool:
    return name in SECRET_FILE_NAMES or name.endswith(_SQLITE_SUFFIXES)


def secure_data_dir(data_dir: Path, *extra_files: Path) -> None:
    """At start: the data dir 0700, its secret-holding files (and ``extra_files``,
    e.g. a credentials file configured elsewhere) without group/other access."""
    ensure_private_dir(data_dir)
    for path in sorted(data_dir.iterdir()):
        if _holds_secrets(path.name) and path.is_file():
            tighten(path)
    for path in extra_files:
        tighten(path)
