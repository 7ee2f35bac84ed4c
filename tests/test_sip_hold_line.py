"""Holding the line at the SIP door (issue 15): half-open calls hold no session and are reaped,
a flood of un-ACKed INVITEs gets back at most what it sent and locks no real caller (sipp) out,
per-source and global INVITE limits (503 + Retry-After), RTP latched to one source, RTP
inactivity and the maximum call duration end calls with a BYE."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import socket
import time

import numpy as np
import pytest

from duplex.edge import door_args
from duplex.edge.rate import RateConfig
from duplex.edge.sip.client_transactions import T4_S
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.uas import SipServer
from duplex.server import phone_edges
from tests.sip_helpers import RtpPhone, SipPeer, ToneAgent, answer_port, sdp_offer, wait_until

pytestmark = pytest.mark.timeout(60)


async def _tone_agent(info):
    return ToneAgent()


@pytest.fixture
async def serve():
    servers: list[SipServer] = []

    async def start(**overrides) -> SipServer:
        config = dict(port=0, rtp_port_min=47000, rtp_port_max=47999, **overrides)
        srv = SipServer(SipConfig(**config), _tone_agent)
        await srv.start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        await srv.stop()


class PeerAt(SipPeer):
    """A SIP peer on another loopback address (its own source, with its own reply budget)."""

    def __init__(self, server: tuple[str, int], host: str) -> None:
        super().__init__(server)
        self.sock.close()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.port, self.host = self.sock.getsockname()[1], host

    def request(self, method: str, **kwargs):
        request = super().request(method, **kwargs)
        request.headers = [(name, value.replace("127.0.0.1:", f"{self.host}:"))
                           if name in ("Via", "Contact") else (name, value)
                           for name, value in request.headers]
        return request


async def _freed(srv: SipServer, timeout: float) -> None:
    keys = ("calls", "pending", "rtp_sockets", "agents", "client_transactions")
    await wait_until(lambda: all(srv.stats()[k] == 0 for k in keys), timeout, "call resources freed")


async def test_an_unacked_200_holds_no_session_and_is_reaped(serve):
    srv = await serve(ack_timeout_s=1.0)
    opened = ToneAgent.opened
    peer = SipPeer(srv.address)
    _, final = await peer.invite(sdp_offer(4000))
    answered = time.monotonic()
    assert final.status == 200
    assert srv.stats()["pending"] == 1 and srv.stats()["agents"] == 0  # no session taken
    await _freed(srv, 1.0 + 1.0)
    assert time.monotonic() - answered <= 2.0
    assert ToneAgent.opened == opened and srv.stats()["half_open_reaped"] == 1
    peer.close()


def _flood_invite(port: int, host: str, server: tuple[str, int]) -> bytes:
    call_id = secrets.token_hex(8)
    body = sdp_offer(4000, address=host)
    head = (f"INVITE sip:agent@{server[0]}:{server[1]} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{call_id};rport\r\n"
            f"Max-Forwards: 70\r\nFrom: <sip:x@{host}>;tag={call_id[:6]}\r\n"
            f"To: <sip:agent@{server[0]}>\r\nCall-ID: {call_id}@flood\r\nCSeq: 1 INVITE\r\n"
            f"Contact: <sip:x@{host}:{port}>\r\nContent-Type: application/sdp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _drain(sock: socket.socket, until: float) -> int:
    """Bytes that arrive on ``sock`` before ``until`` (monotonic)."""
    loop, received = asyncio.get_running_loop(), 0
    while (left := until - time.monotonic()) > 0:
        try:
            received += len(await asyncio.wait_for(loop.sock_recv(sock, 65535), left))
        except TimeoutError:
            break
    return received


async def _sipp_call(server: SipServer, cwd) -> tuple[int, str]:
    host, port = server.address
    proc = await asyncio.create_subprocess_exec(
        "sipp", f"{host}:{port}", "-sn", "uac", "-d", "300", "-i", "127.0.0.1", "-mi", "127.0.0.1",
        "-p", "0", "-mp", "0", "-m", "1", "-nostdin", "-timeout", "10s", "-timeout_error",
        cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(proc.communicate(), 20)
    return proc.returncode, output.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) missing")
async def test_a_flood_of_unacked_invites_gets_no_amplification_and_locks_no_one_out(serve, tmp_path):
    """100 INVITEs with SDP, never ACKed, from one address (127.0.0.2): bytes back / bytes
    sent <= 1 (retransmissions, refusals and BYEs included), and a real call (sipp, from
    127.0.0.1) is answered and ACKed within 1 s of the flood's last INVITE."""
    srv = await serve(ack_timeout_s=2.0, limit_loopback=True)  # the flood stands for a foreign source
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.2", 0))
    sock.setblocking(False)
    sent = 0
    try:
        for _ in range(100):
            datagram = _flood_invite(sock.getsockname()[1], "127.0.0.2", srv.address)
            sock.sendto(datagram, srv.address)
            sent += len(datagram)
        flood_end = time.monotonic()
        drain = asyncio.ensure_future(_drain(sock, flood_end + 2.0 + 2.0))  # ACK timeout + BYE
        caller = asyncio.ensure_future(_sipp_call(srv, tmp_path))

        def confirmed() -> bool:
            return any(call.state.value == "confirmed" and call.peer[0] == "127.0.0.1"
                       for call in srv.calls.active.values())

        await wait_until(confirmed, 5, "the real call confirmed")
        connect_s = time.monotonic() - flood_end
        rc, output = await caller
        assert rc == 0, output[-2000:]
        back = await drain
    finally:
        sock.close()
    print(f"flood: {sent} bytes sent, {back} back (ratio {back / sent:.3f}); the real call "
          f"confirmed {1000 * connect_s:.0f} ms after the flood")
    assert back / sent <= 1.0
    assert connect_s < 1.0
    stats = srv.stats()
    assert stats["calls_answered"] >= 2 and stats["internal_errors"] == 0
    # each INVITE of the flood is answered and reaped, rate-limited, or over its source's share
    assert stats["half_open_reaped"] + stats["rate_limited"] + stats["pending_capped"] == 100
    assert stats["half_open_reaped"] <= 2  # a quarter of max_calls (8): the rest never got a 200
    await _freed(srv, 3.0)


