"""The manager's services that the API layer calls for what it reads and writes in the
database (docs/architecture.md, "API, services, store").

* :mod:`.admin` — users, keypairs, resource policies and scaling groups;
* :mod:`.admin_views` — the role-scoped, paged admin lists (users, keypairs, domains,
  groups, policies) and the domain and group changes (the admin GraphQL);
* :mod:`.directory` — owner and group look-ups (the compatibility GraphQL);
* :mod:`.holders` — which sessions hold which kernels (agents' maps, the agents stream);
* :mod:`.sessions` — sessions: create, look up, list, change, destroy, reach
  (:class:`~accelshare.manager.services.sessions.SessionService` and its parts).

The agents and images have theirs next to the control plane (the agent queries of
:class:`~accelshare.manager.runtime.Manager`, :class:`~accelshare.manager.images.ImageService`).
"""
