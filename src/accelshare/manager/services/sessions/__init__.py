"""Sessions (spec 05, 07): the session service and its parts.

* :mod:`.service` — :class:`SessionService`, the one object the API and the other
  manager modules call; it holds the parts below;
* :mod:`.spec` — the request as the service takes it (:class:`SessionRequest`) and
  its pure checks (:func:`resolve_resources`, names, start times, app ports);
* :mod:`.views` — the JSON shapes (:func:`session_json`) and who sees which session;
* :mod:`.reads` — look-ups by id or name, get, lists, status history, logs, why a
  session waits, status events;
* :mod:`.admission` — create: the checks and the enqueue (PENDING);
* :mod:`.group_agents` — the scaling group's agents as admission judges a request:
  their quanta and images, and whether one could ever hold it (:class:`EmptyTrialMaps`);
* :mod:`.lifecycle` — destroy, rename, modify (name, priority), restart;
* :mod:`.reach` — where a running session's terminal and apps live (:class:`ProxyTarget`).
"""

from .admission import CreateResult
from .reach import ProxyTarget
from .service import SessionService
from .views import session_json

__all__ = ["CreateResult", "ProxyTarget", "SessionService", "session_json"]
