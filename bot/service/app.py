"""Assembly: settings in, a running bot out, and a clean stop on SIGTERM or end of input."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

import adapters
from adapters.base import Adapter, introduction, login, refused
from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.config.credentials import REPORT_EVERY_S
from bot.config.secrets import secrets_of
from bot.config.settings import ConfigError, Settings, load_settings
from bot.core.runtime import Runtime
from bot.llm.base import LLM, Keyed
from bot.llm.factory import make_llm
from bot.llm.transcribe import Transcriber, make_transcriber
from bot.masking import Scrub, store_url
from bot.message import Unavailable
from bot.service.logs import write_counts
from bot.service.metrics import HealthServer
from bot.service.supervisor import Supervisor
from bot.service.systemd import notify, under_systemd, watchdog_interval_s
from bot.store import Store, StoreSettings, reaching_redis
from bot.store.connect import Client, NotRedis, open_client
from bot.store.durability import Refused, describe, embedded_appendfsync
from bot.store.embedded import EmbeddedRedis, store_dir
from bot.tools.load import load_toolbox

log = logging.getLogger("lastword")

# After the grace period, how long shutdown waits for the cycles still running to hand their
# leases back. With the default grace (8 s) and the drain below, SIGTERM ends the process
# within 10 s, as SPEC requires.
STOP_TIMEOUT_S = 1.0
# How long shutdown then waits for leftover background work, such as a lease hand-back.
DRAIN_TIMEOUT_S = 0.5
# The collector's first generation: CPython's default is 700 allocations. A flooded replica
# makes short-lived objects by the thousand per second; a larger first generation lets them die
# before they are promoted and walked again (helper A2's measure on benchmarks.flood: the
# collector's time in one run from 3.2 s to 0.4 s, the longest pause from 232 to 33 ms).
GC_GEN0_THRESHOLD = 10_000
# How often systemd hears what this replica is doing (STATUS=), at most.
STATUS_INTERVAL_S = 5.0
# Under systemd, how long start-up waits for a shared Redis to come (back) up before failing.
# Below the units' start timeout (90 s), and long enough that a Redis restart or a short
# outage never exhausts their restart limit (10 starts in 10 minutes).
STARTUP_WAIT_S = 60.0
# How long start-up waits for the platform to say whether it takes the bot's token. One that
# does not answer in time is no configuration error: the intake keeps trying.
LOGIN_TIMEOUT_S = 20.0
# How long one check of an LLM or transcription key (GET /models) may take.
KEY_PROBE_TIMEOUT_S = 10.0


class StartupError(Exception):
    """The bot cannot start; the message is meant for the operator, on one line."""


def make_store(settings: Settings, redis: Client) -> Store:
    return Store(redis, StoreSettings.of(settings))


async def serve(settings: Settings) -> int:
    # The platform first: a configuration error must not start (and stop) a server for nothing.
    adapter = adapters.create(settings)
    await _log_in(adapter, settings.platform)
    # Among the first lines: which bot this is, and where people talk to it.
    log.info("%s", introduction(adapter))
    embedded: EmbeddedRedis | None = None
    if settings.redis_url:
        url = settings.redis_url
    else:
        fsync = embedded_appendfsync(settings.durability)
        folder = store_dir(settings)
        _point_to_old_history(settings, folder)
        embedded = EmbeddedRedis(folder, appendfsync=fsync)
        # Started from the main thread on purpose: PR_SET_PDEATHSIG fires when the thread that
        # forked the server ends, so a worker thread's exit would kill the server with it.
        url = embedded.start()
        log.info("embedded store running at %s", url)
    try:
        store = await _reach(settings, url, patient=embedded is None and under_systemd())
    except ValueError as exc:
        if embedded:
            embedded.stop()
        # A server there that is no Redis lastword can use says why, never quoting the URL.
        why = str(exc) if isinstance(exc, NotRedis) else "not a valid Redis URL"
        # Not the library's words otherwise: they may quote the URL, password and all.
        raise ConfigError(f"LASTWORD_REDIS_URL={store_url(url)}: {why}") from None
    except Unavailable as exc:
        if embedded:
            embedded.stop()
        raise StartupError(
            f"cannot reach Redis at LASTWORD_REDIS_URL={store_url(url)}: {exc}"
        ) from None
    try:
        await _check_durability(store, settings, embedded=embedded is not None)
        await _check_layout(store)
        await _spread_access(store)
        return await _serve(settings, store, adapter)
    finally:
        await store.close()
        if embedded:
            await asyncio.to_thread(embedded.stop)
        # Before any line that ends the process: the counts of what the storm held back.
        write_counts(everything=True)


def _point_to_old_history(settings: Settings, folder: Path) -> None:
    """Once, when the console first keeps its store in a folder of its own: where the history
    of earlier console sessions still is. It is not moved, as it may be an installed bot's."""
    if folder == settings.data_dir or folder.exists():
        return
    if (settings.data_dir / "appendonlydir").is_dir():
        log.warning(
            "the console now keeps its conversations in %s; those of earlier versions stay in "
            "%s (LASTWORD_DATA_DIR=%s reads them, if no other lastword uses it)",
            folder,
            settings.data_dir,
            settings.data_dir,
        )


