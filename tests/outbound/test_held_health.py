"""What every replica says while the platform holds the whole bot after a 429 (issue 47): its
`/healthz` says "degraded" with a 200 and how long the hold has left, read from the shared
store, and answers in time when Redis hangs; its `/metrics` counts the budget's store calls.
In-process runtimes on one real Redis, each with its health server, behind a stand-in
platform with Telegram's shape of limits."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from bot.core.runtime import Runtime
from bot.message import BOT_SCOPE, Call, Scope
from bot.outbound.pacing import HELD_LONG_S
from bot.service.metrics import PING_TIMEOUT_S, HealthServer
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.fakes.loopback import free_port
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.waits import eventually, settled

# A hold /healthz must report (an hour, the longest a 429 is taken at its word), and one it
# must not.
LONG_S = 3600.0
SHORT_S = HELD_LONG_S - 10


@dataclass
class LimitedOutbound(RecordingOutbound):
    """The recording platform, limiting what the bot sends as Telegram does: the bot's calls,
    and each chat's messages."""

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        every = Scope(BOT_SCOPE, 30, 1.0)
        return (every, Scope(f"chat:{conversation}", 1, 1.0)) if call == "message" else (every,)


@dataclass(frozen=True)
class Replica:
    runtime: Runtime
    outbound: LimitedOutbound
    url: str  # its health server's root


@pytest.fixture
async def replicas(runtime_factory: RuntimeFactory) -> AsyncIterator[list[Replica]]:
    """Two runtimes on the test's Redis, their budget shared, each serving /healthz."""
    started, servers = [], []
    for _ in range(2):
        runtime, outbound = await runtime_factory(outbound=LimitedOutbound())
        assert isinstance(outbound, LimitedOutbound)
        port = free_port()
        server = HealthServer(f"127.0.0.1:{port}", runtime, connected=lambda: True)
        await server.start()
        servers.append(server)
        started.append(Replica(runtime, outbound, f"http://127.0.0.1:{port}"))
    yield started
    for server in servers:
        await server.stop()


async def health(replica: Replica) -> tuple[int, dict[str, Any]]:
    """/healthz: its HTTP status and its JSON body."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(replica.url + "/healthz") as response,
    ):
        return response.status, json.loads(await response.text())


async def test_every_replica_reports_a_long_bot_wide_hold_and_nothing_shorter_or_narrower(
    replicas: list[Replica],
) -> None:
    # Heard on one; the other holds no news of it but what the store says.
    heard_on = replicas[0]
    for replica in replicas:
        assert await health(replica) == (200, {"status": "ok", "checks": ok_checks()})

    # A chat held for an hour, and the bot for less than the bound: nothing to report.
    await heard_on.runtime.throttled("chat:test:1", LONG_S)
    await heard_on.runtime.throttled(BOT_SCOPE, SHORT_S)
    for replica in replicas:
        assert await health(replica) == (200, {"status": "ok", "checks": ok_checks()})

    # The bot held for an hour, heard by one replica: every replica says so, with a 200, the
    # one that did not hear it first.
    await heard_on.runtime.throttled(BOT_SCOPE, LONG_S)
    for replica in reversed(replicas):
        status, body = await health(replica)
        assert (status, body["status"]) == (200, "degraded"), body
        said = body["checks"].pop("outbound")
        # An hour, less what has passed since: 1h00m read within a millisecond, 59m after.
        held = "held: the platform takes no call from the bot for another "
        assert said.startswith((held + "1h00m", held + "59m")), said
        assert said.endswith("(a 429)")
        assert body["checks"] == {name: "ok" for name in ok_checks() if name != "outbound"}


def ok_checks() -> dict[str, str]:
    return dict.fromkeys(("redis", "adapter", "accepting", "loops", "outbound"), "ok")


async def test_a_hung_redis_is_reported_in_time_and_once(
    replicas: list[Replica], server: EmbeddedRedis
) -> None:
    replica = replicas[0]
    await replica.runtime.throttled(BOT_SCOPE, LONG_S)
    assert (await health(replica))[1]["status"] == "degraded"
    # Frozen: its sockets stay open and nothing answers, so only the check's own bound ends
    # its reads.
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        status, body = await health(replica)
        took = time.monotonic() - began
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert status == 503 and body["status"] == "unhealthy", body
    assert body["checks"]["redis"] == "unreachable: timed out"
    # The hold could not be read: the redis check says why; not said twice.
    assert body["checks"]["outbound"] == "unknown: see redis"
    # Both reads of the store share one bound (a loaded machine's slack on top).
    assert took < PING_TIMEOUT_S + 1.5, f"/healthz took {took:.1f} s"


async def test_metrics_count_the_budgets_store_calls_by_script(replicas: list[Replica]) -> None:
    await replicas[0].runtime.ingest(message("hello", conversation="console:1"))

    async def sender() -> Replica | None:
        """The replica that sent the reply: either may, as either sweeps the due conversations
        (on a loaded machine the other's sweep may come before the local timer)."""
        return next((replica for replica in replicas if replica.outbound.sent), None)

    replica = await eventually(sender, within_s=10, what="the reply, from either replica")
    assert replica is not None
    runtime = replica.runtime
    await settled(runtime, "console:1")
    stats = runtime.outbound.stats
    calls = stats.calls

    async def recorded() -> bool:
        """The reply's answer recorded in the budget (with the next store call)."""
        return stats.recorded["used"] >= 1

    assert await eventually(recorded, what="the reply's answer recorded")
    assert calls["take"] >= 1, calls

    async def exported() -> dict[str, float]:
        """The counter's samples, by call."""
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(replica.url + "/metrics") as response,
        ):
            text = await response.text()
        found = {}
        for line in text.splitlines():
            if line.startswith('lastword_budget_calls_total{call="'):
                labels, value = line.rsplit(" ", 1)
                found[labels.split('"')[1]] = float(value)
        return found

    async def as_counted() -> bool:
        # Scraped while the replica may still call the store (its waiting replies kept alive).
        return await exported() == {call: float(count) for call, count in calls.items()}

    await eventually(as_counted, what="the calls exported as counted", describe=exported)
