"""Test infrastructure shipped with accelshare (used by its tests and benchmarks, and
useful to operators who want to try a multi-host setup on one machine):

* :mod:`.netns` — test hosts in network namespaces joined by veth links;
* :mod:`.multihost` — a whole production-shaped cluster on such hosts (PostgreSQL, etcd,
  Redis and the manager on one, agents on others).
"""
