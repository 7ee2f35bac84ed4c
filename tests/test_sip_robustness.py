"""Hostile and broken input: garbage datagrams, bad SIP, bad SDP, unknown methods, junk RTP.
Each is dropped or refused with a clear status, and a normal call still works afterwards."""

from __future__ import annotations

import os
import random

import pytest

from duplex.edge.media.rtp import RtpPacket
from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.uas import SipServer
from tests.sip_helpers import RtpPhone, SipPeer, ToneAgent, answer_port, sdp_offer, wait_until

pytestmark = pytest.mark.timeout(60)


async def _tone_agent(info):
    return ToneAgent()


@pytest.fixture
async def srv():
    server = SipServer(SipConfig(port=0, rtp_port_min=43000, rtp_port_max=43999, t1_ms=50),
                       _tone_agent)
    await server.start()
    yield server
    await server.stop()


async def _normal_call_works(srv: SipServer) -> None:
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    invite, final = await peer.invite(sdp_offer(phone.port))
    assert final.status == 200
    peer.ack(invite, final)
    await phone.wait_packets(3)
    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await wait_until(lambda: srv.stats()["calls"] == srv.stats()["rtp_sockets"] == 0, 5,
                     "call freed")
    await phone.close()
    peer.close()


GARBAGE = [
    b"\x00" * 40,
    b"\xff\xfe\xfd" * 100,
    b"INVITE",
    b"INVITE sip:x SIP/2.0",  # no headers at all: no Via to answer to
    b"HELLO WORLD\r\n\r\n",
    b"SIP/2.0 200\r\nVia: nonsense\r\n\r\n",  # a response nobody asked for
    b"INVITE sip:a@b SIP/3.0\r\nVia: SIP/2.0/UDP 1.2.3.4\r\n\r\n",
    b"OPTIONS sip:a@b SIP/2.0\r\nVia SIP/2.0/UDP 1.2.3.4\r\n\r\n",  # header without colon
    b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 1.2.3.4\r\nContent-Length: 999\r\n\r\nshort",
    b"OPTIONS sip:a@b SIP/2.0\r\n" + b"X-Pad: y\r\n" * 500 + b"\r\n",  # too many headers
    b"A" * 65000,  # one giant start line
    "INVITE sip:ü@b SIP/2.0\r\nVia: SIP/2.0/UDP \udcff\r\n\r\n".encode("utf-8", "surrogateescape"),
]


async def test_garbage_datagrams_are_dropped(srv):
    peer = SipPeer(srv.address)
    rng = random.Random(7)
    for payload in GARBAGE + [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 1400)))
                              for _ in range(50)]:
        peer.send(payload)
    peer.send(peer.request("OPTIONS"))  # answered after all that: the server is alive
    await peer.next(status=200)
    stats = srv.stats()
    assert stats["malformed"] >= len(GARBAGE) - 2
    assert stats["internal_errors"] == 0 and stats["calls"] == 0
    peer.close()
    await _normal_call_works(srv)


@pytest.mark.parametrize("headers_removed, expected", [("Call-ID", 400), ("CSeq", 400),
                                                        ("From", 400)])
async def test_missing_mandatory_header_is_400(srv, headers_removed, expected):
    peer = SipPeer(srv.address)
    request = peer.request("OPTIONS")
    request.headers = [(k, v) for k, v in request.headers if k != headers_removed]
    peer.send(request)
    response = await peer.next()
    assert response.status == expected and headers_removed in response.reason
    assert srv.stats()["bad_requests"] == 1 and srv.stats()["internal_errors"] == 0
    peer.close()


async def test_cseq_method_mismatch_is_400(srv):
    peer = SipPeer(srv.address)
    request = peer.request("OPTIONS")
    request.set("CSeq", "1 INVITE")
    peer.send(request)
    assert (await peer.next()).status == 400
    peer.close()


@pytest.mark.parametrize("method, status", [("FOO", 501), ("REGISTER", 405), ("MESSAGE", 405),
                                            ("SUBSCRIBE", 405)])
async def test_unknown_and_unsupported_methods(srv, method, status):
    peer = SipPeer(srv.address)
    peer.send(peer.request(method))
    response = await peer.next()
    assert response.status == status
    assert "INVITE" in response.get_all("Allow")
    assert srv.stats()["unsupported_methods"] == 1
    peer.close()


