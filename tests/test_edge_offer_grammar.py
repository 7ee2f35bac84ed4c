"""The SDP offer's line checks, in process: what browsers send passes; each malformed line is
refused with its number and the reason, before the WebRTC stack parses it."""

from __future__ import annotations

import asyncio
import re

import pytest

from duplex.edge.webrtc.offer import OfferError, check_offer
from duplex_tools.offer import offer_sdp

SHA256 = ":".join(["AB"] * 32)
CHROME = f"""v=0
o=- 4611731400430051336 2 IN IP4 127.0.0.1
s=-
t=0 0
a=group:BUNDLE 0 1
a=extmap-allow-mixed
a=msid-semantic: WMS 7d7b5fd1
m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126
c=IN IP4 0.0.0.0
a=rtcp:9 IN IP4 0.0.0.0
a=candidate:1467250027 1 udp 2122260223 192.168.0.196 46243 typ host generation 0 network-id 1
a=candidate:4209404723 1 udp 1686052607 1.2.3.4 46243 typ srflx raddr 192.168.0.196 rport 46243 generation 0
a=candidate:2999745851 1 udp 2122194687 4d5f1a2c-6d36-4bd1-9c1a-1f1a1e4f3b6e.local 54400 typ host generation 0
a=ice-ufrag:Wq1c
a=ice-pwd:Nn4jAnnEPdMmTIY1uvp3nGZg
a=ice-options:trickle
a=fingerprint:sha-256 {SHA256}
a=setup:actpass
a=mid:0
a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level
a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid
a=sendrecv
a=msid:7d7b5fd1 2d6e1f0a
a=rtcp-mux
a=rtcp-rsize
a=rtpmap:111 opus/48000/2
a=rtcp-fb:111 transport-cc
a=fmtp:111 minptime=10;useinbandfec=1
a=rtpmap:63 red/48000/2
a=fmtp:63 111/111
a=rtpmap:9 G722/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:13 CN/8000
a=rtpmap:110 telephone-event/48000
a=rtpmap:126 telephone-event/8000
a=ssrc:3485940486 cname:b6S/AIxPZ+J/cvqL
a=ssrc:3485940486 msid:7d7b5fd1 2d6e1f0a
m=application 9 UDP/DTLS/SCTP webrtc-datachannel
c=IN IP4 0.0.0.0
a=ice-ufrag:Wq1c
a=ice-pwd:Nn4jAnnEPdMmTIY1uvp3nGZg
a=fingerprint:sha-256 {SHA256}
a=setup:actpass
a=mid:1
a=sctp-port:5000
a=max-message-size:262144
""".replace("\n", "\r\n")
# Firefox sorts a section's attributes: the fmtp lines come before their rtpmap
FIREFOX = f"""v=0
o=mozilla...THIS_IS_SDPARTA-99.0 2284749378411785234 0 IN IP4 0.0.0.0
s=-
t=0 0
a=fingerprint:sha-256 {SHA256}
a=group:BUNDLE 0
a=ice-options:trickle
a=msid-semantic:WMS *
m=audio 9 UDP/TLS/RTP/SAVPF 109 9 0 8 101
c=IN IP4 0.0.0.0
a=sendrecv
a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level
a=extmap:2/recvonly urn:ietf:params:rtp-hdrext:csrc-audio-level
a=fmtp:109 maxplaybackrate=48000;stereo=1;useinbandfec=1
a=fmtp:101 0-15
a=ice-pwd:0b8e5f3c9a1d2e4f6a7b8c9d0e1f2a3b
a=ice-ufrag:5c1a2b3c
a=mid:0
a=rtcp-mux
a=rtpmap:109 opus/48000/2
a=rtpmap:9 G722/8000/1
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=setup:actpass
a=ssrc:2870326393 cname:{{5e4a1c2b-9d3f-4e6a-8b7c-1d2e3f4a5b6c}}
"""


@pytest.mark.parametrize("offer", [CHROME, FIREFOX], ids=["chrome", "firefox"])
def test_browser_offers_pass(offer: str) -> None:
    check_offer(offer)


