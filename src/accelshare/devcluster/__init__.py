"""The one-command local cluster (``accelshare dev up``) and the demo tour.

A manager and N agents run as child processes on this machine with the embedded
database (SQLite), the embedded config store, the process runtime and the mock
accelerator; see :mod:`.layout` for the files and :mod:`.cluster` for the start order.
"""

from .cluster import ClusterStartError, LocalCluster, free_port, resolve_mock_config
from .layout import ClusterLayout, DevClusterOptions

__all__ = [
    "ClusterLayout",
    "ClusterStartError",
    "DevClusterOptions",
    "LocalCluster",
    "free_port",
    "resolve_mock_config",
]