HEAD = b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\n"
BAD_SDP = [
    b"this is not sdp",
    b"v=0\r\ns=-\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n",  # no o=, no c=
    HEAD + b"c=IN IP4 not-an-ip\r\nt=0 0\r\nm=audio 1 RTP/AVP 0\r\n",
    HEAD + b"c=IN IP4 1.2.3.4\r\nt=0 0\r\nm=audio 99999 RTP/AVP 0\r\n",
    b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\nm=audio\r\n",
    b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\nbroken line\r\n",
    b"\xff\xfe" * 20,
    b"v=0\r\n" + b"a=x\r\n" * 3000,  # oversize
]


@pytest.mark.parametrize("body", BAD_SDP, ids=range(len(BAD_SDP)))
async def test_bad_sdp_is_400_and_allocates_nothing(srv, body):
    peer = SipPeer(srv.address)
    invite, final = await peer.invite(body)
    assert final.status == 400 and "SDP" in final.reason
    peer.ack(invite, final)
    assert srv.stats()["calls"] == 0 and srv.stats()["rtp_sockets"] == 0
    peer.close()


async def test_non_sdp_body_is_415(srv):
    peer = SipPeer(srv.address)
    invite, final = await peer.invite(b"<xml/>", content_type="application/xml")
    assert final.status == 415 and final.get("Accept") == "application/sdp"
    peer.ack(invite, final)
    peer.close()


async def test_in_dialog_requests_for_unknown_dialogs_are_481(srv):
    peer = SipPeer(srv.address)
    peer.send(peer.request("BYE", to_tag="nosuchtag"))
    assert (await peer.next()).status == 481
    peer.send(peer.request("INVITE", to_tag="nosuchtag", body=sdp_offer(4000)))
    assert (await peer.next(status=481)).status == 481
    peer.send(peer.request("CANCEL", cseq=1))
    assert (await peer.next()).status == 481
    peer.close()


async def test_junk_rtp_is_dropped_and_the_call_goes_on(srv):
    peer, phone = SipPeer(srv.address), RtpPhone()
    phone.start()
    invite, final = await peer.invite(sdp_offer(phone.port))
    peer.ack(invite, final)
    media_addr = ("127.0.0.1", answer_port(final))
    call = next(iter(srv.calls.active.values()))
    junk = [b"", b"\x00", b"\x80" * 5, b"\x40" + b"\x00" * 20,  # short, version 1
            bytes([0x8F]) + b"\x00" * 11,  # 15 CSRCs announced, none present
            bytes([0x90, 0]) + b"\x00" * 10 + b"\x00\x00\xff\xff",  # extension runs past the end
            bytes([0xA0, 0]) + b"\x00" * 10 + b"\x00",  # padding of zero bytes
            bytes([0xA0, 0]) + b"\x00" * 10 + b"\x7f",  # padding longer than the packet
            bytes([0x80, 200]) + b"\x00" * 30,  # RTCP sender report on the RTP port
            os.urandom(2000)]
    for datagram in junk:
        phone.sock.sendto(datagram, media_addr)
    phone.sock.sendto(RtpPacket(96, 1, 1, 1, b"x" * 160).serialize(), media_addr)  # not offered
    call.media.jitter.stats.received = 0
    phone.send_frame(media_addr, b"\xff" * 160)
    await wait_until(lambda: call.media.jitter.stats.received == 1, 5, "a good packet after junk")
    stats = call.media.stats
    assert stats.malformed == len(junk)
    assert stats.wrong_payload_type == 1
    count = len(phone.packets)
    await phone.wait_packets(count + 3)  # still sending
    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await phone.close()
    peer.close()


async def test_rtp_from_a_stranger_is_ignored(srv):
    peer, phone = SipPeer(srv.address), RtpPhone()
    invite, final = await peer.invite(sdp_offer(phone.port, address="127.0.0.2"))
    peer.ack(invite, final)
    call = next(iter(srv.calls.active.values()))
    phone.send_frame(("127.0.0.1", answer_port(final)), b"\x00" * 160)  # from 127.0.0.1
    await wait_until(lambda: call.media.stats.wrong_source == 1, 5, "stranger counted")
    assert call.media.jitter.stats.received == 0
    peer.send(peer.request("BYE"))
    await peer.next(status=200)
    await phone.close()
    peer.close()
