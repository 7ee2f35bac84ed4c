"""The call rate limiter shared by every door (fake clock)."""

import pytest

from duplex.edge.rate import (
    UNCOUNTED,
    CallRate,
    DoorAdmission,
    PendingCalls,
    RateConfig,
    RateLimited,
    exempt,
    is_loopback,
    source_of,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_source_gets_its_burst_then_waits_its_rate() -> None:
    clock = Clock()
    rate = CallRate(RateConfig(per_source=60, source_burst=3), "webrtc", clock)
    for _ in range(3):
        rate.check("10.0.0.1")
    with pytest.raises(RateLimited) as refused:
        rate.check("10.0.0.1")
    assert 0 < refused.value.retry_after_s <= 1.0 and refused.value.retry_after == 1
    rate.check("10.0.0.2")  # another source is untouched
    clock.now += 1.0  # one token a second
    rate.check("10.0.0.1")
    with pytest.raises(RateLimited):
        rate.check("10.0.0.1")


def test_the_door_total_caps_many_sources_without_charging_the_source() -> None:
    clock = Clock()
    rate = CallRate(RateConfig(per_source=60, source_burst=2, total=60, total_burst=4), "sip", clock)
    for n in range(4):
        rate.check(f"10.0.0.{n}")
    with pytest.raises(RateLimited, match="for the server"):
        rate.check("10.0.0.9")
    assert rate.refused == {"source": 0, "total": 1}
    clock.now += 2.0  # two tokens for the door; the source still has its burst of two
    rate.check("10.0.0.9")
    rate.check("10.0.0.9")  # its refused attempt did not spend its burst


def test_the_source_table_is_bounded() -> None:
    rate = CallRate(RateConfig(max_sources=16, total=1e6, total_burst=10**6), "ws", Clock())
    for n in range(1000):
        rate.check(f"10.{n // 256}.{n % 256}.1")
    assert rate.stats()["sources"] == 16


def test_an_ipv6_source_is_its_64_and_a_mapped_ipv4_is_the_ipv4() -> None:
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:10.0.0.1") == "10.0.0.1" == source_of("10.0.0.1")
    rate = CallRate(RateConfig(per_source=60, source_burst=2, total=1e6, total_burst=10**6), "webrtc", Clock())
    rate.check("2001:db8:1:2::1")
    rate.check("2001:db8:1:2::2")
    with pytest.raises(RateLimited):  # a fresh address in the same /64 is the same source
        rate.check("2001:db8:1:2::3")


def test_the_default_burst_never_exceeds_the_sessions_unless_set() -> None:
    assert RateConfig().source_burst > 4
    assert CallRate(RateConfig(), "webrtc", Clock(), max_sessions=4).source_burst == 4
    assert CallRate(RateConfig(source_burst=9), "webrtc", Clock(), max_sessions=4).source_burst == 9  # as asked


def test_a_source_holds_at_most_its_share_of_unconnected_calls() -> None:
    pending = PendingCalls(RateConfig().pending_cap(8), "WebRTC", retry_after_s=5.0)
    assert pending.cap == 2
    first, second = pending.admit("10.0.0.1"), pending.admit("10.0.0.1")
    with pytest.raises(RateLimited) as refused:
        pending.admit("10.0.0.1")
    assert refused.value.retry_after == 5 and "have not connected" in str(refused.value)
    pending.admit("10.0.0.2")  # another source has its own share
    first.release()
    first.release()  # a second release counts nothing
    assert pending.held("10.0.0.1") == 1
    pending.admit("10.0.0.1")
    assert pending.stats() == {"cap": 2, "pending": 3, "sources": 2, "refused": 1}
    second.release()
    assert pending.held("10.0.0.1") == 1
    assert RateConfig(pending_share=0.01).pending_cap(8) == 1  # at least one call


def test_admission_caps_before_the_rate_and_lets_loopback_pass_unless_limited() -> None:
    config = RateConfig(per_source=60, source_burst=3, total=1e6, total_burst=10**6)
    door = DoorAdmission(config, "WebRTC", max_sessions=8, connect_deadline_s=5.0, clock=Clock())
    held = [door.admit("10.0.0.1"), door.admit("10.0.0.1")]
    for _ in range(5):  # refused by the cap: no rate token is spent on them
        with pytest.raises(RateLimited):
            door.admit("10.0.0.1")
    assert door.rate.refused["source"] == 0 and door.pending.refused == 5
    held[0].release()
    door.admit("10.0.0.1")  # the third token of the burst
    assert all(door.admit("127.0.0.1") is UNCOUNTED for _ in range(20))  # the host's own tools
    strict = DoorAdmission(config, "WebRTC", max_sessions=8, connect_deadline_s=5.0, limit_loopback=True,
                           clock=Clock())
    strict.admit("127.0.0.2"), strict.admit("127.0.0.2")
    with pytest.raises(RateLimited):
        strict.admit("127.0.0.2")


def test_one_loopback_rule_for_every_door() -> None:
    for host in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(host) and exempt(host, limit_loopback=False) and not exempt(host, limit_loopback=True)
    for host in ("192.0.2.1", "::ffff:192.0.2.1", "localhost", "unknown", ""):
        assert not is_loopback(host) and not exempt(host, limit_loopback=False)
