"""The apps origin's tokens and how it recognises its requests (api/app_origin.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from accelshare.api.app_origin import AppOrigin, AppTokenError, HandOff
from accelshare.manager.config import AppsConfig

SID = "4f0c2d4e-1111-4222-8333-944455556666"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def origin(clock: Clock, **kwargs: object) -> AppOrigin:
    return AppOrigin.from_secret(b"s" * 32, clock=clock, token_ttl_s=30, **kwargs)  # type: ignore[arg-type]


def handoff(path: str = f"/session/{SID}/apps/web/") -> HandOff:
    return HandOff(SID, "AKIAOWNER", "user-1", path)


async def test_hand_off_once_within_its_ttl() -> None:
    clock = Clock()
    apps = origin(clock)
    token = apps.hand_off(handoff())
    assert await apps.redeem(token) == handoff()
    with pytest.raises(AppTokenError, match="already used"):
        await apps.redeem(token)
    late = apps.hand_off(handoff())
    clock.now += 31
    with pytest.raises(AppTokenError, match="expired"):
        await apps.redeem(late)


async def test_forged_or_foreign_tokens_are_refused() -> None:
    clock = Clock()
    apps = origin(clock)
    token = apps.hand_off(handoff())
    body, _, mac = token.partition(".")
    with pytest.raises(AppTokenError, match="bad signature"):
        await apps.redeem(f"{body}.{mac[:-2]}AA")
    other_key = AppOrigin.from_secret(b"t" * 32, clock=clock)
    with pytest.raises(AppTokenError, match="bad signature"):
        await other_key.redeem(token)
    with pytest.raises(AppTokenError, match="malformed"):
        await apps.redeem("nonsense")
    # A cookie is not a hand-off token, nor the other way round.
    cookie = apps.cookie_value(handoff())
    with pytest.raises(AppTokenError, match="kind"):
        await apps.redeem(cookie)
    with pytest.raises(AppTokenError, match="kind"):
        apps.read_cookie(token, SID)
    # A hand-off cannot send the browser outside its session's apps.
    outside = apps.hand_off(handoff("/sessions"))
    with pytest.raises(AppTokenError, match="malformed"):
        await apps.redeem(outside)


def test_cookie_for_one_session_until_it_expires() -> None:
    clock = Clock()
    apps = origin(clock, cookie_max_age_s=60)
    cookie = apps.cookie_value(handoff())
    assert apps.read_cookie(cookie, SID.upper()) == ("AKIAOWNER", "user-1", None)
    with pytest.raises(AppTokenError, match="another session"):
        apps.read_cookie(cookie, "00000000-0000-0000-0000-000000000000")
    clock.now += 61
    with pytest.raises(AppTokenError, match="expired"):
        apps.read_cookie(cookie, SID)


async def test_the_login_generation_travels_from_hand_off_to_cookie() -> None:
    """Handed off from a console login: its generation reaches the app cookie (the
    manager refuses the cookie once that login has ended); a forged one is malformed."""
    clock = Clock()
    apps = origin(clock)
    from_login = HandOff(SID, "AKIAOWNER", "user-1", f"/session/{SID}/apps/web/", 3)
    redeemed = await apps.redeem(apps.hand_off(from_login))
    assert redeemed == from_login
    assert apps.read_cookie(apps.cookie_value(redeemed), SID) == ("AKIAOWNER", "user-1", 3)
    for bad in ("3", True, 1.5):
        forged = apps._sign(
            {"k": "c", "sid": SID, "ak": "AKIAOWNER", "uid": "u", "g": bad, "exp": 2e6}
        )
        with pytest.raises(AppTokenError, match="malformed"):
            apps.read_cookie(forged, SID)


def _scope(host: str, server_port: int = 8081) -> dict[str, object]:
    return {"type": "http", "headers": [(b"host", host.encode())], "server": ("x", server_port)}


def test_requests_of_the_apps_origin_by_listener_or_host_name() -> None:
    clock = Clock()
    by_port = origin(clock, listen_port=8091)
    assert by_port.matches(_scope("127.0.0.1:8091", 8091))
    assert not by_port.matches(_scope("127.0.0.1:8081", 8081))
    by_name = origin(clock, origin="https://apps.example.com")
    assert by_name.matches(_scope("apps.example.com"))
    assert by_name.matches(_scope("APPS.example.com:443"))
    assert not by_name.matches(_scope("console.example.com"))


def test_config_section() -> None:
    assert not AppsConfig().isolated
    # The hand-off's origin is configured, never taken from a request's Host header:
    # listen-addr's own address, else origin (required with a wildcard address).
    local = AppsConfig.model_validate({"listen-addr": "127.0.0.1:8091"})
    assert (local.isolated, local.public_origin) == (True, "http://127.0.0.1:8091")
    assert AppsConfig.model_validate({"listen-addr": "[::1]:8091"}).public_origin == (
        "http://[::1]:8091"
    )
    for wildcard in ("0.0.0.0:8091", "[::]:8091"):
        with pytest.raises(ValidationError, match="origin: required with listen-addr"):
            AppsConfig.model_validate({"listen-addr": wildcard})
    both = AppsConfig.model_validate(
        {"listen-addr": "0.0.0.0:8091", "origin": "https://apps.example.com"}
    )
    assert both.public_origin == "https://apps.example.com"
    assert AppsConfig().public_origin is None
    section = AppsConfig.model_validate({"origin": "HTTPS://Apps.Example.com/"})
    assert section.origin == "https://apps.example.com"
    for bad in ("apps.example.com", "https://apps.example.com/x", "ftp://a", "https://u@a"):
        with pytest.raises(ValueError, match="expected an origin"):
            AppsConfig.model_validate({"origin": bad})
    with pytest.raises(ValueError, match="host:port"):
        AppsConfig.model_validate({"listen-addr": "8091"})
