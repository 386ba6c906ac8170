"""Backend.AI-compatible request signing: the golden vector and what breaks it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from accelshare.api.signing import (
    API_VERSION,
    SigningError,
    build_authorization,
    compute_signature,
    parse_authorization,
    parse_date,
    sign_request,
    signatures_match,
    string_to_sign,
)

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GOLDEN = "feda21ce3ca66bdd86fe04c8f6558258021bc7986c90376a7dee743eafacff36"
BASE: dict[str, Any] = {
    "secret_key": SECRET_KEY,
    "method": "GET",
    "path_query": "/session",
    "date_header": "2024-01-02T03:04:05+00:00",
    "host": "127.0.0.1:8081",
    "content_type": "application/json",
    "api_version": "v8.20240915",
}


def test_golden_vector() -> None:
    assert compute_signature(**BASE) == GOLDEN
    assert compute_signature(**BASE, hash_type="sha256") == GOLDEN


def test_string_to_sign_layout() -> None:
    text = string_to_sign(**{k: v for k, v in BASE.items() if k != "secret_key"})
    assert text.split("\n") == [
        "GET",
        "/session",
        "2024-01-02T03:04:05+00:00",
        "host:127.0.0.1:8081",
        "content-type:application/json",
        "x-backendai-version:v8.20240915",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # sha256(b"")
    ]


def test_sign_request_headers_reproduce_the_vector() -> None:
    headers = sign_request(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        method="get",
        path_query="/session",
        host="127.0.0.1:8081",
        now=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        api_version="v8.20240915",
    )
    assert headers == {
        "Date": "2024-01-02T03:04:05+00:00",
        "Content-Type": "application/json",
        "X-BackendAI-Version": "v8.20240915",
        "Authorization": (f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS_KEY}:{GOLDEN}"),
    }
    assert API_VERSION == "v8.20240915"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("method", "POST", id="method"),
        pytest.param("path_query", "/sessions", id="path"),
        pytest.param("path_query", "/session?status=RUNNING", id="query-added"),
        pytest.param("date_header", "2024-01-02T03:04:06+00:00", id="date-second"),
        pytest.param("date_header", "2024-01-03T03:04:05+00:00", id="date-day"),
        pytest.param("host", "127.0.0.1:8082", id="host-port"),
        pytest.param("host", "localhost:8081", id="host-name"),
        pytest.param("content_type", "text/plain", id="content-type"),
        pytest.param("api_version", "v7.20230615", id="version"),
        pytest.param("secret_key", SECRET_KEY[:-1] + "X", id="secret"),
    ],
)
def test_tampering_changes_the_signature(field: str, value: str) -> None:
    assert compute_signature(**{**BASE, field: value}) != GOLDEN


def test_content_type_and_method_case_do_not_matter() -> None:
    assert compute_signature(**{**BASE, "content_type": "Application/JSON"}) == GOLDEN
    assert compute_signature(**{**BASE, "method": "get"}) == GOLDEN


def test_key_date_uses_the_headers_own_offset() -> None:
    """03:04 at +09:00 is 2024-01-02 there but 2024-01-01 in UTC: the key uses 20240102
    (as Backend.AI's client and server both do: strftime on the offset-aware date)."""
    kst = "2024-01-02T03:04:05+09:00"
    parsed = parse_date(kst)
    by_header = compute_signature(**{**BASE, "date_header": kst})
    assert by_header == compute_signature(**{**BASE, "date_header": kst}, date=parsed)
    assert by_header != compute_signature(
        **{**BASE, "date_header": kst}, date=parsed.astimezone(UTC)
    )


def test_other_hash_types() -> None:
    sha512 = compute_signature(**BASE, hash_type="sha512")
    assert len(sha512) == 128
    with pytest.raises(SigningError):
        compute_signature(**BASE, hash_type="md5")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param(
            f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS_KEY}:{GOLDEN}",
            ("BackendAI", "sha256", ACCESS_KEY, GOLDEN),
            id="standard",
        ),
        pytest.param(
            f"Sorna signMethod=hmac-sha512,credential={ACCESS_KEY}:ABCDEF",
            ("Sorna", "sha512", ACCESS_KEY, "abcdef"),
            id="legacy-no-space",
        ),
    ],
)
def test_parse_authorization(header: str, expected: tuple[str, str, str, str]) -> None:
    params = parse_authorization(header)
    assert (params.auth_type, params.hash_type, params.access_key, params.signature) == expected
    assert build_authorization(params.access_key, params.signature, params.hash_type).endswith(
        f"credential={params.access_key}:{params.signature}"
    )


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        pytest.param("Bearer abc", "malformed-header", id="bearer"),
        pytest.param("BackendAI", "malformed-header", id="no-params"),
        pytest.param("BackendAI signMethod=HMAC-SHA256", "malformed-header", id="no-credential"),
        pytest.param(
            f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS_KEY}",
            "malformed-header",
            id="no-sig",
        ),
        pytest.param(
            f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS_KEY}:xyz",
            "malformed-header",
            id="non-hex",
        ),
        pytest.param("BackendAI garbage", "malformed-header", id="garbage"),
        pytest.param(
            f"BackendAI signMethod=HMAC-MD5, credential={ACCESS_KEY}:{GOLDEN}",
            "unsupported-sign-method",
            id="md5",
        ),
        pytest.param(
            f"BackendAI signMethod=RSA-SHA256, credential={ACCESS_KEY}:{GOLDEN}",
            "unsupported-sign-method",
            id="rsa",
        ),
    ],
)
def test_malformed_authorization(header: str, reason: str) -> None:
    with pytest.raises(SigningError) as info:
        parse_authorization(header)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            "2024-01-02T03:04:05+00:00", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), id="iso"
        ),
        pytest.param("2024-01-02T03:04:05Z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), id="zulu"),
        pytest.param(
            "2024-01-02T03:04:05.123456+00:00",
            datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
            id="micros",
        ),
        pytest.param(
            "2024-01-02T03:04:05", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), id="naive-utc"
        ),
        pytest.param(
            "Tue, 02 Jan 2024 03:04:05 GMT", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), id="rfc1123"
        ),
    ],
)
def test_parse_date(raw: str, expected: datetime) -> None:
    assert parse_date(raw) == expected
    assert parse_date(raw).tzinfo is not None


@pytest.mark.parametrize("raw", ["", "yesterday", "2024-13-02T00:00:00Z", "02/01/2024"])
def test_parse_date_refuses_junk(raw: str) -> None:
    with pytest.raises(SigningError) as info:
        parse_date(raw)
    assert info.value.reason == "malformed-date"


def test_signatures_match_is_case_insensitive() -> None:
    assert signatures_match(GOLDEN, GOLDEN.upper())
    assert not signatures_match(GOLDEN, GOLDEN[:-1] + "0")


def test_signing_module_is_pure() -> None:
    import subprocess
    import sys

    code = (
        "import sys, accelshare.api.signing\n"
        "bad = [m for m in ('socket', 'asyncio', 'fastapi', 'httpx', 'sqlalchemy') "
        "if m in sys.modules]\nprint(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
