"""API tokens, password hashes and the per-token rate limit.

Tokens look like vmpooler's: 32 characters of ``[a-z0-9]``, the first a letter. Only
``sha256(token)`` is stored (``keys.token(sha)``: a hash with ``user``, ``created``,
``last``); the plain token is shown once, to whoever minted it, and never logged.

Password hashes in the config (``:auth: users:``) take one of two forms:

* ``pbkdf2_sha256$<iterations>$<salt>$<hex>``: PBKDF2-HMAC-SHA256 of the UTF-8 password
  with the UTF-8 salt (``hash_password`` writes these);
* ``sha256$<salt>$<hex>``: ``sha256(salt + password)``, for configs written by hand.

Every comparison is constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass
from typing import Any

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

_SCRIPTS = "vmpool.state.scripts"

__all__ = [
    "PBKDF2_ITERATIONS",
    "RateDecision",
    "TokenInfo",
    "TokenStore",
    "check_rate_limit",
    "generate_token",
    "hash_password",
    "token_sha256",
    "verify_password",
]

PBKDF2_ITERATIONS = 600_000
TOKEN_LENGTH = 32
_FIRST = string.ascii_lowercase
_REST = string.ascii_lowercase + string.digits
RATE_PERIOD_S = 60


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def hash_password(
    password: str, *, iterations: int = PBKDF2_ITERATIONS, salt: str | None = None
) -> str:
    """A ``pbkdf2_sha256$iterations$salt$hex`` hash of ``password`` for the config file."""
    if iterations < 1:
        raise ValueError("iterations must be positive")
    salt = salt if salt is not None else secrets.token_hex(16)
    if not salt or "$" in salt:
        raise ValueError("salt must be non-empty and contain no '$'")
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"pbkdf2_sha256${iterations}${salt}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """True when ``password`` matches ``stored`` (either supported form); never raises."""
    try:
        candidate = password.encode("utf-8")
        parts = stored.split("$")
        if parts[0] == "pbkdf2_sha256" and len(parts) == 4:
            iterations = int(parts[1])
            if not 1 <= iterations <= 10_000_000:
                return False
            digest = hashlib.pbkdf2_hmac("sha256", candidate, parts[2].encode(), iterations)
            return hmac.compare_digest(digest.hex(), parts[3].lower())
        if parts[0] == "sha256" and len(parts) == 3:
            digest = hashlib.sha256(parts[1].encode() + candidate).digest()
            return hmac.compare_digest(digest.hex(), parts[2].lower())
    except (ValueError, UnicodeError):
        return False
    return False


def generate_token() -> str:
    """A new token: 32 characters of [a-z0-9], the first a letter (as vmpooler's)."""
    return secrets.choice(_FIRST) + "".join(secrets.choice(_REST) for _ in range(TOKEN_LENGTH - 1))


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    sha256: str
    user: str
    created: str
    last: str


class TokenStore:
    """Tokens in Redis, stored by their SHA-256 only."""

    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self.redis = redis_client
        self.keys = keys
        self._touch = redis_client.register_script(read_script(_SCRIPTS, "token_touch.lua"))
        self._revoke_own = redis_client.register_script(
            read_script(_SCRIPTS, "token_revoke_own.lua")
        )

    def _now(self) -> str:
        seconds, micros = self.redis.time()
        return f"{float(seconds) + float(micros) / 1e6:.6f}"

    def create(self, user: str) -> str:
        """Mint a token for ``user``; returns the plain token (shown once, never stored)."""
        if not user:
            raise ValueError("user must not be empty")
        token = generate_token()
        self.redis.hset(
            self.keys.token(token_sha256(token)),
            mapping={"user": user, "created": self._now(), "last": ""},
        )
        return token

    def lookup(self, token: str, *, touch: bool = True) -> TokenInfo | None:
        """The token's record, or None; ``touch`` records the time of use in ``last``."""
        if not token:
            return None
        sha = token_sha256(token)
        key = self.keys.token(sha)
        raw = self.redis.hgetall(key)
        if not raw:
            return None
        data = {_text(k): _text(v) for k, v in raw.items()}
        if not data.get("user"):
            return None
        if touch:
            # HSET only if the token still exists: a revoke racing with this use must
            # not be undone by a write that recreates the hash.
            self._touch(keys=[key], args=[self._now()])
        return TokenInfo(sha, data["user"], data.get("created", ""), data.get("last", ""))

    def revoke(self, token: str, *, user: str | None = None) -> bool:
        """Delete the token; with ``user``, only if it belongs to that user."""
        key = self.keys.token(token_sha256(token))
        if user is None:
            return int(self.redis.delete(key)) > 0
        deleted = self._revoke_own(keys=[key], args=[user])
        return int(deleted) > 0


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    period: int
    retry_after: int


def check_rate_limit(
    redis_client: redis.Redis, keys: Keys, token_sha: str, limit_per_minute: int
) -> RateDecision:
    """Count one call of the token in the current minute (a fixed window in Redis, on the
    server's clock); refuse once the count exceeds ``limit_per_minute``."""
    seconds, _micros = redis_client.time()
    now = int(seconds)
    window = now // RATE_PERIOD_S
    key = keys.rate_limit(token_sha, window)
    pipe = redis_client.pipeline(transaction=True)
    pipe.incr(key)
    pipe.expire(key, RATE_PERIOD_S * 2)
    count = int(pipe.execute()[0])
    retry_after = max(1, (window + 1) * RATE_PERIOD_S - now)
    return RateDecision(count <= limit_per_minute, limit_per_minute, RATE_PERIOD_S, retry_after)