async def _log_in(adapter: Adapter, platform: str) -> None:
    """The platform's check of the bot's token, before anything starts (and before systemd
    hears READY=1): a refused one is a `ConfigError`, exit 2, one line."""
    try:
        async with asyncio.timeout(LOGIN_TIMEOUT_S):
            await login(adapter)
    except TimeoutError:
        log.warning(
            "%s did not answer within %gs whether it takes the token; starting anyway",
            platform,
            LOGIN_TIMEOUT_S,
        )


async def _check_durability(store: Store, settings: Settings, *, embedded: bool) -> None:
    """Refuse to start at a durability level the server cannot honour (a configuration
    error, exit 2, so systemd does not restart into it)."""
    try:
        with reaching_redis():
            waits = await store.durability.prepare(settings.durability, embedded=embedded)
        log.info("durability %s", describe(settings.durability, waits))
    except Refused as exc:
        raise ConfigError(str(exc)) from None
    except Unavailable as exc:
        raise StartupError(f"cannot check LASTWORD_DURABILITY against Redis: {exc}") from None


async def _check_layout(store: Store) -> None:
    """Refuse to start on a store whose conversations are laid out in other shards (legacy
    data), or written in another stored format (`lastword migrate-shards` brings an older
    store up to this version). Exit 2, so systemd does not restart into it."""
    from bot.store.format import FormatError
    from bot.store.migrate import LayoutError

    try:
        await store.check_layout()
    except (LayoutError, FormatError) as exc:
        raise ConfigError(str(exc)) from None
    except Unavailable as exc:
        raise StartupError(f"cannot check the store's shard layout: {exc}") from None


async def _spread_access(store: Store) -> None:
    """Mend any shard's copy of the admins' access changes that a failover lost. Best
    effort: the copies are as the last change left them, and a later start mends them."""
    try:
        spread = await store.spread_access()
    except Unavailable as exc:
        log.warning("could not check the shards' copies of the access changes: %s", exc)
        return
    if spread:
        log.info("access changed in chat: %d users, copied into every shard", spread)


async def _reach(settings: Settings, url: str, *, patient: bool) -> Store:
    """Connect (asking the node whether it runs a cluster) and ping the store. A service
    (under systemd) waits up to `STARTUP_WAIT_S` for a shared Redis that is restarting,
    rather than exit at once: a short Redis outage then costs a slow start, not a unit that
    hit its restart limit. A person at a terminal gets the error at once. Raises ValueError
    for a URL that names no Redis, `Unavailable` when it cannot be reached."""
    where = store_url(url)
    deadline = time.monotonic() + (STARTUP_WAIT_S if patient else 0)
    backoff = Backoff(0.5, 5.0)
    while True:
        store: Store | None = None
        try:
            with reaching_redis():
                client = await open_client(url)
            store = make_store(settings, client)
            await store.ping()
            return store
        except Unavailable as exc:
            if store is not None:
                await store.close()
            delay = backoff.next_delay()
            if time.monotonic() + delay > deadline:
                raise
            log.warning("waiting for Redis at %s (%s); retrying in %.1fs", where, exc, delay)
            notify(f"STATUS=waiting for Redis at {where}")
        await asyncio.sleep(delay)


