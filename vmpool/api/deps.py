"""What the route handlers depend on: the app's state, and who is calling.

Everything one app needs lives in one :class:`ApiState` on ``app.state.vmpool`` (no
module-level state, so several apps share a process, as the tests make them). Handlers
get it through :data:`State`. The kinds of caller identity are dependencies too:
:data:`Token` (``X-AUTH-TOKEN``, for POST and DELETE when ``:auth:`` is configured),
:data:`CheckoutToken` (the same, but optional for a warm-pool VM, as in vmpooler) and
:data:`BasicUser` (HTTP Basic, for the token endpoints). Both refuse with vmpooler's 401
``{"ok": false}``. The Redis work they do runs in FastAPI's thread pool (plain ``def``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import random
import weakref
from dataclasses import dataclass, field
from typing import Annotated, Any

import redis
from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from vmpool.api.create_batch import CreateBatches
from vmpool.api.errors import Rejected
from vmpool.api.ldap_auth import DirectoryUnavailable, ldap_login
from vmpool.api.metrics import ApiMetrics
from vmpool.api.packing import pack_with_hiredis
from vmpool.api.turn_batch import ReadBatches
from vmpool.config import AuthConfig, Config, default_redis_options
from vmpool.ids import InvalidIdentifier, validate_token, validate_user_name
from vmpool.lifecycle.plan import Plans
from vmpool.state.connection import RedisOptions, connect, connect_async
from vmpool.state.direct_pipeline import DirectPipeline
from vmpool.state.durability import ConfirmingAsyncRedis
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings
from vmpool.state.store import Store
from vmpool.state.tokens import (
    TokenInfo,
    TokenStore,
    check_user_rate_limit,
    dummy_hash,
    login_retry_after,
    record_failed_login,
    verify_password,
)
from workers.batching import BatchDispatcher

__all__ = [
    "ApiState",
    "BasicUser",
    "CheckoutToken",
    "LoopClients",
    "RedisClients",
    "State",
    "Token",
    "api_state",
    "authenticate",
    "basic_user",
    "canonical_user",
    "checkout_token",
    "counted",
    "token_auth",
]

log = logging.getLogger(__name__)

REALM = 'Basic realm="Authentication required"'


class LoopClients:
    """One asyncio Redis client (decoding) per event loop, made on first use in it.

    A redis.asyncio connection belongs to the loop it was opened in. Uvicorn runs one
    loop per process, but a test client may run each request in a loop of its own. The
    hot paths (POST /ondemandvm, GET /ondemandvm/<id>) await Redis on the loop: a thread
    hop per request costs more Python than the request's own work (profiled:
    docs/benchmarks.md)."""

    def __init__(self, url: str, options: RedisOptions) -> None:
        self.url = url
        self.options = options
        self._by_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, ConfirmingAsyncRedis
        ] = weakref.WeakKeyDictionary()
        self._pipelines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DirectPipeline] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> ConfirmingAsyncRedis:
        loop = asyncio.get_running_loop()
        client = self._by_loop.get(loop)
        if client is None:
            client = connect_async(self.url, self.options, decode_responses=True)
            pack_with_hiredis(client)
            self._by_loop[loop] = client
        return client

    def pipeline(self) -> DirectPipeline:
        """This loop's pipeline of the hot batches (vmpool.api.turn_batch), on its client."""
        loop = asyncio.get_running_loop()
        pipeline = self._pipelines.get(loop)
        if pipeline is None:
            pipeline = self._pipelines[loop] = DirectPipeline(self.get())
        return pipeline

    async def aclose(self) -> None:
        """Close this loop's client and its pipeline's connection."""
        pipeline = self._pipelines.pop(asyncio.get_running_loop(), None)
        if pipeline is not None:
            pipeline.shut()
        await self.get().aclose()


