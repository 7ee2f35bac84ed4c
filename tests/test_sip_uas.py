"""The SIP UAS against a hand-driven peer on loopback: dialogs, offer/answer, teardown, policy."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from duplex.edge.sip.client_transactions import T4_S
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.headers import parse_auth_params
from duplex.edge.sip.uas import SipServer
from tests.sip_helpers import (
    RtpPhone,
    SipPeer,
    ToneAgent,
    answer_port,
    sdp_offer,
    udp_sockets,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


async def _tone_agent(info):
    return ToneAgent()


def _config(**overrides) -> SipConfig:
    base = dict(port=0, rtp_port_min=42000, rtp_port_max=42999, t1_ms=50)
    return SipConfig(**{**base, **overrides})


@pytest.fixture
async def server():
    servers: list[SipServer] = []

    async def start(**overrides) -> SipServer:
        srv = SipServer(_config(**overrides), _tone_agent)
        await srv.start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        await srv.stop()


async def _idle(srv: SipServer) -> None:
    """Every per-call resource released (calls, RTP sockets, agents, transactions). A BYE the
    server sent lingers T4 after its 200 (to absorb retransmissions): the wait allows for it."""
    keys = ("calls", "rtp_sockets", "agents", "client_transactions")
    await wait_until(lambda: all(srv.stats()[k] == 0 for k in keys), T4_S + 5, "call resources freed")


async def _hang_up(srv: SipServer, peer: SipPeer, phone: RtpPhone) -> None:
    """The caller's BYE, answered 200; the server then holds no call state."""
    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await _idle(srv)
    await phone.close()
    peer.close()


async def _answered_call(srv: SipServer, peer: SipPeer, phone: RtpPhone, formats="0 8 101"):
    invite, final = await peer.invite(sdp_offer(phone.port, formats))
    assert final.status == 200, final.reason
    peer.ack(invite, final)
    return invite, final


async def test_options_lists_methods(server):
    srv = await server()
    peer = SipPeer(srv.address)
    peer.send(peer.request("OPTIONS"))
    response = await peer.next(status=200)
    assert {"INVITE", "ACK", "BYE", "CANCEL", "OPTIONS"} <= set(response.get_all("Allow"))
    assert ";tag=" in response.get("To")
    assert "received=127.0.0.1" in response.get("Via") and "rport=" in response.get("Via")
    peer.close()


