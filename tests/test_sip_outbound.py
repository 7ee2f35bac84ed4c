"""Calls duplex places, against SIPp as the callee (answers, busy, declines, never answers) and as
a trunk that challenges with digest, on an in-process SIP server with a tone agent (the real
conversation and the first message are in ``test_sip_outbound_e2e``). After every call nothing
is left: no call, RTP socket, ringing call or client transaction."""

from __future__ import annotations

import shutil
import socket

import pytest

from duplex.edge.phone.bridge import CallOpening
from duplex.edge.sip.config import OutboundConfig, SipConfig
from duplex.edge.sip.outbound import OutboundRefused
from duplex.edge.sip.placed import PlacedCall, PlacedState
from duplex.edge.sip.uas import SipServer
from tests.sip_callee import Callee as RawCallee
from tests.sip_callee import SippCallee, free_port
from tests.sip_helpers import ToneAgent, wait_until

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) missing")]
T1_MS = 50  # timers B/F and the Accepted/Completed states last 64*T1 = 3.2 s


async def _tone_agent(info):
    return ToneAgent()


async def _serve(**outbound) -> SipServer:
    config = SipConfig(port=0, rtp_port_min=46000, rtp_port_max=46999, t1_ms=T1_MS,
                       outbound=OutboundConfig(**{"allow": ["sip:*@127.0.0.1:*"], **outbound}))
    server = SipServer(config, _tone_agent)
    await server.start()
    return server


async def _nothing_left(server: SipServer) -> None:
    def clear() -> bool:
        stats = server.stats()
        return (stats["calls"] == 0 and stats["rtp_sockets"] == 0 and stats["agents"] == 0
                and stats["client_transactions"] == 0 and stats["outbound"] == {"live": 0, "ringing_rtp_sockets": 0})
    await wait_until(clear, 10, f"nothing left: {server.stats()}")
    assert server.stats()["internal_errors"] == 0


def _types(placed: PlacedCall) -> list[str]:
    return [event.type for event in placed.events]


async def test_callee_answers_then_we_hang_up(tmp_path):
    server = await _serve()
    try:
        async with SippCallee("uas_answer.xml", tmp_path) as callee:
            placed = server.outbound.place(f"sip:bob@127.0.0.1:{callee.port}", CallOpening())
            await wait_until(lambda: placed.state is PlacedState.ANSWERED, 10, "answered")
            assert server.stats()["calls"] == 1
            await wait_until(lambda: server.stats()["agents"] == 1, 5, "the call's agent")
            call_stats = next(iter(server.stats()["active"].values()))
            assert call_stats["state"] == "confirmed" and call_stats["codec"] == "PCMU"
            await wait_until(lambda: next(iter(server.stats()["active"].values()))["packets_out"] > 5, 5, "RTP out")
            server.outbound.hang_up(placed)
            rc, output = await callee.result()
            assert rc == 0, output[-2000:]
        await wait_until(lambda: placed.state is PlacedState.ENDED, 5, "ended")
        assert _types(placed) == ["calling", "ringing", "answered", "ended"]
        assert placed.sip_status == 200 and placed.events[1].sip_status == 180
        await _nothing_left(server)
        assert server.stats()["byes_sent"] == 1
    finally:
        await server.stop()


@pytest.mark.parametrize(("status", "reason"), [(486, "Busy Here"), (603, "Decline")])
async def test_callee_refuses(tmp_path, status, reason):
    server = await _serve()
    try:
        async with SippCallee("uas_refuse.xml", tmp_path, fill={"STATUS_CODE": str(status),
                                                            "REASON_PHRASE": reason}) as callee:
            placed = server.outbound.place(f"sip:bob@127.0.0.1:{callee.port}", CallOpening())
            rc, output = await callee.result()  # 0: it got the ACK of its refusal
            assert rc == 0, output[-2000:]
        await wait_until(lambda: placed.state is PlacedState.FAILED, 5, "failed")
        assert (placed.sip_status, placed.reason) == (status, reason)
        assert _types(placed) == ["calling", "ringing", "failed"]
        assert placed.events[-1].sip_status == status
        await _nothing_left(server)
        assert server.stats()["agents"] == 0 and ToneAgent.opened == ToneAgent.closed
    finally:
        await server.stop()


