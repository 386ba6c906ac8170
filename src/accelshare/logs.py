"""Log output of the daemons (:mod:`accelshare.agent.serve`, :mod:`accelshare.api.serve`,
run by ``accelshare server agent|manager``): text lines, or with ``--json`` one JSON
object per record for log collectors::

    {"at": "2030-01-01T09:00:00.123+00:00", "level": "INFO",
     "logger": "accelshare.agent.daemon", "message": "agent i-dev-01: RPC listening ..."}
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["CHATTY_LOGGERS", "LOG_LEVELS", "JsonLogFormatter", "configure_logging"]

LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


# The HTTP client's per-request lines ("HTTP Request: POST .../heartbeat 200"): every
# heartbeat, event post and agent RPC, thousands a minute on a busy cluster, and a few per
# cent of a daemon's CPU.  Shown at debug only, like the servers' access logs (off).
CHATTY_LOGGERS = ("httpx", "httpcore")


def configure_logging(level: str, *, as_json: bool = False) -> None:
    """The root logger at ``level`` (one of :data:`LOG_LEVELS`), to stderr; the HTTP
    client's per-request lines only at ``debug``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if level.lower() == "debug" else logging.WARNING
        )