def _model(settings: Settings) -> LLM:
    """The model the settings name, said in the log (a warning when none is configured)."""
    provider = settings.llm_provider
    if provider == "echo" and settings.llm.provider is None:
        log.warning(
            "no LLM configured (set LASTWORD_LLM__BASE_URL and LASTWORD_LLM__API_KEY, or "
            "OPENAI_API_KEY): answering with the offline echo model"
        )
    else:
        log.info("LLM: %s, model %s", provider, settings.llm.model)
    return make_llm(settings.llm, provider)


async def _health(
    runtime: Runtime,
    adapter: Adapter,
    supervisor: Supervisor,
    llm: LLM,
    transcriber: Transcriber | None,
) -> HealthServer | None:
    """`/healthz` and `/metrics` where `LASTWORD_METRICS_LISTEN` asks for them; an address
    that cannot be served stops the start (the runtime with it)."""
    listen = runtime.settings.metrics_listen
    if not listen:
        return None
    health = HealthServer(
        listen,
        runtime,
        adapter.connected,
        lambda: supervisor.down,
        _refusals(adapter, llm, transcriber),
    )
    try:
        await health.start()
    except (OSError, ValueError) as exc:
        await runtime.stop()
        raise StartupError(f"LASTWORD_METRICS_LISTEN={listen}: {exc}") from None
    return health


async def _serve(settings: Settings, store: Store, adapter: Adapter) -> int:
    llm = _model(settings)
    transcriber = make_transcriber(settings.media, settings.llm, settings.llm_provider)
    # Before READY: the MCP servers' tools are listed at start (bounded by their start timeout;
    # one still starting adds its tools when it is up).
    toolbox = await load_toolbox(settings.tools, Scrub(secrets_of(settings)), llm=settings.llm)
    runtime = Runtime(settings, store, llm, adapter, transcriber, toolbox)
    runtime.start()
    supervisor = Supervisor()
    health = await _health(runtime, adapter, supervisor, llm, transcriber)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload, runtime)
    receiving = asyncio.create_task(
        supervisor.keep(f"{settings.platform} intake", lambda: adapter.run(runtime)),
        name="adapter",
    )
    stopping = asyncio.create_task(stop.wait(), name="stop")
    pulse = asyncio.create_task(_pulse(runtime), name="systemd pulse")
    keys = asyncio.create_task(_watch_keys(llm, transcriber), name="key checks")
    # Everything made so far lives as long as the process (the libraries, the clients): the
    # collector need not walk it again. A full collection of it stopped a flooded event loop
    # for up to 230 ms.
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 10, 10)
    notify("READY=1")
    log.info("lastword is running on %s as replica %s", settings.platform, settings.replica_id)
    try:
        await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        notify("STOPPING=1")
        # A second SIGTERM while stopping (an impatient admin) changes nothing: the stop is
        # already bounded in time. The handlers stay until then, so it cannot kill us midway.
        loop.remove_signal_handler(signal.SIGHUP)
        stopping.cancel()
        await _stop(runtime, receiving, runtime.settings.shutdown_grace_s)
        # Before the leftovers' wait: each MCP server's session task ends only here.
        await toolbox.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await cancel_and_wait(pulse)
        await cancel_and_wait(keys)
        if health is not None:
            await health.stop()
        # A cycle cancelled mid-way hands its lease back in a shielded task of its own: let
        # such leftovers finish while the store is still open, briefly.
        leftovers = asyncio.all_tasks() - {asyncio.current_task()}
        if leftovers:
            await asyncio.wait(leftovers, timeout=DRAIN_TIMEOUT_S)
        await llm.close()
    if not receiving.cancelled() and receiving.exception() is not None:
        raise receiving.exception()  # type: ignore[misc]
    return 0


def _keyed(llm: LLM, transcriber: Transcriber | None) -> dict[str, Keyed]:
    """The clients that send a key, by the `/healthz` check that reports it."""
    keyed: dict[str, Keyed] = {}
    if isinstance(llm, Keyed):
        keyed["llm"] = llm
    if isinstance(transcriber, Keyed):
        keyed["transcription"] = transcriber
    return keyed


