"""The call rate limiter shared by every door (fake clock)."""

import pytest

from duplex.edge.rate import CallRate, RateConfig, RateLimited, exempt, is_loopback


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


def test_one_loopback_rule_for_every_door() -> None:
    for host in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(host) and exempt(host, limit_loopback=False) and not exempt(host, limit_loopback=True)
    for host in ("192.0.2.1", "::ffff:192.0.2.1", "localhost", "unknown", ""):
        assert not is_loopback(host) and not exempt(host, limit_loopback=False)