async def test_unanswered_call_is_cancelled(tmp_path):
    server = await _serve(ring_timeout_s=1.0)
    try:
        async with SippCallee("uas_ring.xml", tmp_path) as callee:
            placed = server.outbound.place(f"sip:bob@127.0.0.1:{callee.port}", CallOpening())
            rc, output = await callee.result()  # 0: CANCEL came, and the ACK of its 487
            assert rc == 0, output[-2000:]
        await wait_until(lambda: placed.state is PlacedState.FAILED, 5, "failed")
        assert (placed.sip_status, placed.reason) == (487, "no answer")
        assert _types(placed) == ["calling", "ringing", "cancelling", "failed"]
        assert 1.0 <= placed.events[2].at_s < 1.0 + 1.0  # the ringing timeout, give or take the loop
        await _nothing_left(server)
    finally:
        await server.stop()


CHALLENGES = {
    401: {"CHALLENGE_STATUS": "401 Unauthorized", "CHALLENGE_HEADER": "WWW-Authenticate",
          "VERIFY_ANSWER": '<verifyauth assign_to="authvalid" username="alice" password="s3cret"/>'},
    407: {"CHALLENGE_STATUS": "407 Proxy Authentication Required", "CHALLENGE_HEADER": "Proxy-Authenticate",
          "VERIFY_ANSWER": '<ereg regexp="^ *Digest username=.alice., realm=.trunk\\.test., nonce=.5e1f0c9a[0-9]+., '
                           'uri=.sip:[+]15550100@trunk\\.test.," search_in="hdr" header="Proxy-Authorization:" '
                           'check_it="true" assign_to="authvalid"/>'},
}


@pytest.mark.parametrize("challenge", [401, 407])
async def test_trunk_digest_challenge_answered_once(tmp_path, challenge):
    async with SippCallee("uas_trunk_auth.xml", tmp_path, fill=CHALLENGES[challenge]) as trunk:
        server = await _serve(allow=["sip:+1555*@trunk.test"], trunk=f"127.0.0.1:{trunk.port}",
                              trunk_user="alice", trunk_password="s3cret")
        try:
            placed = server.outbound.place("sip:+15550100@trunk.test", CallOpening())
            await wait_until(lambda: placed.state is PlacedState.ANSWERED, 10, "answered")
            assert server.stats()["active"][placed.call.call_id]["codec"] == "PCMA"
            server.outbound.hang_up(placed)
            rc, output = await trunk.result()  # 0: SIPp verified our digest answer
            assert rc == 0, output[-2000:]
            assert _types(placed) == ["calling", "authenticating", "answered", "ended"]
            assert placed.events[1].sip_status == challenge
            await _nothing_left(server)
        finally:
            await server.stop()


async def test_wrong_trunk_password_fails_without_a_second_try(tmp_path):
    async with SippCallee("uas_trunk_auth.xml", tmp_path, fill=CHALLENGES[401]) as trunk:
        server = await _serve(allow=["sip:*@trunk.test"], trunk=f"127.0.0.1:{trunk.port}",
                              trunk_user="alice", trunk_password="wrong")
        try:
            placed = server.outbound.place("sip:bob@trunk.test", CallOpening())
            rc, _ = await trunk.result()
            assert rc != 0  # SIPp refused our digest answer (its call failed)
            # SIPp gave up without answering our second INVITE: timer B ends it, no third INVITE
            await wait_until(lambda: placed.state is PlacedState.FAILED, 64 * T1_MS / 1000 + 5, "failed")
            assert placed.sip_status == 408 and _types(placed) == ["calling", "authenticating", "failed"]
            await _nothing_left(server)
        finally:
            await server.stop()