def _refusals(
    adapter: Adapter, llm: LLM, transcriber: Transcriber | None
) -> Callable[[], dict[str, str | None]]:
    """Per `/healthz` check, why a service refuses its credential right now (None: it
    does not)."""
    keyed = _keyed(llm, transcriber)

    def now() -> dict[str, str | None]:
        return {"adapter": refused(adapter)} | {n: c.key.reason for n, c in keyed.items()}

    return now


async def _watch_keys(llm: LLM, transcriber: Transcriber | None) -> None:
    """Check the LLM's and the transcriber's keys at start-up: a refused one is a WARNING
    (the bot still runs, and every burst still gets its apology), and `/healthz` says so.
    While one is refused, it is checked again each minute, so `/healthz` recovers by itself
    once the key is fixed, even with nobody writing."""
    # A transcriber sending the LLM's key to the LLM's server learns nothing new from it.
    probes: dict[tuple[str, str], Keyed] = {}
    for client in _keyed(llm, transcriber).values():
        probes.setdefault((client.base_url, client.key.setting), client)
    keyed = list(probes.values())
    for client in keyed:
        await _probe(client, logging.WARNING)
    while True:
        await asyncio.sleep(REPORT_EVERY_S)
        for client in keyed:
            if client.key.reason is not None:
                await _probe(client, logging.ERROR)


async def _probe(client: Keyed, level: int) -> None:
    """One key check, bounded in time whatever the client does; an error nobody expected
    (a provider's odd answer) is logged and the checks go on, rather than end unseen."""
    try:
        async with asyncio.timeout(KEY_PROBE_TIMEOUT_S + 1):
            await client.probe(KEY_PROBE_TIMEOUT_S, level=level)
    except Exception:
        log.warning("checking %s failed unexpectedly", client.key.setting, exc_info=True)


async def _stop(runtime: Runtime, receiving: asyncio.Task[None], grace_s: float) -> None:
    """The graceful stop, bounded in time. Messages are refused from now on (a webhook gets
    503, so Telegram delivers them elsewhere) and held roles are handed over at once; the
    cycles already running get `grace_s` to deliver their replies; whatever is still running
    then hands its conversation back (lease released, messages kept) for another replica."""
    try:
        async with asyncio.timeout(grace_s + 0.2):
            await runtime.drain(grace_s)
    except TimeoutError:
        log.warning("draining took longer than the grace period; handing back the rest")
    await cancel_and_wait(receiving)
    # Bounded, so SIGTERM always ends the process in time. Whatever did not stop by then is
    # safe in the store; its leases expire on their own.
    halting = asyncio.create_task(runtime.stop(), name="runtime stop")
    _, pending = await asyncio.wait({halting}, timeout=STOP_TIMEOUT_S)
    if pending:
        log.warning("the runtime did not stop within %ss; exiting anyway", STOP_TIMEOUT_S)


async def _pulse(runtime: Runtime) -> None:
    """Tell systemd what this replica is doing, and that it is alive (the watchdog); and
    write the counts of repeated warnings whose minute is over (`logs.Collapse`)."""
    watchdog_s = watchdog_interval_s()
    interval = min(watchdog_s or STATUS_INTERVAL_S, STATUS_INTERVAL_S)
    while True:
        report = runtime.report()
        notify(
            f"STATUS=cycles running: {report['cycles']}, roles: {report['roles']}, "
            f"accepting: {'yes' if report['accepting'] else 'no'}"
        )
        if watchdog_s is not None:
            # The event loop runs, or this would not: that is what the watchdog guards.
            notify("WATCHDOG=1")
        write_counts()
        await asyncio.sleep(interval)


def reload(runtime: Runtime) -> None:
    """SIGHUP: read the settings again and apply what can change while running."""
    try:
        new = load_settings()
    except ConfigError as exc:
        log.error("reload refused, settings kept as they were: %s", exc)
        return
    applied, fixed = runtime.reload(new)
    if applied:
        log.info("reloaded settings; changed: %s", ", ".join(applied))
    else:
        log.info("reloaded settings; nothing changed")
    if fixed:
        log.warning("changed but only taken on after a restart: %s", ", ".join(fixed))
