"""The etcd backend's gRPC channel options (keepalive); no server needed."""

from __future__ import annotations

import pytest

from accelshare.config.etcd import (
    DEFAULT_KEEPALIVE_TIME_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    EtcdBackend,
    channel_options,
)


def test_keepalive_options() -> None:
    options = channel_options(10, 2.5)
    assert options["grpc.keepalive_time_ms"] == 10_000
    assert options["grpc.keepalive_timeout_ms"] == 2_500
    assert options["grpc.http2.ping_timeout_ms"] == 2_500
    # Pings during a long, silent watch must not stop after gRPC's default of two.
    assert options["grpc.http2.max_pings_without_data"] == 0
    # etcd refuses pings on a connection without streams.
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert options["grpc.max_receive_message_length"] == 256 * 1024 * 1024


def test_default_interval_respects_etcds_minimum() -> None:
    # etcd's --grpc-keepalive-min-time defaults to 5 s; pinging more often gets GOAWAY.
    assert DEFAULT_KEEPALIVE_TIME_S > 5
    assert 0 < DEFAULT_KEEPALIVE_TIMEOUT_S <= DEFAULT_KEEPALIVE_TIME_S


@pytest.mark.parametrize(("time_s", "timeout_s"), [(0, 5), (10, 0), (-1, 5)])
def test_keepalive_must_be_positive(time_s: float, timeout_s: float) -> None:
    with pytest.raises(ValueError, match="expected keepalive_time_s > 0") as info:
        channel_options(time_s, timeout_s)
    assert f"received {time_s!r} and {timeout_s!r}" in str(info.value)
    with pytest.raises(ValueError, match="keepalive"):
        EtcdBackend(keepalive_time_s=time_s, keepalive_timeout_s=timeout_s)
