"""Transfer tokens: signed, for one operation, expiring."""

from __future__ import annotations

import time

import pytest

from accelshare.protocol.storage import StorageErrorType
from accelshare.storage.errors import StorageError
from accelshare.storage.tokens import TokenClaims, TokenSigner

# a day ahead: the module is imported when the suite is collected, which can be minutes
# before these tests run
CLAIMS = TokenClaims(
    op="upload", volume="v", folder_id="a" * 32, path="x.bin", size=3, session="s1",
    exp=time.time() + 86400,
)  # fmt: skip


def test_a_token_round_trips() -> None:
    signer = TokenSigner("secret-secret-secret")
    assert signer.verify(signer.issue(CLAIMS), op="upload") == CLAIMS


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), "bad signature"),
        (lambda t: "v2" + t[2:], "another form"),
        (lambda t: "garbage", "another form"),
        (lambda t: "", "received nothing"),
    ],
)
def test_a_bad_token_is_refused(mangle, message: str) -> None:  # type: ignore[no-untyped-def]
    signer = TokenSigner("secret-secret-secret")
    with pytest.raises(StorageError, match=message) as caught:
        signer.verify(mangle(signer.issue(CLAIMS)), op="upload")
    assert caught.value.type is StorageErrorType.BAD_TOKEN
    assert caught.value.status == 403


def test_another_proxys_token_is_refused() -> None:
    token = TokenSigner("another-secret-value").issue(CLAIMS)
    with pytest.raises(StorageError, match="bad signature"):
        TokenSigner("secret-secret-secret").verify(token, op="upload")


def test_a_token_for_another_operation_is_refused() -> None:
    signer = TokenSigner("secret-secret-secret")
    with pytest.raises(StorageError, match="for 'download', received one for 'upload'"):
        signer.verify(signer.issue(CLAIMS), op="download")


def test_an_expired_token_is_refused() -> None:
    signer = TokenSigner("secret-secret-secret")
    token = signer.issue(CLAIMS)
    with pytest.raises(StorageError, match="expired"):
        signer.verify(token, op="upload", now=CLAIMS.exp + 1)
