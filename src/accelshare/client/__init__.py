"""Client side: the SDK and the ``accelshare`` command line.

SDK::

    from accelshare.client import AccelshareClient, SyncAccelshareClient

    async with AccelshareClient.from_env() as client:
        created = await client.sessions.create("python", resources={"cuda.shares": "0.5"})

``client.sessions`` (create/get/list/destroy/logs/why/events/wait), ``client.agents``
(list/get/alloc_map/alloc_map_compat), ``client.config`` (resource slots and their UI
metadata), ``client.admin`` (users, keypairs, policies, scaling groups, config tree),
``client.query`` (GraphQL).  See docs/cli.md.
"""

from .client import AccelshareClient
from .config import ClientConfig, ClientConfigError, load_client_config
from .errors import APIError, ClientError, ConnectionFailed, GraphQLError
from .sync import SyncAccelshareClient

__all__ = [
    "APIError",
    "AccelshareClient",
    "ClientConfig",
    "ClientConfigError",
    "ClientError",
    "ConnectionFailed",
    "GraphQLError",
    "SyncAccelshareClient",
    "load_client_config",
]
