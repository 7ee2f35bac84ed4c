"""The doors' rules one by one (issue 15): which Host names and Origins are served, the bounded
log, what stats hide, the Location's token, and one call-length setting for both doors. The
same rules against a real server: tests/test_edge_doors.py."""

from __future__ import annotations

import logging

import pytest

from duplex.edge.config import EdgeConfig
from duplex.edge.http.auth import KEY, OPEN
from duplex.edge.http.guard import HostPolicy, _split_host
from duplex.edge.http.protocol import BoundedLog
from duplex.edge.http.stats_view import detail_allowed, redact
from duplex.edge.webrtc.gateway import call_path_id, split_path_id


def test_host_names_that_cannot_be_rebound_are_served_and_others_only_when_allowed():
    default = HostPolicy(EdgeConfig())
    for host in ("127.0.0.1", "::1", "10.1.2.3", "localhost", "app.localhost"):
        assert default.host_allowed(host), host
    for host in ("attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io"):
        assert not default.host_allowed(host), host
    named = HostPolicy(EdgeConfig(host="voice.lan", allowed_hosts=["voice.example.org", "*.corp.example"]))
    assert named.host_allowed("voice.lan") and named.host_allowed("voice.example.org")
    assert named.host_allowed("a.corp.example") and not named.host_allowed("corp.example.evil")
    assert HostPolicy(EdgeConfig(allowed_hosts=["*"])).host_allowed("anything.example")
    assert _split_host("[::1]:8000") == ("::1", "8000") and _split_host("Example.org:80") == ("example.org", "80")
    assert _split_host("::1") == ("::1", "")


def test_origins_are_the_servers_own_or_listed():
    policy = HostPolicy(EdgeConfig(allowed_origins=["https://app.example.org/"]))
    assert policy.origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert policy.origin_allowed("https://app.example.org", "127.0.0.1:8000")
    assert not policy.origin_allowed("http://127.0.0.1:9000", "127.0.0.1:8000")  # another port: another origin
    assert not policy.origin_allowed("null", "127.0.0.1:8000")
    assert not policy.origin_allowed("http://attacker.example", "127.0.0.1:8000")


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, None)


def test_the_bounded_log_lets_each_message_through_a_few_times_a_window():
    now = [0.0]
    bounded = BoundedLog(per_window=3, window_s=60.0, clock=lambda: now[0])
    passed = [bounded.filter(_record("socket.accept() out of system resource")) for _ in range(1000)]
    assert sum(passed) == 3 and bounded.suppressed == 997
    assert bounded.filter(_record("another message"))  # counted apart
    now[0] = 61.0
    record = _record("socket.accept() out of system resource")
    assert bounded.filter(record) and "997 more like this" in record.getMessage()


def test_stats_without_detail_keep_counts_and_drop_identifiers():
    view = {"stages": {"asr": {"pid": 4242, "live_requests": 1, "request_ids": ["r1"]}},
            "rate": {"refused": {"source": 3, "total": 0}},
            "sessions": {"live": 1, "sessions": {"sess_ab": {"transport": "sip", "state": "idle",
                                                              "request_id": "r1"}}},
            "edges": {"sip": {"calls": 1, "active": {"a84b4c76e66710@pc33": {"state": "confirmed",
                                                                             "remote": "192.0.2.7:5060"}}}}}
    hidden = redact(view)
    assert hidden == {"stages": {"asr": {"live_requests": 1}}, "rate": {"refused": {"source": 3, "total": 0}},
                      "sessions": {"live": 1, "sessions": {"1": {"transport": "sip", "state": "idle"}}},
                      "edges": {"sip": {"calls": 1, "active": {"1": {"state": "confirmed"}}}}}


@pytest.mark.parametrize(("wanted", "credential", "keyed", "client", "shown"), [
    (False, KEY, True, "127.0.0.1", False),
    (True, KEY, True, "192.0.2.7", True),
    (True, OPEN, True, "127.0.0.1", False),  # a keyed server shows ids to the key only
    (True, OPEN, False, "127.0.0.1", True),  # no key: the host's own tools
    (True, OPEN, False, "192.0.2.7", False),
    (True, OPEN, False, None, False),
])
def test_detail_needs_the_key_or_the_host_itself(wanted, credential, keyed, client, shown):
    assert detail_allowed(wanted, credential, keyed, client) is shown


def test_the_location_carries_the_calls_token():
    public, token = "rtc_" + "a" * 32, "b" * 32
    assert split_path_id(call_path_id(public, token)) == (public, token)
    assert split_path_id(public) == (public, "")
    assert split_path_id("rtc_unknown") == ("rtc_unknown", "")


def test_one_call_length_serves_both_doors():
    assert EdgeConfig().max_call_s == 3600 and EdgeConfig().realtime.max_session_s == 3600
    assert EdgeConfig(max_call_s=30).realtime.max_session_s == 30
    from_ws_flag = EdgeConfig(realtime={"max_session_s": 3})
    assert from_ws_flag.max_call_s == 3 and from_ws_flag.realtime.max_session_s == 3
    assert EdgeConfig().connect_timeout_s == 5.0
