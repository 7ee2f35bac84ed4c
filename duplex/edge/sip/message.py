"""SIP messages (RFC 3261 §7): parse from a UDP datagram, build, serialize.

The parser is strict where a mistake would misroute a call (start line, Content-Length, the
mandatory headers are checked by the UAS) and bounded everywhere (size, header count), so a
hostile datagram costs little and raises ``SipParseError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE = 65535
MAX_HEADERS = 128
SIP_VERSION = "SIP/2.0"

COMPACT_NAMES = {
    "i": "Call-ID", "m": "Contact", "e": "Content-Encoding", "l": "Content-Length",
    "c": "Content-Type", "f": "From", "s": "Subject", "k": "Supported", "t": "To", "v": "Via",
}
# canonical spelling for headers we write or read often; others keep the sender's spelling
CANONICAL = {name.lower(): name for name in (
    "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Max-Forwards", "Content-Type",
    "Content-Length", "Allow", "Accept", "Supported", "User-Agent", "Server", "Warning",
    "WWW-Authenticate", "Authorization", "Record-Route", "Route", "Retry-After", "Require",
    "Unsupported", "Subject", "Content-Encoding", "Reason",
)}
# headers whose comma-separated values are separate entries (RFC 3261 §7.3.1)
LIST_HEADERS = {"via", "route", "record-route", "contact", "allow", "supported", "require"}

_TOKEN = r"[A-Za-z0-9\-.!%*_+`'~]+"
_REQUEST_LINE = re.compile(rf"^({_TOKEN}) (\S+) SIP/2\.0$")
_STATUS_LINE = re.compile(r"^SIP/2\.0 ([1-6]\d\d) ?(.*)$")


class SipParseError(ValueError):
    """A datagram that is not a well-formed SIP message."""


def canonical_name(name: str) -> str:
    lower = name.lower()
    if lower in COMPACT_NAMES:
        return COMPACT_NAMES[lower]
    return CANONICAL.get(lower, name)


def split_list(value: str) -> list[str]:
    """Split a header value on commas outside quotes and angle brackets."""
    parts: list[str] = []
    current: list[str] = []
    quoted, angle = False, 0
    for char in value:
        if char == '"':
            quoted = not quoted
        elif not quoted and char == "<":
            angle += 1
        elif not quoted and char == ">":
            angle = max(0, angle - 1)
        elif char == "," and not quoted and angle == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


@dataclass
class SipMessage:
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def get(self, name: str) -> str | None:
        wanted = canonical_name(name).lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    def get_all(self, name: str) -> list[str]:
        wanted = canonical_name(name).lower()
        return [value for key, value in self.headers if key.lower() == wanted]

    def set(self, name: str, value: str) -> None:
        """Replace every instance of the header with one value (appended if absent)."""
        name = canonical_name(name)
        kept = [(k, v) for k, v in self.headers if k.lower() != name.lower()]
        self.headers = kept + [(name, value)]

    def add(self, name: str, value: str) -> None:
        self.headers.append((canonical_name(name), value))

    @property
    def content_type(self) -> str:
        value = self.get("Content-Type") or ""
        return value.split(";", 1)[0].strip().lower()

    def _serialize(self, start_line: str) -> bytes:
        lines = [start_line]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


@dataclass
class SipRequest(SipMessage):
    method: str = ""
    uri: str = ""

    def serialize(self) -> bytes:
        return self._serialize(f"{self.method} {self.uri} {SIP_VERSION}")


@dataclass
class SipResponse(SipMessage):
    status: int = 0
    reason: str = ""

    def serialize(self) -> bytes:
        return self._serialize(f"{SIP_VERSION} {self.status} {self.reason}")


def parse_message(data: bytes) -> SipRequest | SipResponse:
    if len(data) > MAX_MESSAGE:
        raise SipParseError(f"message of {len(data)} bytes is oversize")
    head, separator, body = data.partition(b"\r\n\r\n")
    if not separator:
        head, separator, body = data.partition(b"\n\n")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SipParseError("header section is not UTF-8") from exc
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[0].strip():  # RFC 3261 §7.5: ignore leading CRLFs (keep-alives)
        lines.pop(0)
    if not lines:
        raise SipParseError("empty message")
    message = _start_line(lines[0].strip())
    message.headers = _header_lines(lines[1:])
    message.body = _checked_body(message, body)
    return message


def _start_line(line: str) -> SipRequest | SipResponse:
    if match := _STATUS_LINE.match(line):
        return SipResponse(status=int(match.group(1)), reason=match.group(2))
    if match := _REQUEST_LINE.match(line):
        uri = match.group(2)
        if ":" not in uri:
            raise SipParseError(f"request URI {uri!r} has no scheme")
        return SipRequest(method=match.group(1).upper(), uri=uri)
    raise SipParseError(f"bad start line {line[:80]!r}")


def _header_lines(lines: list[str]) -> list[tuple[str, str]]:
    unfolded: list[str] = []
    for line in lines:
        if line[:1] in (" ", "\t") and unfolded:  # continuation of the previous header
            unfolded[-1] += " " + line.strip()
        elif line.strip():
            unfolded.append(line)
    if len(unfolded) > MAX_HEADERS:
        raise SipParseError(f"{len(unfolded)} headers is more than {MAX_HEADERS}")
    headers: list[tuple[str, str]] = []
    for line in unfolded:
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not re.fullmatch(_TOKEN, name):
            raise SipParseError(f"bad header line {line[:80]!r}")
        name = canonical_name(name)
        values = split_list(value) if name.lower() in LIST_HEADERS else [value.strip()]
        headers += [(name, v) for v in values]
    return headers


def _checked_body(message: SipMessage, body: bytes) -> bytes:
    declared = message.get("Content-Length")
    if declared is None:
        return body  # optional over UDP: the body is the rest of the datagram
    if not declared.strip().isdigit():
        raise SipParseError(f"bad Content-Length {declared!r}")
    length = int(declared)
    if length > len(body):
        raise SipParseError(f"Content-Length {length} exceeds the {len(body)} bytes received")
    return body[:length]
