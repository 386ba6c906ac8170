"""The storage proxy: volumes (a ``vfs`` backend on a directory), folders, tus uploads,
downloads and file operations, for the manager and for clients (docs/storage.md).

The contract is :mod:`accelshare.protocol.storage`; :mod:`.app` serves it,
:mod:`.vfs` keeps the bytes, :mod:`.paths` keeps every path inside its folder,
:mod:`.tokens` signs the clients' transfer tokens.
"""
