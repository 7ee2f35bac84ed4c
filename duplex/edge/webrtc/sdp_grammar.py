"""Line by line checks of an SDP offer's grammar (RFC 8866 and the WebRTC attributes), so that a
malformed offer is refused with the line and the reason instead of reaching the WebRTC stack,
whose parser asserts (a bare ``AssertionError()``) or, worse, accepts lines that can never work
(a NUL in ``s=``, an unknown fingerprint hash, a ``c=`` line naming no address).

The checks cover what the stack reads from an offer; attributes it ignores are only checked for
the ``a=<name>[:<value>]`` shape."""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Callable

# RFC 8866 types (a parser must ignore a description with a type it does not know)
_TYPES = frozenset("vosiuepcbtrzkam")
_ATTRIBUTE = re.compile(r"^([A-Za-z0-9!#$%&'*+.^_`{|}~-]+)(?::(.*))?$")
_MEDIA = re.compile(r"^(\S+) (\S+) (\S+) (\S.*)$")
_RTPMAP = re.compile(r"^(\S+) ([^/\s]+)/(\S+?)(?:/(\S+))?$")
_HEX_PAIRS = re.compile(r"^[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2})*$")
_ICE_CHARS = re.compile(r"^[A-Za-z0-9+/]+$")
_HOSTNAME = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
# hash functions an SDP fingerprint may name (RFC 8122, IANA) and their digest sizes in bytes
FINGERPRINT_BYTES = {"md2": 16, "md5": 16, "sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48,
                     "sha-512": 64}
VERIFIABLE_FINGERPRINTS = ("sha-256", "sha-384", "sha-512")  # what the DTLS layer can check
_SETUP_ROLES = ("actpass", "active", "passive")
_RTCP_CONFLICT = range(72, 77)  # payload types that read as RTCP packet types (RFC 5761)
MAX_SHOWN = 80  # characters of an offending line quoted back


class SdpLineError(ValueError):
    """One line of the offer is malformed; the message names the line and why."""

    def __init__(self, number: int, line: str, why: str) -> None:
        shown = line if len(line) <= MAX_SHOWN else line[:MAX_SHOWN] + "..."
        super().__init__(f"line {number} ({shown!r}) of the offer: {why}")


def offer_lines(sdp: str) -> list[tuple[int, str]]:
    """(1-based number, text) of each non-empty line. Split at LF only (a CR ends a line only
    before LF), so a stray CR or other separator inside a line is seen and refused."""
    numbered = []
    for number, raw in enumerate(sdp.split("\n"), start=1):
        line = raw.removesuffix("\r")
        if line.strip():
            numbered.append((number, line))
    return numbered


def check_grammar(sdp: str) -> None:
    """Raises SdpLineError at the first malformed line."""
    section = _Section()
    for index, (number, line) in enumerate(offer_lines(sdp)):
        why = _line_problem(line, first=index == 0)
        if why is not None:
            raise SdpLineError(number, line, why)
        if line.startswith("m="):
            section.check()
            section = _Section()
        section.note(number, line)
    section.check()


class _Section:
    """A media section's payload types: an ``a=fmtp`` needs an ``a=rtpmap`` of its payload type
    somewhere in the section (the stack hangs the parameters on that codec; Firefox writes the
    fmtp lines first)."""

    def __init__(self) -> None:
        self.rtpmaps: set[int] = set()
        self.fmtps: list[tuple[int, str, int]] = []  # (line number, line, payload type)

    def note(self, number: int, line: str) -> None:
        if line.startswith(("a=rtpmap:", "a=fmtp:")):  # (their payload types are checked numbers)
            payload_type = int(line.split(":", 1)[1].split(" ", 1)[0])
            if line.startswith("a=rtpmap:"):
                self.rtpmaps.add(payload_type)
            else:
                self.fmtps.append((number, line, payload_type))

    def check(self) -> None:
        for number, line, payload_type in self.fmtps:
            if payload_type not in self.rtpmaps:
                raise SdpLineError(number, line, f"payload type {payload_type} has parameters but no a=rtpmap "
                                                 "in this media section")


def fingerprint_algorithms(sdp: str) -> set[str]:
    """The hash functions of the offer's fingerprints (lower case)."""
    return {line[len("a=fingerprint:"):].split(" ", 1)[0].lower() for _, line in offer_lines(sdp)
            if line.startswith("a=fingerprint:")}