async def test_the_oldest_pending_call_gives_way(serve):
    """More INVITEs pending (answered, not ACKed) than max_pending_calls: the oldest is dropped
    for the newest, which then connects; nothing is left behind."""
    srv = await serve(max_pending_calls=2, ack_timeout_s=1.0)
    peers = [PeerAt(srv.address, f"127.0.0.{n}") for n in (2, 3, 4)]
    answers = [await peer.invite(sdp_offer(4000)) for peer in peers]
    assert [final.status for _, final in answers] == [200, 200, 200]
    assert srv.stats()["pending"] == 2 and srv.stats()["pending_evicted"] == 1
    assert peers[0].call_id not in srv.calls.active
    await peers[0].next(method="BYE")  # the dropped call is told, once
    peers[2].ack(*answers[2])
    await wait_until(lambda: srv.stats()["agents"] == 1, 5, "the newest call's session")
    peers[2].send(peers[2].request("BYE"))
    await peers[2].next(status=200)
    await _freed(srv, 1.0 + 1.0)  # the other pending one is reaped at its ACK timeout
    assert srv.stats()["half_open_reaped"] == 1
    for peer in peers:
        peer.close()


async def test_per_source_and_global_invite_limits_answer_503_with_retry_after(serve):
    srv = await serve(rate=RateConfig(per_source=6, source_burst=2, total=60, total_burst=3), limit_loopback=True)
    peer = SipPeer(srv.address)
    statuses = []
    for _ in range(3):
        peer.to_tag = ""
        invite, final = await peer.invite(sdp_offer(4000))
        statuses.append(final.status)
        peer.call_id = secrets.token_hex(8) + "@test"  # a new call each time
    assert statuses == [200, 200, 503]
    assert final.get("Retry-After") == "10"  # 6 a minute: one every 10 s
    assert srv.stats()["rate_limited"] == 1 and srv.stats()["server_transactions"] <= 2
    other = PeerAt(srv.address, "127.0.0.2")
    _, first = await other.invite(sdp_offer(4000, address="127.0.0.2"))
    assert first.status == 200  # a new source, the global burst has one left
    other.call_id, other.to_tag = secrets.token_hex(8) + "@test", ""
    _, second = await other.invite(sdp_offer(4000, address="127.0.0.2"))
    assert second.status == 503  # within its own burst, but over the server's
    assert srv.stats()["rate"] == {"source": 1, "total": 1}
    peer.close()
    other.close()


