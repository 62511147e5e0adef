"""Assembly: settings in, a running bot out, and a clean stop on SIGTERM or end of input."""

from __future__ import annotations

import asyncio
import logging
import signal
from urllib.parse import urlparse, urlunparse

from redis.asyncio import BlockingConnectionPool, Redis

import adapters
from adapters.base import Adapter
from bot.cancel import cancel_and_wait
from bot.embedded import EmbeddedRedis
from bot.llm import make_llm
from bot.message import Unavailable
from bot.runtime import Runtime
from bot.settings import ConfigError, Settings
from bot.store import Store
from bot.systemd import notify

log = logging.getLogger("lastword")

# How long shutdown waits for in-flight cycles to hand their leases back.
STOP_TIMEOUT_S = 5.0
# How long shutdown then waits for leftover background work, such as a lease hand-back.
DRAIN_TIMEOUT_S = 1.0


def redact(url: str) -> str:
    """The URL without its password, fit for logs and error messages.

    Works on the raw text (no port parsing), so it cannot fail on a malformed URL, and it
    also hides a `password=` query parameter, which redis-py accepts too.
    """
    parts = urlparse(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    netloc = f"{userinfo}{at}{host}"
    query = "&".join(
        "password=***" if pair.lower().startswith("password=") else pair
        for pair in parts.query.split("&")
    )
    if (netloc, query) == (parts.netloc, parts.query):
        # Unchanged: keep the text as given (urlunparse would turn unix:///x into unix:/x).
        return url
    return urlunparse(parts._replace(netloc=netloc, query=query))


class StartupError(Exception):
    """The bot cannot start; the message is meant for the operator, on one line."""


def make_client(url: str) -> Redis:
    """A client whose pool waits for a free connection when all are busy.

    redis-py's default pool fails with "Too many connections" instead, so a replica with more
    than a hundred conversations due at once would fail cycles and answer a second late.
    """
    pool = BlockingConnectionPool.from_url(
        url, max_connections=100, timeout=10, socket_connect_timeout=2
    )
    return Redis.from_pool(pool)


def make_store(settings: Settings, redis: Redis) -> Store:
    return Store(
        redis,
        quiet_ms=settings.debounce.quiet_ms,
        max_wait_ms=settings.debounce.max_wait_ms,
        ttl_ms=settings.lease.ttl_ms,
        history_cap=settings.history_cap,
        starvation_limit=settings.starvation_limit,
        rate_per_minute=settings.access.rate_per_minute,
    )


async def serve(settings: Settings) -> int:
    # The platform first: a configuration error must not start (and stop) a server for nothing.
    adapter = adapters.create(settings)
    embedded: EmbeddedRedis | None = None
    if settings.redis_url:
        url = settings.redis_url
    else:
        embedded = EmbeddedRedis(settings.data_dir)
        # Started from the main thread on purpose: PR_SET_PDEATHSIG fires when the thread that
        # forked the server ends, so a worker thread's exit would kill the server with it.
        url = embedded.start()
        log.info("embedded store running at %s", url)
    try:
        client = make_client(url)
    except ValueError as exc:
        if embedded:
            embedded.stop()
        # Not the URL itself: it may carry a password, and the error text may quote it.
        raise ConfigError(f"LASTWORD_REDIS_URL: not a valid Redis URL ({redact(url)})") from exc
    store = make_store(settings, client)
    try:
        await store.ping()
    except Unavailable as exc:
        await store.close()
        if embedded:
            embedded.stop()
        raise StartupError(
            f"cannot reach Redis at LASTWORD_REDIS_URL={redact(url)}: {exc}"
        ) from None
    try:
        return await _serve(settings, store, adapter)
    finally:
        await store.close()
        if embedded:
            await asyncio.to_thread(embedded.stop)


async def _serve(settings: Settings, store: Store, adapter: Adapter) -> int:
    provider = settings.llm_provider
    llm = make_llm(settings.llm, provider)
    if provider == "echo" and settings.llm.provider is None:
        log.warning(
            "no LLM configured (set LASTWORD_LLM__BASE_URL and LASTWORD_LLM__API_KEY): "
            "answering with the offline echo model"
        )
    else:
        log.info("LLM: %s, model %s", provider, settings.llm.model)
    runtime = Runtime(settings, store, llm, adapter)
    runtime.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    receiving = asyncio.create_task(adapter.run(runtime), name="adapter")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    notify("READY=1")
    log.info("lastword is running on %s", settings.platform)
    try:
        await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        notify("STOPPING=1")
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        stopping.cancel()
        await cancel_and_wait(receiving)
        # Bounded, so SIGTERM always ends the process in time (SPEC: within 10 s). Whatever
        # did not stop by then is safe in the store; its leases expire on their own.
        halting = asyncio.create_task(runtime.stop(), name="runtime stop")
        _, pending = await asyncio.wait({halting}, timeout=STOP_TIMEOUT_S)
        if pending:
            log.warning("the runtime did not stop within %ss; exiting anyway", STOP_TIMEOUT_S)
        # A cycle cancelled mid-way hands its lease back in a shielded task of its own: let
        # such leftovers finish while the store is still open, briefly.
        leftovers = asyncio.all_tasks() - {asyncio.current_task(), halting}
        if leftovers:
            await asyncio.wait(leftovers, timeout=DRAIN_TIMEOUT_S)
    if not receiving.cancelled() and receiving.exception() is not None:
        raise receiving.exception()  # type: ignore[misc]
    return 0
