"""accelshare's test kit: the fakes and throwaway servers that its tests and benchmarks
share.  It lives next to the product in ``src/`` but is no part of it: the wheel holds
only :mod:`accelshare`, and no module of :mod:`accelshare` imports this package.  A
source checkout has it on the path (``make venv``'s editable install, or
``PYTHONPATH=src``).

* :mod:`.hollow_agent` — in-process fake agents with real allocation maps (the
  manager's component tests, ``bench/sched_bench.py``);
* :mod:`.servers`, :mod:`.etcd_server`, :mod:`.redis_server` — throwaway etcd and Redis
  servers on free loopback ports;
* :mod:`.netns` — test hosts in network namespaces joined by veth links;
* :mod:`.multihost` — a whole production-shaped cluster on such hosts (PostgreSQL, etcd,
  Redis and the manager on one, agents on others);
* :mod:`.soak` — the soak run and its verdict (leaks, leftovers);
* :mod:`.gpu`, :mod:`.fake_mps` — what ``nvidia-smi`` reports, and a fake MPS control
  daemon that records its calls;
* :mod:`.terminal`, :mod:`.waiting` — a web terminal's screen, and polling until a
  condition holds.
"""