async def test_one_source_holds_at_most_its_share_of_unacked_calls(serve):
    """A quarter of max_calls (2 of 8) answered-but-not-ACKed calls per source: its next INVITE is
    refused (503 + Retry-After) instead of evicting other callers' pending calls."""
    generous = RateConfig(per_source=600, source_burst=20, total=6000, total_burst=100)
    srv = await serve(max_calls=8, ack_timeout_s=30.0, limit_loopback=True, rate=generous)
    flood = PeerAt(srv.address, "127.0.0.2")
    statuses = []
    for _ in range(3):
        flood.to_tag = ""
        _, final = await flood.invite(sdp_offer(4000, address="127.0.0.2"))
        statuses.append(final.status)
        flood.call_id = secrets.token_hex(8) + "@test"
    assert statuses == [200, 200, 503]
    assert final.get("Retry-After") == "30"  # the ACK deadline: by then a place is free
    assert srv.stats()["pending"] == 2 and srv.stats()["pending_capped"] == 1
    other = PeerAt(srv.address, "127.0.0.3")
    _, elsewhere = await other.invite(sdp_offer(4000, address="127.0.0.3"))
    assert elsewhere.status == 200 and srv.stats()["pending"] == 3 and srv.stats()["pending_evicted"] == 0
    flood.close()
    other.close()


async def test_loopback_sources_pass_the_invite_rate_unless_limit_loopback(serve):
    """Every door's rule (edge/rate.py): the host's own SBC or tools on 127.0.0.0/8 are not
    rate-limited unless limit_loopback (--limit-loopback) is set."""
    srv = await serve(rate=RateConfig(per_source=6, source_burst=2, total=60, total_burst=3))
    assert not srv.config.limit_loopback
    peer = SipPeer(srv.address)
    statuses = []
    for _ in range(4):  # past both bursts
        peer.to_tag = ""
        _, final = await peer.invite(sdp_offer(4000))
        statuses.append(final.status)
        peer.call_id = secrets.token_hex(8) + "@test"
    assert statuses == [200] * 4
    assert srv.stats()["rate_limited"] == 0 and srv.stats()["rate"] == {"source": 0, "total": 0}
    peer.close()


def test_limit_loopback_reaches_both_phone_doors():
    parser = argparse.ArgumentParser()
    door_args.add_arguments(parser)
    phone_edges.add_arguments(parser)
    for flags, limited in (([], False), (["--limit-loopback"], True)):
        config = phone_edges.config_from_args(parser.parse_args(["--sip", "127.0.0.1:0", *flags]))
        assert config.sip is not None and config.sip.limit_loopback is limited
        assert config.twilio_limits.limit_loopback is limited


async def _confirmed_call(srv: SipServer, peer: SipPeer, phone: RtpPhone):
    invite, final = await peer.invite(sdp_offer(phone.port))
    assert final.status == 200
    peer.ack(invite, final)
    await wait_until(lambda: srv.stats()["agents"] == 1, 5, "the call's session")
    return final


async def test_rtp_from_another_port_of_the_caller_is_dropped(serve):
    srv = await serve()
    peer, phone, stranger = SipPeer(srv.address), RtpPhone(), RtpPhone()
    final = await _confirmed_call(srv, peer, phone)
    media = ("127.0.0.1", answer_port(final))
    call = next(iter(srv.calls.active.values()))
    quiet, loud = bytes([0xFF]) * 160, bytes([0x00]) * 160  # mu-law silence / full scale
    for _ in range(25):  # half a second: the phone's silence, a second socket's loud audio
        phone.send_frame(media, quiet)
        stranger.send_frame(media, loud)
        await asyncio.sleep(0.02)
    await wait_until(lambda: call.media.stats.wrong_source >= 25, 5, "strangers counted")
    await wait_until(lambda: sum(len(c) for c in call.agent.caller) >= 320 * 25, 5, "caller audio")
    heard = np.concatenate(call.agent.caller).astype(np.float64)
    assert np.abs(heard).max() < 100  # only the phone's silence reached the conversation
    assert call.media.stats.packets_received == 25
    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await _freed(srv, 5)
    assert srv.stats()["rtp_wrong_source"] >= 25
    for p in (phone, stranger):
        await p.close()
    peer.close()