def _line_problem(line: str, first: bool) -> str | None:
    bad = next((ch for ch in line if _is_control(ch)), None)
    if bad is not None:
        return f"it holds a control character ({bad!r}); SDP text may not"
    if len(line) < 2 or line[1] != "=" or line[0] not in _TYPES:
        return "not an SDP line: each line is '<type>=<value>' with a type among v o s i u e p c b t r z k a m"
    kind, value = line[0], line[2:]
    if kind == "v":
        return None if first and value == "0" else "'v=0' comes once, as the first line"
    check = _CHECKS.get(kind)
    return check(value) if check is not None else None


def _is_control(ch: str) -> bool:
    # tab is allowed in SDP text; NUL, CR, LF and the other controls and line separators are not
    return ch != "\t" and (unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029")


def _origin(value: str) -> str | None:
    fields = value.split(" ")
    if len(fields) != 6 or not fields[1].isdigit() or not fields[2].isdigit() or fields[3] != "IN" \
            or fields[4] not in ("IP4", "IP6"):
        return "'o=' takes '<username> <sess-id> <sess-version> IN IP4|IP6 <address>' (ids are numbers)"
    return None


def _connection(value: str) -> str | None:
    fields = value.split(" ")
    if len(fields) != 3 or fields[0] != "IN" or fields[1] not in ("IP4", "IP6"):
        return "'c=' takes 'IN IP4 <address>' or 'IN IP6 <address>'"
    return _address_problem(fields[1], fields[2])


def _address_problem(family: str, address: str) -> str | None:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        if _HOSTNAME.match(address):
            return None  # a name is allowed (RFC 8866); ICE candidates carry the real addresses
        return f"{address!r} is neither an {family} address nor a host name"
    if f"IP{parsed.version}" != family:
        return f"{address!r} is not an {family} address"
    return None


def _timing(value: str) -> str | None:
    return None if re.fullmatch(r"\d+ \d+", value) else "'t=' takes '<start> <stop>' (numbers)"


def _bandwidth(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9_-]+:\d+", value) else "'b=' takes '<type>:<kilobits>'"


def _media(value: str) -> str | None:
    match = _MEDIA.match(value)
    if match is None:
        return "'m=' takes '<media> <port> <protocol> <formats>'"
    kind, port, proto, formats = match.groups()
    if not _in_range(port, 0, 65535):
        why = " (a port count 'port/n' is not supported)" if "/" in port else ""
        return f"the port {port!r} is not a number 0..65535{why}"
    if not re.fullmatch(r"[A-Z/]+", proto):
        return f"the protocol {proto!r} is not an SDP transport (like UDP/TLS/RTP/SAVPF)"
    if kind not in ("audio", "video"):
        return None
    return next((why for why in map(_rtp_payload_type, formats.split()) if why is not None), None)


def _rtp_payload_type(text: str) -> str | None:
    if not _in_range(text, 0, 127):
        return f"the payload type {text!r} is not a number 0..127"
    if int(text) in _RTCP_CONFLICT:
        return f"the payload type {text} collides with RTCP packet types (72..76 are not allowed)"
    return None


def _attribute(value: str) -> str | None:
    match = _ATTRIBUTE.match(value)
    if match is None:
        return "'a=' takes '<attribute>' or '<attribute>:<value>'"
    check = _ATTRIBUTE_CHECKS.get(match.group(1))
    return check(match.group(2) or "") if check is not None else None


def _rtpmap(value: str) -> str | None:
    match = _RTPMAP.match(value)
    if match is None:
        return "'a=rtpmap:' takes '<payload type> <codec>/<clock rate>[/<channels>]'"
    payload_type, _, clock, channels = match.groups()
    why = _rtp_payload_type(payload_type)
    if why is not None:
        return why
    if not _in_range(clock, 1, 10**9):
        return f"the clock rate {clock!r} is not a positive number"
    if channels is not None and not _in_range(channels, 1, 255):
        return f"the channel count {channels!r} is not a number 1..255"
    return None


def _fmtp(value: str) -> str | None:
    payload_type, _, parameters = value.partition(" ")
    if not parameters.strip():
        return "'a=fmtp:' takes '<payload type> <parameters>'"
    return _rtp_payload_type(payload_type)


def _rtcp_feedback(value: str) -> str | None:
    fields = value.split(" ")
    if len(fields) < 2 or not (fields[0] == "*" or _in_range(fields[0], 0, 127)) or not fields[1]:
        return "'a=rtcp-fb:' takes '<payload type or *> <feedback type> [<parameter>]'"
    return None


def _fingerprint(value: str) -> str | None:
    algorithm, _, digest = value.partition(" ")
    size = FINGERPRINT_BYTES.get(algorithm.lower())
    if size is None:
        return (f"unknown fingerprint hash {algorithm!r} (known: {', '.join(FINGERPRINT_BYTES)}; this "
                f"server checks {', '.join(VERIFIABLE_FINGERPRINTS)})")
    if not _HEX_PAIRS.match(digest):
        return "the fingerprint is not colon-separated hex byte pairs"
    if (len(digest) + 1) // 3 != size:
        return f"a {algorithm} fingerprint has {size} bytes, this one {(len(digest) + 1) // 3}"
    return None


def _setup(value: str) -> str | None:
    return None if value in _SETUP_ROLES else f"'a=setup:' is one of {', '.join(_SETUP_ROLES)}"


def _candidate(value: str) -> str | None:
    fields = value.split()
    usage = ("'a=candidate:' takes '<foundation> <component> <transport> <priority> <address> <port> "
             "typ <type> ...' (numbers where numbers go)")
    if len(fields) < 8 or fields[6] != "typ" or not _in_range(fields[1], 1, 256) \
            or not _in_range(fields[3], 0, 2**32 - 1) or not _in_range(fields[5], 0, 65535):
        return usage
    extensions = dict(zip(fields[8::2], fields[9::2], strict=False))
    if "rport" in extensions and not _in_range(extensions["rport"], 0, 65535):
        return f"the candidate's rport {extensions['rport']!r} is not a port number"
    return None


def _extmap(value: str) -> str | None:
    if re.fullmatch(r"\d+(?:/[a-z]+)? \S+", value) is None:
        return "'a=extmap:' takes '<id>[/<direction>] <extension URI>'"
    return None if _in_range(value.split("/")[0].split(" ")[0], 1, 255) else "the extension id is not 1..255"


def _rtcp(value: str) -> str | None:
    port, _, address = value.partition(" ")
    if not _in_range(port, 0, 65535):
        return f"the RTCP port {port!r} is not a number 0..65535"
    return _connection(address) if address else None


def _ssrc(value: str) -> str | None:
    if re.fullmatch(r"\d+ [^:\s]+:.*", value) is None or not _in_range(value.split(" ")[0], 0, 2**32 - 1):
        return "'a=ssrc:' takes '<ssrc> <attribute>:<value>' (the ssrc a 32-bit number)"
    return None


def _ssrc_group(value: str) -> str | None:
    fields = value.split(" ")
    if not all(_in_range(ssrc, 0, 2**32 - 1) for ssrc in fields[1:]):
        return "'a=ssrc-group:' takes '<semantics> <ssrc> ...' (32-bit numbers)"
    return None


def _ice_credential(value: str) -> str | None:
    return None if _ICE_CHARS.match(value) else "ICE credentials are letters, digits, '+' and '/' (RFC 8839)"


def _number(name: str, low: int, high: int) -> Callable[[str], str | None]:
    return lambda value: None if _in_range(value, low, high) else f"'a={name}:' takes a number {low}..{high}"


def _sctpmap(value: str) -> str | None:
    return None if re.fullmatch(r"\d+ \S.*", value) else "'a=sctpmap:' takes '<port> <protocol> ...'"


def _in_range(text: str, low: int, high: int) -> bool:
    return text.isascii() and text.isdigit() and low <= int(text) <= high


_CHECKS: dict[str, Callable[[str], str | None]] = {
    "o": _origin, "c": _connection, "t": _timing, "b": _bandwidth, "m": _media, "a": _attribute}
_ATTRIBUTE_CHECKS: dict[str, Callable[[str], str | None]] = {
    "rtpmap": _rtpmap, "fmtp": _fmtp, "rtcp-fb": _rtcp_feedback, "fingerprint": _fingerprint,
    "setup": _setup, "candidate": _candidate, "extmap": _extmap, "rtcp": _rtcp, "ssrc": _ssrc,
    "ssrc-group": _ssrc_group, "ice-ufrag": _ice_credential, "ice-pwd": _ice_credential,
    "sctp-port": _number("sctp-port", 0, 65535), "max-message-size": _number("max-message-size", 0, 2**53),
    "sctpmap": _sctpmap}
