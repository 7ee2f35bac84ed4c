"""SIP message parsing/serialising, header values, SDP offer/answer, allowlist and digest."""

from __future__ import annotations

import hashlib

import pytest

from duplex.edge.sip.access import AccessPolicy, AuthResult
from duplex.edge.sip.headers import (
    parse_auth_params,
    parse_cseq,
    parse_name_addr,
    parse_uri,
    parse_via,
)
from duplex.edge.sip.message import (
    MAX_MESSAGE,
    SipParseError,
    SipRequest,
    SipResponse,
    parse_message,
)
from duplex.edge.sip.sdp import (
    LocalDescription,
    NoCommonCodec,
    SdpError,
    negotiate,
    parse_sdp,
)

INVITE = (
    b"INVITE sip:agent@127.0.0.1:5060 SIP/2.0\r\n"
    b"v: SIP/2.0/UDP 10.0.0.1:5062;branch=z9hG4bKabc, SIP/2.0/UDP 10.0.0.2;branch=z9hG4bKdef\r\n"
    b"f: \"Bob, the caller\" <sip:bob@example.com>;tag=123\r\n"
    b"t: <sip:agent@127.0.0.1>\r\n"
    b"i: call-1@10.0.0.1\r\n"
    b"CSeq: 7 INVITE\r\n"
    b"Subject: a header folded\r\n over two lines\r\n"
    b"c: application/sdp\r\n"
    b"l: 4\r\n"
    b"\r\n"
    b"v=0\r\nextra bytes past Content-Length"
)


def test_parse_request_with_compact_folded_and_list_headers():
    message = parse_message(INVITE)
    assert isinstance(message, SipRequest) and message.method == "INVITE"
    assert message.uri == "sip:agent@127.0.0.1:5060"
    assert len(message.get_all("Via")) == 2
    assert message.get("From").startswith('"Bob, the caller"')  # comma inside quotes kept
    assert message.get("call-id") == "call-1@10.0.0.1"
    assert message.get("Subject") == "a header folded over two lines"
    assert message.content_type == "application/sdp"
    assert message.body == b"v=0\r"  # trimmed to Content-Length


def test_serialize_round_trip_sets_content_length():
    message = parse_message(INVITE)
    message.body = b"hello"
    again = parse_message(message.serialize())
    assert again.get("Content-Length") == "5" and again.body == b"hello"
    assert again.get_all("Via") == message.get_all("Via")
    response = SipResponse(status=486, reason="Busy Here")
    response.add("Call-ID", "x")
    assert parse_message(response.serialize()).status == 486


@pytest.mark.parametrize("data", [
    b"", b"\r\n\r\n", b"GARBAGE\r\n\r\n", b"INVITE sip:x SIP/1.0\r\n\r\n",
    b"INVITE nocolon SIP/2.0\r\n\r\n", b"SIP/2.0 99 Low\r\n\r\n",
    b"OPTIONS sip:a@b SIP/2.0\r\nBad Header Line\r\n\r\n",
    b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: -1\r\n\r\n",
    b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: 10\r\n\r\nshort",
    b"OPTIONS sip:a@b SIP/2.0\r\nX: \xff\xfe\r\n\r\n",
    b"OPTIONS sip:a@b SIP/2.0\r\n" + b"X: y\r\n" * 200 + b"\r\n",
    b"A" * (MAX_MESSAGE + 1),
])
def test_parse_rejects(data):
    with pytest.raises(SipParseError):
        parse_message(data)


def test_header_values():
    via = parse_via("SIP/2.0/UDP [2001:db8::1]:5070;branch=z9hG4bKx;rport;received=1.2.3.4")
    assert (via.transport, via.host, via.port, via.branch) == ("UDP", "[2001:db8::1]", 5070,
                                                               "z9hG4bKx")
    assert via.params["rport"] == "" and parse_via("SIP/2.0/TCP host").port is None
    for bad in ("SIP/2.0 host", "SIP/2.0/UDP host:99999", "nonsense"):
        with pytest.raises(SipParseError):
            parse_via(bad)
    address = parse_name_addr('"Alice" <sip:alice@a.example;transport=udp>;tag=9')
    assert (address.display, address.uri, address.tag) == (
        "Alice", "sip:alice@a.example;transport=udp", "9")
    bare = parse_name_addr("sip:bob@b.example;tag=4")
    assert bare.uri == "sip:bob@b.example" and bare.tag == "4"
    with pytest.raises(SipParseError):
        parse_name_addr("<sip:unclosed")
    uri = parse_uri("sip:carol@192.0.2.1:5080;transport=udp")
    assert (uri.user, uri.host, uri.port) == ("carol", "192.0.2.1", 5080)
    assert parse_cseq("12 invite") == (12, "INVITE")
    for bad in ("x INVITE", "12", "99999999999 INVITE"):
        with pytest.raises(SipParseError):
            parse_cseq(bad)
    scheme, params = parse_auth_params('Digest username="a, b", realm=r, nc=00000001')
    assert scheme == "digest" and params == {"username": "a, b", "realm": "r", "nc": "00000001"}


OFFER = b"""v=0\r
o=caller 1 1 IN IP4 192.0.2.10\r
s=-\r
c=IN IP4 192.0.2.10\r
t=0 0\r
m=audio 49170 RTP/AVP 18 8 0 101\r
a=rtpmap:18 G729/8000\r
a=rtpmap:101 telephone-event/8000\r
a=fmtp:101 0-15\r
a=ptime:20\r
m=video 51372 RTP/AVP 96\r
a=rtpmap:96 H264/90000\r
"""