@dataclass(frozen=True)
class RedisClients:
    """``text`` decodes responses (the store, tokens).

    ``raw`` does not (RQ needs that). ``aio``: the asyncio clients the hot paths await."""

    text: redis.Redis
    raw: redis.Redis
    aio: LoopClients

    @classmethod
    def from_url(cls, url: str, options: RedisOptions | None = None) -> RedisClients:
        """The three clients of the Redis at ``url``, made by the connection factory.

        ``options``: the config's ``:redis:`` settings (None: their defaults)."""
        options = options or default_redis_options()
        return cls(
            connect(url, options, decode_responses=True),
            connect(url, options, decode_responses=False),
            LoopClients(url, options),
        )


@dataclass
class ApiState:
    """One app's config, Redis clients, stores and counters."""

    config: Config
    clients: RedisClients
    keys: Keys
    store: Store
    tokens: TokenStore
    metrics: ApiMetrics
    # The fleet's batching dispatcher: the operator endpoints and the VM tasks queue
    # their jobs through it; POST's creates check its lanes (``creates``).
    batch: BatchDispatcher
    # POST /ondemandvm's creates of a loop turn, in one round trip (routers/ondemand.py).
    creates: CreateBatches
    # GET /ondemandvm/<id>'s reads of a loop turn, in one round trip (routers/ondemand.py).
    status_reads: ReadBatches
    rng: random.Random
    started: float  # time.monotonic() when the app was built (/status's uptime)
    listen_host: str | None = None  # the address served on, when known (/status warns)
    # A new request's settings by (authenticated, priority): the config's, made once each.
    settings_made: dict[tuple[bool, int], RequestSettings] = field(default_factory=dict)
    # POST /ondemandvm's plans against the config (those that pick nothing, made once).
    plans: Plans = field(init=False)

    def __post_init__(self) -> None:
        self.plans = Plans(self.config, self.rng)

    def request_settings(self, *, authenticated: bool, priority: int) -> RequestSettings:
        """The settings a new request is created under (``RequestSettings.from_config``)."""
        made = self.settings_made.get((authenticated, priority))
        if made is None:
            made = RequestSettings.from_config(
                self.config, authenticated=authenticated, priority=priority
            )
            self.settings_made[(authenticated, priority)] = made
        return made


def api_state(request: Request) -> ApiState:
    state = request.app.state.vmpool
    assert isinstance(state, ApiState)
    return state


State = Annotated[ApiState, Depends(api_state)]


def counted(method: str, subject: str, operation: str) -> Any:
    """A route dependency counting the call as vmpooler's ``http_requests_vm_total`` does.

    Declared on the route (``dependencies=[...]``), it runs before the auth dependency,
    so refused calls are counted too, as vmpooler counts them."""

    async def count(request: Request) -> None:
        api_state(request).metrics.count_vm_call(method, subject, operation)

    return Depends(count)


def _unauthorized() -> Rejected:
    return Rejected(401, {"WWW-Authenticate": REALM})


def _well_formed(token: str) -> bool:
    """Whether ``token`` is token text at all (vmpool.ids).

    Anything else is refused with the same 401 as an unknown token, before it is hashed or
    looked up."""
    try:
        validate_token(token)
    except InvalidIdentifier:
        return False
    return True


def token_auth(request: Request) -> TokenInfo | None:
    """The caller's token when auth is on (401 without a valid one, 429 over the rate limit).

    None when auth is off."""
    st = api_state(request)
    auth = st.config.auth
    if auth is None:
        return None
    token = request.headers.get("x-auth-token", "")
    info = st.tokens.lookup(token) if _well_formed(token) else None
    if info is None:
        raise _unauthorized()
    if auth.rate_limit_per_minute:
        # Per user: a user's every token draws on one budget.
        decision = check_user_rate_limit(
            st.clients.text, st.keys, info.user, auth.rate_limit_per_minute
        )
        if not decision.allowed:
            raise Rejected(
                429,
                {"Retry-After": str(decision.retry_after)},
                error="Rate limit exceeded",
                limit=decision.limit,
                period=decision.period,
                retry_after=decision.retry_after,
            )
    return info


Token = Annotated[TokenInfo | None, Depends(token_auth)]