def test_the_webrtc_stacks_own_offer_passes() -> None:
    check_offer(asyncio.run(offer_sdp()))


def _refusal(offer: str) -> str:
    with pytest.raises(OfferError) as refused:
        check_offer(offer)
    return str(refused.value)


@pytest.mark.parametrize(("old", "new", "reason"), [
    ("m=audio 9 ", "m=audio abc ", "the port 'abc' is not a number 0..65535"),
    ("m=audio 9 ", "m=audio 9/2 ", "a port count 'port/n' is not supported"),
    ("a=rtpmap:111 opus", "a=rtpmap:999 opus", "the payload type '999' is not a number 0..127"),
    ("SAVPF 111 63", "SAVPF 111 74", "collides with RTCP"),
    ("s=-", "s=a\x00b", "control character ('\\x00')"),
    ("s=-", "s=a\rb", "control character ('\\r')"),
    ("a=fingerprint:sha-256", "a=fingerprint:sha-999", "unknown fingerprint hash 'sha-999'"),
    (f"sha-256 {SHA256}", "sha-256 AB:CD", "a sha-256 fingerprint has 32 bytes, this one 2"),
    (f"sha-256 {SHA256}", "sha-256 not-hex", "not colon-separated hex"),
    ("c=IN IP4 0.0.0.0", "c=IN IP4", "'c=' takes 'IN IP4 <address>'"),
    ("c=IN IP4 0.0.0.0", "c=IN IP4 ::1", "'::1' is not an IP4 address"),
    ("c=IN IP4 0.0.0.0", "c=IN IP4 300.1.1.1", "neither an IP4 address nor a host name"),
    ("c=IN IP4 0.0.0.0", "c=IN IPX 0.0.0.0", "'c=' takes"),
    ("a=setup:actpass", "a=setup:holdconn", "'a=setup:' is one of"),
    ("a=rtcp:9 IN IP4", "a=rtcp:x IN IP4", "the RTCP port 'x'"),
    ("typ host generation 0 network-id 1", "host", "'a=candidate:' takes"),
    ("a=ssrc:3485940486 cname:", "a=ssrc:3485940486 cname", "'a=ssrc:' takes"),
    ("a=extmap:1 urn", "a=extmap:x urn", "'a=extmap:' takes"),
    ("a=fmtp:63 111/111", "a=fmtp:64 111/111", "payload type 64 has parameters but no a=rtpmap"),
    ("a=rtcp-fb:111 transport-cc", "a=rtcp-fb:111", "'a=rtcp-fb:' takes"),
    ("a=ice-ufrag:Wq1c\r\na=ice-pwd", "a=ice-ufrag:W q\r\na=ice-pwd", "ICE credentials"),
    ("a=max-message-size:262144", "a=max-message-size:lots", "takes a number"),
    ("t=0 0", "t=now", "'t=' takes"),
    ("o=- 4611731400430051336 2 IN IP4", "o=- x 2 IN IP4", "'o=' takes"),
    ("a=mid:0", "x=mid:0", "not an SDP line"),
    ("a=mid:0", "v=0", "'v=0' comes once"),
])
def test_a_malformed_line_is_named(old: str, new: str, reason: str) -> None:
    line = CHROME[:CHROME.index(old)].count("\n") + 1
    message = _refusal(CHROME.replace(old, new, 1))
    assert message.startswith(f"line {line} (") and reason in message, message


def test_fingerprints_the_server_cannot_check_are_refused() -> None:
    sha1 = CHROME.replace(f"a=fingerprint:sha-256 {SHA256}", "a=fingerprint:sha-1 " + ":".join(["AB"] * 20))
    assert "none of sha-256, sha-384, sha-512" in _refusal(sha1)


def test_a_long_line_is_shortened_in_the_message() -> None:
    message = _refusal(CHROME.replace("s=-", "s=" + "x" * 500 + "\x00"))
    assert len(message) < 300 and "..." in message and re.match(r"line 3 \(", message)
