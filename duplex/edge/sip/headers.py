"""Structured views of the SIP header values the UAS reads: Via, name-addr, CSeq, URIs,
and the auth-param lists of digest authentication."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from duplex.edge.sip.message import SipParseError

BRANCH_COOKIE = "z9hG4bK"  # RFC 3261 §8.1.1.7: branch ids of compliant UAs start with this


def parse_params(text: str) -> dict[str, str]:
    """';a=b;c' -> {'a': 'b', 'c': ''} (names lower-cased)."""
    params: dict[str, str] = {}
    for part in text.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            params[name.strip().lower()] = value.strip().strip('"')
    return params


@dataclass(frozen=True)
class Via:
    transport: str
    host: str
    port: int | None
    params: dict[str, str] = field(default_factory=dict)

    @property
    def branch(self) -> str:
        return self.params.get("branch", "")


_VIA = re.compile(r"^SIP\s*/\s*2\.0\s*/\s*([A-Za-z]+)\s+(\[[^\]]+\]|[^\s:;]+)(?::(\d+))?\s*(;.*)?$")


def parse_via(value: str) -> Via:
    match = _VIA.match(value.strip())
    if not match:
        raise SipParseError(f"bad Via {value[:80]!r}")
    port = int(match.group(3)) if match.group(3) else None
    if port is not None and not 0 < port < 65536:
        raise SipParseError(f"bad Via port {port}")
    return Via(match.group(1).upper(), match.group(2), port, parse_params(match.group(4) or ""))


@dataclass(frozen=True)
class NameAddr:
    display: str
    uri: str
    params: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return self.params.get("tag", "")


def parse_name_addr(value: str) -> NameAddr:
    value = value.strip()
    if "<" in value:
        display, _, rest = value.partition("<")
        uri, closed, params = rest.partition(">")
        if not closed:
            raise SipParseError(f"unclosed '<' in {value[:80]!r}")
        return NameAddr(display.strip().strip('"'), uri.strip(), parse_params(params))
    # addr-spec form: parameters after the URI belong to the header, not the URI
    uri, _, params = value.partition(";")
    if not uri:
        raise SipParseError("empty address")
    return NameAddr("", uri.strip(), parse_params(params))


@dataclass(frozen=True)
class SipUri:
    scheme: str
    user: str
    host: str
    port: int | None


_URI = re.compile(r"^(sips?):(?:([^@;?]*)@)?(\[[^\]]+\]|[^:;?>]+)(?::(\d+))?")


def parse_uri(value: str) -> SipUri:
    match = _URI.match(value.strip())
    if not match:
        raise SipParseError(f"bad SIP URI {value[:80]!r}")
    port = int(match.group(4)) if match.group(4) else None
    if port is not None and not 0 < port < 65536:
        raise SipParseError(f"bad URI port {port}")
    return SipUri(match.group(1).lower(), match.group(2) or "", match.group(3), port)


def parse_cseq(value: str) -> tuple[int, str]:
    number, _, method = value.strip().partition(" ")
    if not number.isdigit() or not method.strip() or int(number) >= 2**31:
        raise SipParseError(f"bad CSeq {value!r}")
    return int(number), method.strip().upper()


_AUTH_PARAM = re.compile(r'\s*([A-Za-z0-9\-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)\s*,?')


def parse_auth_params(value: str) -> tuple[str, dict[str, str]]:
    """'Digest a="b", c=d' -> ('digest', {'a': 'b', 'c': 'd'})."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = _AUTH_PARAM.match(rest, position)
        if not match:
            raise SipParseError(f"bad auth parameters {rest[position:position + 40]!r}")
        raw = match.group(2)
        params[match.group(1).lower()] = raw[1:-1] if raw.startswith('"') else raw
        position = match.end()
    return scheme.lower(), params
