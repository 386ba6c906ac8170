"""Failed password logins, counted per client address and per account (``[api.login]``).

Three sliding windows of ``window`` seconds; a login is refused with 429 and
``Retry-After`` while one of them holds its limit of failures:

* ``max-failures-per-account-address``: one account from one address (a guesser);
* ``max-failures-per-address``: one address, any accounts (a sprayer);
* ``max-failures-per-account``: one account from all addresses (a distributed guesser),
  except from an address where the account logged in successfully before (the
  account's known addresses, the last :data:`KNOWN_ADDRESSES` of them): an attacker
  cannot lock its owner out of the address it uses.

Refused attempts are not counted and their password is not checked, so a lockout ends
at most ``window`` seconds after the failures that reached the limit, whatever the
attacker keeps sending.  A successful login clears its account's failures (not the
address's).  The state is in memory, per manager replica (a restart clears it).
Unknown emails are counted like known ones, so throttling does not reveal which
accounts exist.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KNOWN_ADDRESSES", "LoginThrottle", "Refusal", "ThrottleSettings"]

KNOWN_ADDRESSES = 8
MAX_KEYS = 100_000  # counters kept at most (the oldest are forgotten beyond)


@dataclass(frozen=True, slots=True)
class ThrottleSettings:
    window_s: float = 300.0
    max_per_address: int = 30
    max_per_account_address: int = 5
    max_per_account: int = 50


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a login is refused now: the limit's config key, its value, when to retry."""

    limit: str
    value: int
    retry_after_s: int
    scope: str  # "this account from this address", ...


class LoginThrottle:
    def __init__(
        self,
        settings: ThrottleSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.settings = settings or ThrottleSettings()
        self.clock = clock
        self.max_keys = max_keys
        self._failures: OrderedDict[tuple[str, ...], deque[float]] = OrderedDict()
        self._known: dict[str, OrderedDict[str, None]] = {}

    def _limits(self, account: str, address: str) -> list[tuple[tuple[str, ...], str, int, str]]:
        s = self.settings
        limits = [
            (
                ("account-address", account, address),
                "max-failures-per-account-address",
                s.max_per_account_address,
                "this account from this address",
            ),
            (("address", address), "max-failures-per-address", s.max_per_address, "this address"),
        ]
        if address not in self._known.get(account, ()):
            limits.append(
                (
                    ("account", account),
                    "max-failures-per-account",
                    s.max_per_account,
                    "this account",
                )
            )
        return limits

    def check(self, account: str, address: str) -> Refusal | None:
        """None when a login may be tried now; else the refusal with the longest wait."""
        now = self.clock()
        worst: Refusal | None = None
        for key, limit, value, scope in self._limits(account, address):
            failures = self._failures.get(key)
            if failures is None or len(failures) < value:
                continue
            wait = failures[-value] + self.settings.window_s - now
            if wait > 0 and (worst is None or wait > worst.retry_after_s):
                worst = Refusal(limit, value, max(1, math.ceil(wait)), scope)
        return worst

    def failed(self, account: str, address: str) -> None:
        now = self.clock()
        for key, _limit, value, _scope in self._limits(account, address):
            failures = self._failures.get(key)
            if failures is None or failures.maxlen != value:
                failures = deque(failures or (), maxlen=value)
            failures.append(now)
            self._failures[key] = failures
            self._failures.move_to_end(key)
        self._forget(now)

    def succeeded(self, account: str, address: str) -> None:
        self._failures.pop(("account-address", account, address), None)
        self._failures.pop(("account", account), None)
        known = self._known.setdefault(account, OrderedDict())
        known[address] = None
        known.move_to_end(address)
        while len(known) > KNOWN_ADDRESSES:
            known.popitem(last=False)
        if len(self._known) > self.max_keys:
            self._known.pop(next(iter(self._known)))

    def _forget(self, now: float) -> None:
        """Beyond ``max_keys`` counters, drop those whose last failure left the window,
        then the least recently failed."""
        if len(self._failures) <= self.max_keys:
            return
        horizon = now - self.settings.window_s
        for key in [k for k, f in self._failures.items() if f[-1] <= horizon]:
            del self._failures[key]
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)
