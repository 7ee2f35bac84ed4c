"""Checks on an SDP offer before any WebRTC machinery sees it, with messages a client can act on."""

from __future__ import annotations

import re

from duplex.edge.webrtc.sdp_grammar import VERIFIABLE_FINGERPRINTS, SdpLineError, check_grammar, fingerprint_algorithms

MAX_SDP_BYTES = 32 * 1024
_RTPMAP = re.compile(r"^a=rtpmap:(\d+) ([^/\s]+)/(\d+)", re.IGNORECASE)


class OfferError(ValueError):
    """The offer cannot be answered; the message says why (sent back with HTTP 400)."""


def check_offer(sdp: str) -> None:
    if len(sdp.encode()) > MAX_SDP_BYTES:
        raise OfferError(f"SDP offer is larger than {MAX_SDP_BYTES} bytes")
    lines = [line.strip() for line in sdp.strip().splitlines()]
    if not lines or lines[0] != "v=0":
        raise OfferError("not an SDP offer: it must start with 'v=0'")
    try:
        check_grammar(sdp)  # first: the checks below and the WebRTC stack read well-formed lines only
    except SdpLineError as exc:
        raise OfferError(str(exc)) from None
    media = _media_sections(lines)
    audio = [section for section in media if section[0].startswith("m=audio ")]
    if not audio:
        kinds = ", ".join(s[0].split()[0][2:] for s in media) or "none"
        raise OfferError(f"the offer has no audio m-line (media offered: {kinds}); offer a microphone track "
                         "or a recvonly audio transceiver")
    video = [section for section in media if section[0].startswith("m=video ") and section[0].split()[1] != "0"]
    if video:
        raise OfferError("the offer has a video m-line; this server takes audio (and the oai-events channel) only")
    if not any(_offers_opus(section) for section in audio):
        raise OfferError("the offer's audio has no Opus codec (a=rtpmap:<pt> opus/48000/2); Opus is required")
    if not any(line.startswith("a=fingerprint:") for line in lines):
        raise OfferError("the offer has no DTLS fingerprint (a=fingerprint:...)")
    if not fingerprint_algorithms(sdp) & set(VERIFIABLE_FINGERPRINTS):
        raise OfferError(f"the offer's DTLS fingerprints use none of {', '.join(VERIFIABLE_FINGERPRINTS)}, "
                         "the hashes this server can check")
    if not any(line.startswith("a=ice-ufrag:") for line in lines):
        raise OfferError("the offer has no ICE credentials (a=ice-ufrag:...)")


def _media_sections(lines: list[str]) -> list[list[str]]:
    sections: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    return sections


def _offers_opus(section: list[str]) -> bool:
    for line in section[1:]:
        match = _RTPMAP.match(line)
        if match and match.group(2).lower() == "opus" and match.group(3) == "48000":
            return True
    return False
