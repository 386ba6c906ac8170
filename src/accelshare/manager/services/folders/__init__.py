"""Storage folders (Backend.AI's vfolders) for the ``/folders`` routes and session mounts.

:class:`FolderService` is the one object the API and the manager call.  It is assembled
from parts that each hold one idea:

* :mod:`.names` — folder names, paths inside a folder, a session's mount specs (pure
  checks);
* :mod:`.access` — who may use a folder, how a request names one, the state every part
  shares;
* :mod:`.crud` — storage hosts; folders created, listed, described and renamed, within
  the caller's resource policy; their options (permission, cloneable) changed;
* :mod:`.trash` — deleting to the trash, restoring, purging (by hand and by age);
* :mod:`.clone` — a copy of a folder as a new folder of the caller's;
* :mod:`.sharing` — invitations to user folders, shares of project folders, leaving;
  the shares of the folders one manages, listed and changed;
* :mod:`.ownership` — a user folder given to another user (a superadmin's act);
* :mod:`.files` — the files inside a folder, through its storage proxy;
* :mod:`.mounts` — the folders a new session mounts.
"""

from __future__ import annotations

from .clone import FolderCloning
from .crud import FolderCrud
from .files import FolderFiles
from .mounts import FolderMounts
from .ownership import FolderOwnership
from .sharing import FolderSharing
from .trash import FolderTrash

__all__ = ["FolderService"]


class FolderService(
    FolderCloning,
    FolderOwnership,
    FolderCrud,
    FolderTrash,
    FolderSharing,
    FolderFiles,
    FolderMounts,
):
    """Every folder operation, on one object (``Manager.folders``)."""
