"""Our answer to a digest challenge (RFC 2617 / RFC 3261 §22.2): a trunk's 401 or 407 to our
INVITE, answered once with the configured credentials. MD5 only, qop ``auth`` when offered
(what SIP trunks use); anything else is refused with a message naming it."""

from __future__ import annotations

import hashlib
import secrets

from duplex.edge.sip.headers import parse_auth_params
from duplex.edge.sip.message import SipParseError


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def answer_challenge(challenge: str, method: str, uri: str, username: str, password: str) -> str:
    """The Authorization (or Proxy-Authorization) value for ``challenge``; raises SipParseError."""
    scheme, params = parse_auth_params(challenge)
    if scheme != "digest":
        raise SipParseError(f"challenge scheme {scheme!r} is not Digest")
    algorithm = params.get("algorithm", "MD5")
    if algorithm.upper() != "MD5":
        raise SipParseError(f"digest algorithm {algorithm!r} is not supported (MD5 only)")
    realm, nonce = params.get("realm"), params.get("nonce")
    if realm is None or nonce is None:
        raise SipParseError("challenge without realm or nonce")
    ha1 = _md5(f"{username}:{realm}:{password}")
    ha2 = _md5(f"{method}:{uri}")
    fields = [f'username="{username}"', f'realm="{realm}"', f'nonce="{nonce}"', f'uri="{uri}"',
              "algorithm=MD5"]
    qops = [q.strip() for q in params.get("qop", "").split(",") if q.strip()]
    if qops:
        if "auth" not in qops:
            raise SipParseError(f"digest qop {qops} offers no 'auth'")
        cnonce, count = secrets.token_hex(8), "00000001"
        response = _md5(f"{ha1}:{nonce}:{count}:{cnonce}:auth:{ha2}")
        fields += ["qop=auth", f"nc={count}", f'cnonce="{cnonce}"']
    else:
        response = _md5(f"{ha1}:{nonce}:{ha2}")
    fields.append(f'response="{response}"')
    if "opaque" in params:
        fields.append(f'opaque="{params["opaque"]}"')
    return "Digest " + ", ".join(fields)