def checkout_token(request: Request) -> TokenInfo | None:
    """The caller's token for a warm-pool VM (checkout, give back), None without one.

    vmpooler hands out warm VMs without a token even with auth on: such a VM gets
    ``vm_lifetime`` and anyone may give it back. A token sent is checked as
    :func:`token_auth` checks it (401 when bad); it gives the VM ``vm_lifetime_auth`` and
    makes it its user's. ``:auth: checkout_requires_token`` asks for one (401)."""
    auth = api_state(request).config.auth
    if auth is None:
        return None
    if "x-auth-token" not in request.headers and not auth.checkout_requires_token:
        return None
    return token_auth(request)


CheckoutToken = Annotated[TokenInfo | None, Depends(checkout_token)]


async def authenticate(request: Request, st: ApiState) -> TokenInfo | None:
    """:func:`token_auth` for a handler that takes the request alone.

    No thread hop when auth is off (nothing to look up), Redis in the thread pool when it
    is on."""
    if st.config.auth is None:
        return None
    return await run_in_threadpool(token_auth, request)


def basic_user(request: Request) -> str:
    """The user of valid HTTP Basic credentials (401 otherwise).

    404 when auth is off (vmpooler has no token endpoints then). 429 with Retry-After
    while the client's address or the user name has too many failed logins (counted in
    Redis, so every replica refuses alike)."""
    st = api_state(request)
    auth = st.config.auth
    if auth is None:
        raise Rejected(404)
    user, password = _basic_credentials(request.headers.get("authorization", ""))
    user = canonical_user(auth, user)
    address = request.client.host if request.client else "unknown"
    r = st.clients.text
    wait = login_retry_after(
        r,
        st.keys,
        user,
        address,
        max_per_user=auth.max_failed_logins_per_user,
        max_per_address=auth.max_failed_logins_per_address,
    )
    if wait:
        log.warning("token: login refused, too many failed logins (user %r)", user)
        raise Rejected(
            429, {"Retry-After": str(wait)}, error="Too many failed logins", retry_after=wait
        )
    try:
        ok = _valid_user_name(user) and _password_ok(auth, user, password)
    except DirectoryUnavailable as exc:  # never a login, nor a failed one
        raise Rejected(503, message=f"{exc}; retry later") from None
    if not ok:
        log.info("token: failed login for user %r", user)
        record_failed_login(r, st.keys, user, address, window_s=auth.failed_login_window_s)
        raise _unauthorized()
    return user


def canonical_user(auth: AuthConfig, user: str) -> str:
    """The one spelling of a login's user name: its budgets, its tokens, its turns.

    A directory matches user names case-insensitively (uid and cn compare with
    caseIgnoreMatch), so ``Alice`` and ``ALICE`` are the one user ``alice``; static users
    are the config's keys, spelt as written."""
    return user.lower() if auth.provider == "ldap" else user


def _valid_user_name(user: str) -> bool:
    """A user name that may become a token's owner (vmpool.ids).

    A refused one is a failed login like a wrong password (the dummy provider would mint
    it a token)."""
    try:
        validate_user_name(user)
    except InvalidIdentifier:
        return False
    return True


BasicUser = Annotated[str, Depends(basic_user)]


def _basic_credentials(header: str) -> tuple[str, str]:
    """(user, password) from an ``Authorization: Basic ...`` header. 401 when malformed."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise _unauthorized()
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise _unauthorized() from None
    user, sep, password = decoded.partition(":")
    if not sep or not user:
        raise _unauthorized()
    return user, password


def _password_ok(auth: AuthConfig, user: str, password: str) -> bool:
    if auth.provider == "dummy":
        return user != password  # vmpooler's dummy provider: anyone but user == password
    if auth.provider == "ldap":
        ok = auth.ldap is not None and ldap_login(auth.ldap, user, password)
        if not ok:  # a failure costs what a static user's does: one PBKDF2
            verify_password(password, dummy_hash(()))
        return ok
    stored = auth.users.get(user)
    if stored is None:
        # The same PBKDF2 a known user's hash runs: a wrong name costs a wrong password's.
        verify_password(password, dummy_hash(auth.users.values()))
        return False
    return verify_password(password, stored)
