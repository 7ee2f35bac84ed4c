"""Where duplex may send a call: a placed call's target, a transfer's Refer-To. One SIP URI that
cannot break out of its header, matching a pattern of the operator's allowlist (empty: nowhere),
so neither an API caller nor a talked-into agent can reach a number the operator did not mean."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from duplex.edge.sip.headers import parse_uri
from duplex.edge.sip.message import SipParseError

# nothing that could end a header or start another (CR, LF, <, >, "), and no sips: (no TLS here)
_TARGET = re.compile(r'sip:[^\s<>"]{1,250}')


class TargetRefused(Exception):
    """``code``: invalid_target (400), outbound_disabled or target_not_allowed (403)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def check_target(target: str, allow: list[str]) -> str:
    """``target`` if duplex may call it; raises TargetRefused naming why not."""
    if not allow:
        raise TargetRefused(403, "outbound_disabled", "this server sends calls nowhere: no target is allowed "
                                                      "(configure sip.outbound.allow / --sip-outbound-allow)")
    if not _TARGET.fullmatch(target):
        raise TargetRefused(400, "invalid_target", "a target must be one sip: URI without spaces, quotes or angle "
                                                   f"brackets (sips: is not supported), got {target[:80]!r}")
    try:
        parse_uri(target)
    except SipParseError as exc:
        raise TargetRefused(400, "invalid_target", str(exc)) from None
    if not any(fnmatchcase(target, pattern) for pattern in allow):
        raise TargetRefused(403, "target_not_allowed", f"{target!r} matches no pattern of this server's "
                                                       "outbound allowlist")
    return target