async def test_call_offer_answer_media_and_caller_bye_leave_nothing(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    sockets_before = udp_sockets()  # the server's SIP socket and the test's two
    invite, final = await _answered_call(srv, peer, phone, formats="0 8 101")
    statuses = [m.status for m in peer.received if hasattr(m, "status")]
    assert statuses[:3] == [100, 180, 200]
    assert final.get("Content-Type") == "application/sdp"
    body = final.body.decode()
    assert "m=audio" in body and " RTP/AVP 0 101" in body and "a=rtpmap:0 PCMU/8000" in body
    assert "a=sendrecv" in body and final.get("Contact")
    assert srv.stats()["calls"] == 1 and srv.stats()["rtp_sockets"] == 1
    assert udp_sockets() == sockets_before + 1

    await phone.wait_packets(25)  # half a second of the agent's tone, in order
    packets = [p for _, p in phone.packets]
    assert {p.payload_type for p in packets} == {0}
    assert all((b.sequence - a.sequence) % 65536 == 1 for a, b in zip(packets, packets[1:]))
    assert all((b.timestamp - a.timestamp) % 2**32 == 160 for a, b in zip(packets, packets[1:]))
    assert len({p.ssrc for p in packets}) == 1 and packets[0].marker

    # caller audio reaches the agent at 16 kHz
    agent_port = answer_port(final)
    for _ in range(10):
        phone.send_frame((peer.server[0], agent_port), bytes([0x00]) * 160)  # loud mu-law
    call = next(iter(srv.calls.active.values()))
    await wait_until(lambda: sum(abs(c).max(initial=0) > 1000 for c in call.agent.caller) >= 5,
                     5, "caller audio at the agent")

    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await _idle(srv)
    assert udp_sockets() == sockets_before  # the call's RTP socket is really closed
    await phone.close()
    peer.close()


async def test_codec_follows_the_offer_order(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    _, final = await _answered_call(srv, peer, phone, formats="8 0")
    assert " RTP/AVP 8\r\n" in final.body.decode()
    assert "telephone-event" not in final.body.decode()  # not offered, not answered
    await phone.wait_packets(5)
    assert phone.packets[-1][1].payload_type == 8
    await _hang_up(srv, peer, phone)


async def test_server_hangs_up_with_bye(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    _, final = await _answered_call(srv, peer, phone)
    call_id = peer.call_id
    srv.calls.hang_up(call_id, "test")
    bye = await peer.next(method="BYE")
    assert bye.uri == f"sip:caller@127.0.0.1:{peer.port}"
    assert f"tag={peer.from_tag}" in bye.get("To") and f"tag={peer.to_tag}" in bye.get("From")
    assert srv.stats()["client_transactions"] == 1
    peer.reply(bye, 200)
    await _idle(srv)
    assert srv.stats()["byes_sent"] == 1
    await phone.close()
    peer.close()


async def test_cancel_while_ringing(server):
    srv = await server(ring_ms=5000)
    peer, phone = SipPeer(srv.address), RtpPhone()
    invite = peer.request("INVITE", body=sdp_offer(phone.port))
    peer.send(invite)
    await peer.next(status=180)
    branch = invite.get("Via").split("branch=")[1].split(";")[0]
    peer.send(peer.request("CANCEL", cseq=invite_cseq(invite), branch=branch, to_tag=""))
    ok = await peer.next(status=200)
    assert "CANCEL" in ok.get("CSeq")
    terminated = await peer.next(status=487)
    peer.ack(invite, terminated)
    await _idle(srv)
    await wait_until(lambda: srv.stats()["server_transactions"] == 0, 8, "transactions expired")
    assert srv.stats()["calls_cancelled"] == 1 and srv.stats()["calls_answered"] == 0
    await phone.close()
    peer.close()


def invite_cseq(invite) -> int:
    return int(invite.get("CSeq").split()[0])


async def test_reinvite_moves_media_changes_codec_and_holds(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    _, final = await _answered_call(srv, peer, phone, formats="0")
    first_origin = [ln for ln in final.body.decode().splitlines() if ln.startswith("o=")][0]
    await phone.wait_packets(3)

    moved = RtpPhone()
    moved.start()
    reinvite, ok = await peer.invite(sdp_offer(moved.port, "8", version=2))
    assert ok.status == 200 and " RTP/AVP 8\r\n" in ok.body.decode()
    origin = [ln for ln in ok.body.decode().splitlines() if ln.startswith("o=")][0]
    assert origin.split()[1] == first_origin.split()[1]  # same session id
    assert int(origin.split()[2]) == int(first_origin.split()[2]) + 1  # version bumped
    peer.ack(reinvite, ok)
    await moved.wait_packets(5)
    assert moved.packets[-1][1].payload_type == 8
    before, after = phone.packets[-1][1], moved.packets[0][1]
    assert after.ssrc == before.ssrc  # one stream throughout: its clock never resets
    assert 0 < (after.sequence - before.sequence) % 65536 < 50
    assert (after.timestamp - before.timestamp) % 2**32 == \
        160 * ((after.sequence - before.sequence) % 65536)

    rejected, refused = await peer.invite(sdp_offer(moved.port, "18", version=3))
    assert refused.status == 488  # no common codec: the call keeps its session
    peer.ack(rejected, refused)
    count = len(moved.packets)
    await moved.wait_packets(count + 5)

    held, ok = await peer.invite(sdp_offer(moved.port, "8", direction="sendonly", version=4))
    assert ok.status == 200 and "a=recvonly" in ok.body.decode()
    peer.ack(held, ok)
    await asyncio.sleep(0.1)  # let packets already in flight land
    count = len(moved.packets)
    await asyncio.sleep(0.3)
    assert len(moved.packets) == count  # on hold: we send nothing
    assert srv.stats()["reinvites"] == 2

    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await _idle(srv)
    for p in (phone, moved):
        await p.close()
    peer.close()


async def test_busy_when_full(server):
    srv = await server(max_calls=1)
    first, phone = SipPeer(srv.address), RtpPhone()
    await _answered_call(srv, first, phone)
    second = SipPeer(srv.address)
    invite, final = await second.invite(sdp_offer(phone.port))
    assert final.status == 486
    second.ack(invite, final)
    first.send(first.request("BYE"))
    await first.next(status=200)
    await _idle(srv)
    assert srv.stats()["busy"] == 1
    for p in (first, second):
        p.close()
    await phone.close()


async def test_no_common_codec_is_488_with_warning(server):
    srv = await server()
    peer = SipPeer(srv.address)
    body = b"v=0\r\no=x 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n" \
           b"m=audio 4000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n"
    invite, final = await peer.invite(body)
    assert final.status == 488 and final.get("Warning").startswith("305 ")
    peer.ack(invite, final)
    assert srv.stats()["calls"] == 0 and srv.stats()["rtp_sockets"] == 0
    peer.close()


async def test_error_responses_are_retransmitted_until_acked(server):
    srv = await server(max_calls=0)
    peer = SipPeer(srv.address)
    invite, final = await peer.invite(sdp_offer(4000))
    assert final.status == 486
    again = await peer.next(status=486, timeout=2)  # timer G: repeated while there is no ACK
    assert again.get("CSeq") == final.get("CSeq")
    peer.ack(invite, final)
    await wait_until(lambda: all(not t.retransmitter or not t.retransmitter.active
                                 for t in srv.transactions.server.values()), 2, "ACK absorbed")
    peer.close()


def _digest(user, password, realm, method, uri, nonce, nc="00000001", cnonce="abc") -> str:
    ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()
    ha2 = hashlib.md5(f"{method}:{uri}".encode()).hexdigest()
    response = hashlib.md5(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}".encode()).hexdigest()
    return (f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", '
            f'response="{response}", algorithm=MD5, qop=auth, nc={nc}, cnonce="{cnonce}"')


async def test_digest_auth_challenges_and_admits(server):
    srv = await server(auth_users={"alice": "s3cret"}, realm="duplex-test")
    peer, phone = SipPeer(srv.address), RtpPhone()
    invite, challenge = await peer.invite(sdp_offer(phone.port))
    assert challenge.status == 401
    peer.ack(invite, challenge)
    _, params = parse_auth_params(challenge.get("WWW-Authenticate"))
    assert params["realm"] == "duplex-test" and params["qop"] == "auth"

    peer.to_tag = ""
    wrong = _digest("alice", "guess", "duplex-test", "INVITE", invite.uri, params["nonce"])
    invite, refused = await peer.invite(sdp_offer(phone.port), headers=[("Authorization", wrong)])
    assert refused.status == 401
    peer.ack(invite, refused)

    peer.to_tag = ""
    right = _digest("alice", "s3cret", "duplex-test", "INVITE", invite.uri, params["nonce"])
    invite, final = await peer.invite(sdp_offer(phone.port), headers=[("Authorization", right)])
    assert final.status == 200
    peer.ack(invite, final)
    assert srv.stats()["auth_failures"] == 1 and srv.stats()["auth_challenges"] == 2
    await _hang_up(srv, peer, phone)


async def test_allowlist_refuses_other_sources(server):
    srv = await server(allow=["10.0.0.0/8"])
    peer = SipPeer(srv.address)
    invite, final = await peer.invite(sdp_offer(4000))
    assert final.status == 403
    assert srv.stats()["denied"] == 1 and srv.stats()["calls"] == 0
    peer.close()


async def test_delayed_offer_gets_answer_in_ack(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    invite, final = await peer.invite(b"")
    assert final.status == 200
    offer = final.body.decode()
    assert "RTP/AVP 0 8 101" in offer and final.get("Content-Type") == "application/sdp"
    peer.ack(invite, final, body=sdp_offer(phone.port, "8"))
    await phone.wait_packets(5)
    assert phone.packets[-1][1].payload_type == 8
    await _hang_up(srv, peer, phone)


async def test_retransmitted_invite_is_one_call(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    invite = peer.request("INVITE", body=sdp_offer(phone.port))
    peer.send(invite)
    peer.send(invite)
    final = await peer.next(status=200)
    peer.send(invite)  # after the 200: the same 200 again, not a second call
    again = await peer.next(status=200)
    assert again.get("To") == final.get("To")
    assert srv.stats()["calls"] == 1 and srv.stats()["retransmissions"] >= 1
    peer.ack(invite, final)
    await _hang_up(srv, peer, phone)


async def test_unacknowledged_200_ends_the_call(server):
    # the source is exempt from the reply budget: this is about the retransmission itself
    srv = await server(t1_ms=10, ack_timeout_s=0.64, budget_exempt=["127.0.0.0/8"])
    peer, phone = SipPeer(srv.address), RtpPhone()
    await peer.invite(sdp_offer(phone.port))
    repeats = await peer.next(status=200, timeout=2)
    assert repeats.status == 200  # the 2xx is retransmitted while there is no ACK
    bye = await peer.next(method="BYE", timeout=5)
    peer.reply(bye, 200)
    await _idle(srv)
    await phone.close()
    peer.close()


async def test_dtmf_events_reach_the_agent_once(server):
    srv = await server()
    peer, phone = SipPeer(srv.address), RtpPhone()
    _, final = await _answered_call(srv, peer, phone)
    to = (peer.server[0], answer_port(final))
    for end in (False, True, True, True):  # RFC 4733: the end packet is sent three times
        phone.send_frame(to, bytes([5, 0x80 if end else 0, 0, 160]), payload_type=101,
                         timestamp=9999)  # one event, one timestamp
    call = next(iter(srv.calls.active.values()))
    # the agent (session) is opened once the ACK is in: the digit may come first and waits
    await wait_until(lambda: call.agent is not None and call.agent.digits == ["5"], 5, "digit 5")
    await _hang_up(srv, peer, phone)


async def test_no_free_session_is_486(server):
    """No session free at the INVITE: 486. A session taken by another door between the
    200 OK and its ACK (a call opens its session only once ACKed): a BYE."""
    from duplex.edge.phone.bridge import AgentUnavailable

    def no_session(transport):
        raise AgentUnavailable("all 8 sessions are in use")

    async def full(info):
        raise AgentUnavailable("all 8 sessions are in use")

    srv = await server()
    srv.calls.reserve = no_session
    peer = SipPeer(srv.address)
    invite, final = await peer.invite(sdp_offer(4000))
    assert final.status == 486
    peer.ack(invite, final)
    await _idle(srv)
    assert srv.stats()["busy"] == 1 and srv.stats()["answer_failures"] == 0
    peer.close()

    srv.calls.reserve = None
    srv.calls.agent_factory = full
    peer = SipPeer(srv.address)
    invite, final = await peer.invite(sdp_offer(4000))
    assert final.status == 200
    peer.ack(invite, final)
    bye = await peer.next(method="BYE")
    peer.reply(bye, 200)
    await _idle(srv)
    assert srv.stats()["busy"] == 2 and srv.stats()["agents"] == 0
    peer.close()