@pytest.mark.parametrize("limit, counter", [({"rtp_timeout_s": 0.5}, "rtp_timeouts"),
                                            ({"max_call_s": 0.5}, "max_duration")])
async def test_no_rtp_or_too_long_a_call_is_hung_up(serve, limit, counter):
    srv = await serve(**limit)
    peer, phone = SipPeer(srv.address), RtpPhone()
    await _confirmed_call(srv, peer, phone)
    started = time.monotonic()
    if counter == "max_duration":  # media flows, the call just lasts too long
        keep_talking = asyncio.ensure_future(_talk(phone, srv))
    bye = await peer.next(method="BYE", timeout=5)
    elapsed = time.monotonic() - started
    peer.reply(bye, 200)
    await _freed(srv, T4_S + 5)  # the server's BYE lingers T4 after its 200 (retransmissions)
    assert 0.5 - 0.05 <= elapsed < 0.5 + 1.0  # the limit, plus one 20 ms tick and scheduling
    assert srv.stats()[counter] == 1
    if counter == "max_duration":
        keep_talking.cancel()
    await phone.close()
    peer.close()


async def _talk(phone: RtpPhone, srv: SipServer) -> None:
    call = next(iter(srv.calls.active.values()))
    port = call.media.local_port
    while True:
        phone.send_frame(("127.0.0.1", port), bytes([0xFF]) * 160)
        await asyncio.sleep(0.02)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_reply_budget_gives_back_at_most_what_came_in_plus_the_allowance():
    from duplex.edge.sip.reply_budget import ReplyBudget

    clock = _Clock()
    budget = ReplyBudget(window_s=30, allowance=100, max_sources=16, clock=clock)
    assert not budget.spend("10.0.0.1", 1)  # never heard from: nothing at all
    budget.received("10.0.0.1", 500)
    assert budget.spend("10.0.0.1", 600) and not budget.spend("10.0.0.1", 1)
    budget.received("10.0.0.1", 50)
    clock.now += 29  # heard within the window: the credit stays
    assert budget.available("10.0.0.1") == 50
    clock.now += 31  # silent for longer: forfeited
    assert budget.available("10.0.0.1") == 0 and not budget.spend("10.0.0.1", 1)
    for n in range(100):
        budget.received(f"10.1.0.{n}", 10)
    assert budget.stats() == {"sources": 16, "sends_dropped": 3, "bytes_dropped": 3}


def test_refusals_are_counted_always_and_logged_at_a_bounded_rate(caplog):
    import collections
    import logging

    from duplex.edge.phone.refusals import LINES_PER_WINDOW, WINDOW_S, Refusals

    clock = _Clock()
    counters: collections.Counter[str] = collections.Counter()
    refusals = Refusals(counters, logging.getLogger("test.refusals"), "sip", clock)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for _ in range(1000):
            refusals.note("rate_limited", "a flood")
        assert counters["rate_limited"] == 1000 and len(caplog.records) == LINES_PER_WINDOW
        clock.now += WINDOW_S
        refusals.note("rate_limited", "later")
    assert len(caplog.records) == LINES_PER_WINDOW + 2
    assert "995 more not logged" in caplog.records[-2].getMessage()


async def test_a_flood_of_distinct_requests_cannot_grow_the_transaction_table_or_block_a_calls_bye(serve):
    srv = await serve(max_transactions=16)
    caller = SipPeer(srv.address)
    invite, final = await caller.invite(sdp_offer(4000))
    assert final.status == 200
    caller.ack(invite, final)
    await wait_until(lambda: srv.stats()["calls"] == 1, 5.0, "the call confirmed")
    flood = PeerAt(srv.address, "127.0.0.9")
    for _ in range(40):  # each a new transaction (its own branch), kept ~32 s if admitted
        flood.send(flood.request("OPTIONS"))
    await wait_until(lambda: srv.stats()["server_transactions"] + srv.stats()["transactions_full"] >= 41, 5.0,
                     "the flood handled")
    assert srv.stats()["server_transactions"] <= 16
    assert srv.stats()["transactions_full"] >= 40 - 16
    caller.send(caller.request("BYE"))  # the call's own request still gets through
    assert (await caller.next(status=200, timeout=5.0)).get("CSeq").endswith("BYE")
    await wait_until(lambda: srv.stats()["calls"] == 0, 5.0, "the call ended")
    caller.close()
    flood.close()