def test_negotiate_picks_first_supported_in_offer_order():
    offer = parse_sdp(OFFER)
    agreed = negotiate(offer)
    assert (agreed.codec, agreed.payload_type, agreed.dtmf_payload_type) == ("PCMA", 8, 101)
    assert (agreed.remote_address, agreed.remote_port, agreed.direction) == (
        "192.0.2.10", 49170, "sendrecv")


def test_answer_mirrors_every_m_line_and_versions_only_on_change():
    offer = parse_sdp(OFFER)
    local = LocalDescription("127.0.0.1")
    answer = local.answer(offer, negotiate(offer), 20000).decode()
    lines = answer.splitlines()
    assert "m=audio 20000 RTP/AVP 8 101" in lines and "m=video 0 RTP/AVP 96" in lines
    assert "a=rtpmap:8 PCMA/8000" in lines and "a=ptime:20" in lines
    parsed = parse_sdp(answer.encode())
    assert len(parsed.media) == 2 and parsed.connection == "127.0.0.1"
    again = local.answer(offer, negotiate(offer), 20000).decode()
    assert again == answer  # unchanged session: same version (RFC 3264 §8)
    moved = local.answer(offer, negotiate(offer), 20002).decode()
    assert [ln for ln in moved.splitlines() if ln.startswith("o=")][0].split()[2] == "2"


def test_static_payloads_need_no_rtpmap_and_direction_mirrors():
    offer = parse_sdp(b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nt=0 0\r\n"
                      b"m=audio 4000 RTP/AVP 0\r\nc=IN IP4 1.2.3.5\r\na=sendonly\r\n")
    agreed = negotiate(offer)
    assert agreed.codec == "PCMU" and agreed.remote_address == "1.2.3.5"
    assert agreed.direction == "recvonly"


@pytest.mark.parametrize("body", [
    b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\n"
    b"m=audio 4000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n",
    b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\n"
    b"m=audio 4000 RTP/AVP 96\r\na=rtpmap:96 PCMU/16000\r\n",  # PCMU at the wrong rate
    b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\n"
    b"m=audio 4000 RTP/SAVP 0\r\n",  # SRTP only
    b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\n"
    b"m=video 4000 RTP/AVP 96\r\n",
])
def test_no_common_codec(body):
    with pytest.raises(NoCommonCodec):
        negotiate(parse_sdp(body))


def test_missing_connection_is_an_sdp_error():
    with pytest.raises(SdpError):
        negotiate(parse_sdp(b"v=0\r\no=x 1 1 IN IP4 1.2.3.4\r\ns=-\r\nt=0 0\r\n"
                            b"m=audio 4000 RTP/AVP 0\r\n"))


def test_allowlist_cidrs():
    policy = AccessPolicy(["127.0.0.0/8", "10.1.0.0/16", "::1/128"])
    assert policy.allowed("127.0.0.5") and policy.allowed("10.1.200.3") and policy.allowed("::1")
    assert not policy.allowed("10.2.0.1") and not policy.allowed("8.8.8.8")
    assert not policy.allowed("not-an-address")
    with pytest.raises(ValueError):
        AccessPolicy(["10.0.0.0/33"])


def _credentials(user, password, realm, nonce, uri="sip:agent@x", method="INVITE",
                 qop=True) -> str:
    ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()
    ha2 = hashlib.md5(f"{method}:{uri}".encode()).hexdigest()
    if qop:
        digest = hashlib.md5(f"{ha1}:{nonce}:00000001:c:auth:{ha2}".encode()).hexdigest()
        extra = ", qop=auth, nc=00000001, cnonce=\"c\""
    else:
        digest = hashlib.md5(f"{ha1}:{nonce}:{ha2}".encode()).hexdigest()
        extra = ""
    return (f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", '
            f'response="{digest}"{extra}')


def _request_with(authorization: str | None) -> SipRequest:
    request = SipRequest(method="INVITE", uri="sip:agent@x")
    if authorization:
        request.add("Authorization", authorization)
    return request


def test_digest_verify():
    policy = AccessPolicy(["127.0.0.0/8"], {"alice": "pw"}, realm="r")
    nonce = parse_auth_params(policy.challenge())[1]["nonce"]
    assert policy.verify(_request_with(None)) is AuthResult.MISSING
    assert policy.verify(_request_with(_credentials("alice", "pw", "r", nonce))) is AuthResult.OK
    rfc2069 = _credentials("alice", "pw", "r", nonce, qop=False)
    assert policy.verify(_request_with(rfc2069)) is AuthResult.OK
    for bad in (_credentials("alice", "wrong", "r", nonce),
                _credentials("mallory", "pw", "r", nonce),
                _credentials("alice", "pw", "other-realm", nonce),
                _credentials("alice", "pw", "r", "5f000000.forged"),
                'Digest username="alice"', "Basic YWxpY2U6cHc=", 'Digest ,,,"'):
        assert policy.verify(_request_with(bad)) is AuthResult.REJECTED
    other_server = AccessPolicy(["127.0.0.0/8"], {"alice": "pw"}, realm="r")
    foreign = parse_auth_params(other_server.challenge())[1]["nonce"]
    assert policy.verify(_request_with(_credentials("alice", "pw", "r", foreign))) \
        is AuthResult.REJECTED


def test_digest_expired_nonce_is_stale():
    policy = AccessPolicy(["127.0.0.0/8"], {"alice": "pw"}, realm="r", nonce_lifetime_s=-1)
    nonce = parse_auth_params(policy.challenge())[1]["nonce"]
    assert policy.verify(_request_with(_credentials("alice", "pw", "r", nonce))) \
        is AuthResult.STALE
    assert "stale=true" in policy.challenge(stale=True)
