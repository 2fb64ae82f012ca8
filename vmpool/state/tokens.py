"""API tokens, password hashes and the per-token rate limit.

Tokens look like vmpooler's: 32 characters of ``[a-z0-9]``, the first a letter. Only
``sha256(token)`` is stored (``keys.token(sha)``: a hash with ``user``, ``created``,
``last``). The plain token is shown once, to whoever minted it, and never logged.

Password hashes in the config (``:auth: users:``) take one of two forms:

* ``pbkdf2_sha256$<iterations>$<salt>$<hex>``: PBKDF2-HMAC-SHA256 of the UTF-8 password
  with the UTF-8 salt. ``hash_password`` writes these.
* ``sha256$<salt>$<hex>``: ``sha256(salt + password)``, for configs written by hand.

Every comparison is constant-time (``hmac.compare_digest``). A login for an unknown
user is checked against :func:`dummy_hash`, so it runs the PBKDF2 a known user's does.

Tokens may expire (``:auth: token_ttl``: the hash gets a TTL). A user's tokens are
bounded. ``P:user-tokens:<sha256 of the user>`` indexes them, and minting one more than
``max_tokens_per_user`` drops the oldest. Clients that mint a token per run keep
working, and one user cannot fill Redis.

Two counters refuse a caller with 429:

- The POST/DELETE calls of one *user* per minute (:func:`check_user_rate_limit`). It
  counts per user, so minting more tokens buys no more calls.
- Failed logins per client address and per user name in a TTL window
  (:func:`login_retry_after`, :func:`record_failed_login`).

Both live in Redis, so every API replica shares them. User names and addresses appear
in keys only as SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.ops import Op, new_op, once_text, retry_window_s

_SCRIPTS = "vmpool.state.scripts"

__all__ = [
    "PBKDF2_ITERATIONS",
    "MintedToken",
    "RateDecision",
    "TokenInfo",
    "TokenStore",
    "check_rate_limit",
    "check_user_rate_limit",
    "dummy_hash",
    "generate_token",
    "hash_password",
    "login_retry_after",
    "record_failed_login",
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
    """True when ``password`` matches ``stored`` (either supported form). Never raises."""
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


def dummy_hash(stored: Iterable[str]) -> str:
    """A hash no password matches, costing what the costliest of ``stored`` does.

    A login for an unknown user is verified against it. It runs the same PBKDF2 (the same
    iterations) as a wrong password for a known user, so timing tells no names.
    """
    iterations = 0
    for value in stored:
        parts = value.split("$")
        if parts[0] == "pbkdf2_sha256" and len(parts) == 4 and parts[1].isdigit():
            iterations = max(iterations, int(parts[1]))
    if iterations == 0 and any(value.startswith("sha256$") for value in stored):
        return "sha256$dummy$" + "0" * 64
    return f"pbkdf2_sha256${min(iterations or PBKDF2_ITERATIONS, 10_000_000)}$dummy${'0' * 64}"


def generate_token() -> str:
    """A new token: 32 characters of [a-z0-9], the first a letter (as vmpooler's)."""
    return secrets.choice(_FIRST) + "".join(secrets.choice(_REST) for _ in range(TOKEN_LENGTH - 1))


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    sha256: str
    user: str
    created: str
    last: str
    expires: str = ""  # seconds since the epoch, as text. "" for none


@dataclass(frozen=True)
class MintedToken:
    token: str  # the plain token: shown once, never stored or logged
    expires: float | None  # seconds since the epoch (the Redis server's clock). None: never
    dropped: int  # older tokens of the user dropped to stay within the bound
    sealed: str = ""  # the sealed token the operation recorded (a repeat: the first one's)


class TokenStore:
    """Tokens in Redis, stored by their SHA-256 only.

    A mint and a revoke are answered once per operation id (:mod:`vmpool.state.ops`):
    the caller's ``op``, else one made for the call.
    """

    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self.redis = redis_client
        self.keys = keys
        self._touch = redis_client.register_script(read_script(_SCRIPTS, "token_touch.lua"))
        self._revoke = redis_client.register_script(
            once_text(read_script(_SCRIPTS, "token_revoke.lua"))
        )
        self._create = redis_client.register_script(
            once_text(read_script(_SCRIPTS, "token_create.lua"))
        )
        self._op_ttl_s = retry_window_s(redis_client)

    def _op_args(self, op: Op | None) -> list[str | int]:
        return (op or new_op(self._op_ttl_s)).argv(self.keys)

    def _now(self) -> str:
        seconds, micros = self.redis.time()
        return f"{float(seconds) + float(micros) / 1e6:.6f}"

    def create(self, user: str, *, ttl_s: float | None = None, max_tokens: int = 100) -> str:
        """Mint a token for ``user``. Returns the plain token (shown once, never stored)."""
        return self.mint(user, ttl_s=ttl_s, max_tokens=max_tokens).token

    def mint(
        self,
        user: str,
        *,
        ttl_s: float | None = None,
        max_tokens: int = 100,
        seal: Callable[[str], str] | None = None,
        op: Op | None = None,
    ) -> MintedToken:
        """Mint a token for ``user`` that lives ``ttl_s`` seconds (None: until revoked).

        Beyond ``max_tokens`` live tokens of the user, the oldest are dropped. ``op``: as
        for the class. ``seal``: seals the new token for the caller; the sealed token is
        recorded with the operation, and a repeat of ``op`` stores nothing and answers the
        first call's (``MintedToken.sealed``: the caller unseals it).
        """
        if not user:
            raise ValueError("user must not be empty")
        if max_tokens < 1 or (ttl_s is not None and ttl_s <= 0):
            raise ValueError("max_tokens and ttl_s must be positive")
        token = generate_token()
        sha = token_sha256(token)
        now = self._now()
        ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        expires = None if ttl_s is None else float(now) + ttl_ms / 1000
        reply = self._create(
            keys=[self.keys.token(sha), self.keys.user_tokens(_sha(user))],
            args=[
                user,
                now,
                ttl_ms,
                max_tokens,
                self.keys.token_prefix(),
                sha,
                "" if expires is None else f"{expires:.6f}",
                seal(token) if seal else "",
                *self._op_args(op),
            ],
        )
        return MintedToken(token, expires, int(reply[1]), _text(reply[2]))

    def lookup(self, token: str, *, touch: bool = True) -> TokenInfo | None:
        """The token's record, or None. ``touch`` records the time of use in ``last``."""
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
        return TokenInfo(
            sha,
            data["user"],
            data.get("created", ""),
            data.get("last", ""),
            data.get("expires", ""),
        )

    def of_user(self, user: str) -> list[TokenInfo]:
        """The user's live tokens, oldest first, from their index (no scan).

        Only the hashes are known: ``TokenInfo.sha256`` stands for each token.
        """
        shas = [_text(s) for s in self.redis.zrange(self.keys.user_tokens(_sha(user)), 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for sha in shas:
            pipe.hgetall(self.keys.token(sha))
        out = []
        for sha, raw in zip(shas, pipe.execute() if shas else [], strict=True):
            data = {_text(k): _text(v) for k, v in raw.items()}
            if data.get("user") == user:
                out.append(
                    TokenInfo(
                        sha,
                        user,
                        data.get("created", ""),
                        data.get("last", ""),
                        data.get("expires", ""),
                    )
                )
        return out

    def revoke(self, token: str, *, user: str | None = None, op: Op | None = None) -> bool:
        """Delete the token. With ``user``, only if it belongs to that user.

        ``op``: as for the class."""
        if user == "":
            raise ValueError("user must not be empty (None revokes any user's token)")
        key = self.keys.token(token_sha256(token))
        deleted = self._revoke(keys=[key], args=[user or "", *self._op_args(op)])
        return int(deleted) > 0


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    period: int
    retry_after: int


def check_user_rate_limit(
    redis_client: redis.Redis, keys: Keys, user: str, limit_per_minute: int
) -> RateDecision:
    """Count one call of ``user`` in the current minute. Refuse over the limit.

    Every token of the user counts alike. Refused once the count exceeds
    ``limit_per_minute``.
    """
    return _count_call(
        redis_client, lambda w: keys.user_rate_limit(_sha(user), w), limit_per_minute
    )


def check_rate_limit(
    redis_client: redis.Redis, keys: Keys, token_sha: str, limit_per_minute: int
) -> RateDecision:
    """Count one call of the token in the current minute. Refuse over the limit.

    The window is fixed, in Redis, on the server's clock. Refused once the count exceeds
    ``limit_per_minute``. The API counts per user (:func:`check_user_rate_limit`).
    """
    return _count_call(redis_client, lambda w: keys.rate_limit(token_sha, w), limit_per_minute)


def _count_call(
    redis_client: redis.Redis, key_of: Callable[[int], str], limit_per_minute: int
) -> RateDecision:
    seconds, _micros = redis_client.time()
    now = int(seconds)
    window = now // RATE_PERIOD_S
    key = key_of(window)
    pipe = redis_client.pipeline(transaction=True)
    pipe.incr(key)
    pipe.expire(key, RATE_PERIOD_S * 2)
    count = int(pipe.execute()[0])
    retry_after = max(1, (window + 1) * RATE_PERIOD_S - now)
    return RateDecision(count <= limit_per_minute, limit_per_minute, RATE_PERIOD_S, retry_after)


# -- failed logins -------------------------------------------------------------------------


def _login_keys(keys: Keys, user: str, address: str) -> list[str]:
    return [keys.login_failures("address", _sha(address)), keys.login_failures("user", _sha(user))]


def login_retry_after(
    redis_client: redis.Redis,
    keys: Keys,
    user: str,
    address: str,
    *,
    max_per_user: int,
    max_per_address: int,
) -> int:
    """Seconds until ``user`` may try again from ``address`` (0: now).

    Non-zero while either has ``max_per_...`` failed logins in its window. Checked before
    the password, so a limited caller costs no PBKDF2.
    """
    pipe = redis_client.pipeline(transaction=False)
    for key in _login_keys(keys, user, address):
        pipe.get(key)
        pipe.pttl(key)
    addr_count, addr_ttl, user_count, user_ttl = pipe.execute()
    wait_ms = 0
    for count, ttl, limit in (
        (addr_count, addr_ttl, max_per_address),
        (user_count, user_ttl, max_per_user),
    ):
        if count is not None and int(count) >= limit:
            wait_ms = max(wait_ms, int(ttl) if int(ttl) > 0 else 1000)
    return 0 if wait_ms == 0 else max(1, -(-wait_ms // 1000))


def record_failed_login(
    redis_client: redis.Redis, keys: Keys, user: str, address: str, *, window_s: float
) -> None:
    """Count one failed login against ``address`` and ``user``.

    One script. Each count gets its TTL window with its first failure.
    """
    script = redis_client.register_script(read_script(_SCRIPTS, "login_failed.lua"))
    script(keys=_login_keys(keys, user, address), args=[max(1, round(window_s * 1000))])