async def test_unreachable_target_times_out():
    server = await _serve()
    try:
        placed = server.outbound.place(f"sip:nobody@127.0.0.1:{free_port()}", CallOpening())
        await wait_until(lambda: placed.state is PlacedState.FAILED, 64 * T1_MS / 1000 + 5, "failed")
        assert (placed.sip_status, placed.reason) == (408, "no response to the INVITE")
        assert placed.events[-1].at_s >= 64 * T1_MS / 1000  # timer B, not earlier
        await _nothing_left(server)
    finally:
        await server.stop()


@pytest.mark.parametrize(("target", "code"), [
    ("sip:bob@10.1.2.3:5060", "target_not_allowed"),
    ("sip:bob@127.0.0.1:5060\r\nX-Injected: 1", "invalid_target"),
    ("sips:bob@127.0.0.1:5061", "invalid_target"),
    ("tel:+15550100", "invalid_target"),
])
async def test_targets_refused_before_anything_is_sent(target, code):
    server = await _serve()
    try:
        with pytest.raises(OutboundRefused) as refused:
            server.outbound.place(target, CallOpening())
        assert refused.value.code == code and refused.value.status in (400, 403)
        assert server.stats()["client_transactions"] == 0 and not server.outbound.placed
    finally:
        await server.stop()


async def test_outbound_off_by_default():
    server = SipServer(SipConfig(port=0), _tone_agent)
    await server.start()
    try:
        with pytest.raises(OutboundRefused) as refused:
            server.outbound.place("sip:bob@127.0.0.1:5060", CallOpening())
        assert (refused.value.status, refused.value.code) == (403, "outbound_disabled")
    finally:
        await server.stop()


async def test_concurrent_cap_and_rate():
    server = await _serve(max_calls=1, per_minute=2)
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a callee that never answers
    silent.bind(("127.0.0.1", 0))
    target = f"sip:bob@127.0.0.1:{silent.getsockname()[1]}"
    try:
        first = server.outbound.place(target, CallOpening())
        with pytest.raises(OutboundRefused) as capped:
            server.outbound.place(target, CallOpening())
        assert (capped.value.status, capped.value.code) == (429, "outbound_calls_capped")
        server.outbound.hang_up(first)  # no provisional yet: nothing to CANCEL, it ends at timer B
        await wait_until(lambda: first.state is PlacedState.FAILED, 64 * T1_MS / 1000 + 5, "failed")
        second = server.outbound.place(target, CallOpening())
        server.outbound.hang_up(second)
        await wait_until(lambda: second.state is PlacedState.FAILED, 64 * T1_MS / 1000 + 5, "failed")
        with pytest.raises(OutboundRefused) as limited:
            server.outbound.place(target, CallOpening())
        assert (limited.value.status, limited.value.code) == (429, "outbound_rate_limited")
        assert limited.value.retry_after_s is not None and 1 <= limited.value.retry_after_s <= 61
        await _nothing_left(server)
    finally:
        silent.close()
        await server.stop()


async def test_invite_retransmitted_until_answered_and_every_200_acked():
    """Timer A: the INVITE again, same branch, until something answers; a 200 OK sent again
    (its ACK lost) is ACKed again (RFC 6026's Accepted state); DELETE's BYE ends it."""
    server = await _serve()
    callee = RawCallee()
    try:
        placed = server.outbound.place(callee.uri, CallOpening())
        first, addr = await callee.next_request("INVITE")
        again, _ = await callee.next_request("INVITE")  # nothing answered: sent again after T1
        assert again.get("Via") == first.get("Via") and again.get("CSeq") == "1 INVITE"
        await callee.answer_invite(first, addr)
        ack, _ = await callee.next_request("ACK")
        assert ack.get("CSeq") == "1 ACK"
        callee.resend_last()  # as if the ACK were lost
        ack_again, _ = await callee.next_request("ACK")
        assert ack_again.get("CSeq") == "1 ACK"
        await wait_until(lambda: placed.state is PlacedState.ANSWERED, 5, "answered")
        server.outbound.hang_up(placed)
        bye, _ = await callee.next_request("BYE")
        callee.respond(bye, addr, 200, "OK")
        await wait_until(lambda: placed.state is PlacedState.ENDED, 5, "ended")
        await _nothing_left(server)
    finally:
        callee.close()
        await server.stop()
