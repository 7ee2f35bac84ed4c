"""Who may call: a source allowlist by CIDR and optional SIP digest auth (RFC 2617 / 3261 §22).

Nonces are stateless: a timestamp signed with a per-process secret, so a challenge costs no
memory and a forged or expired nonce is recognised without a table.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import secrets
import time

from duplex.edge.sip.headers import parse_auth_params
from duplex.edge.sip.message import SipParseError, SipRequest

NONCE_LIFETIME_S = 300.0


class AuthResult(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no credentials: challenge
    STALE = "stale"  # right password, expired nonce: challenge with stale=true
    REJECTED = "rejected"  # wrong user, password, realm or a forged nonce: challenge again


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


class AccessPolicy:
    def __init__(self, allow: list[str], users: dict[str, str] | None = None,
                 realm: str = "duplex", nonce_lifetime_s: float = NONCE_LIFETIME_S) -> None:
        self.networks = [ipaddress.ip_network(cidr, strict=False) for cidr in allow]
        self.users = dict(users or {})
        self.realm = realm
        self.nonce_lifetime_s = nonce_lifetime_s
        self._secret = secrets.token_bytes(32)

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    def allowed(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def challenge(self, stale: bool = False) -> str:
        nonce = self._make_nonce(time.time())
        value = f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'
        return value + (", stale=true" if stale else "")

    def verify(self, request: SipRequest) -> AuthResult:
        header = request.get("Authorization")
        if header is None:
            return AuthResult.MISSING
        try:
            scheme, params = parse_auth_params(header)
        except SipParseError:
            return AuthResult.REJECTED
        password = self.users.get(params.get("username", ""))
        if scheme != "digest" or password is None or params.get("realm") != self.realm:
            return AuthResult.REJECTED
        if params.get("algorithm", "MD5").upper() != "MD5":
            return AuthResult.REJECTED
        expected = self._expected_response(params, password, request.method)
        if expected is None or not hmac.compare_digest(expected, params.get("response", "")):
            return AuthResult.REJECTED
        nonce_time = self._nonce_time(params.get("nonce", ""))
        if nonce_time is None:
            return AuthResult.REJECTED
        if time.time() - nonce_time > self.nonce_lifetime_s:
            return AuthResult.STALE
        return AuthResult.OK

    def _expected_response(self, params: dict[str, str], password: str, method: str) -> str | None:
        if "uri" not in params or "nonce" not in params:
            return None
        ha1 = _md5(f"{params['username']}:{self.realm}:{password}")
        ha2 = _md5(f"{method}:{params['uri']}")
        qop = params.get("qop")
        if qop is None:
            return _md5(f"{ha1}:{params['nonce']}:{ha2}")
        if qop != "auth" or "nc" not in params or "cnonce" not in params:
            return None
        return _md5(f"{ha1}:{params['nonce']}:{params['nc']}:{params['cnonce']}:{qop}:{ha2}")

    def _make_nonce(self, now: float) -> str:
        stamp = f"{int(now):x}"
        return f"{stamp}.{self._sign(stamp)}"

    def _nonce_time(self, nonce: str) -> float | None:
        stamp, _, signature = nonce.partition(".")
        if not stamp or not hmac.compare_digest(self._sign(stamp), signature):
            return None
        try:
            return float(int(stamp, 16))
        except ValueError:
            return None

    def _sign(self, stamp: str) -> str:
        return hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:32]
