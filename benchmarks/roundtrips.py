"""Redis round trips and commands per ingested message, per cycle, per renewal and per sweep.

    python -m benchmarks.roundtrips [-n 200]

Two independent counts for each phase, taken against a real embedded server:

- server side, `INFO commandstats` before and after (calls per command). Commands that a Lua
  script runs are counted too, under their own names, so the table splits the commands a
  client sent (EVALSHA, SCRIPT ...) from those run inside scripts, which cost no round trip;
- client side, every request the bot's connections wrote (a pipeline is one request): the
  round trips themselves.

Phases: (a) ingest through `Store.ingest`, plus the same messages redelivered; (b) cycles:
a runtime settling one single-message conversation each, echo model without delay, the sweep
interval set to an hour so that no sweep mixes in; (c) the same with a slow echo model and a
short lease TTL, interrupt off, to show the renewals (one per TTL/3 of generation time);
(d) the sweep alone; (e) as (c) with interrupt on, to show its watch (one read per
conversation per poll, pipelined per replica).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import UnixDomainSocketConnection

from benchmarks.command_line import timed_run
from benchmarks.wakeup import (
    NullOutbound,
    bench_settings,
    message,
    print_table,
    temporary_server,
    wait_for_replies,
)
from bot.config.settings import LLMSettings
from bot.core.runtime import Runtime
from bot.llm.echo import EchoLLM
from bot.service.app import make_store
from bot.store import (
    ACQUIRE,
    COMMIT,
    DUE,
    INGEST,
    INTERRUPT,
    PRESEND,
    RELEASE,
    RENEW,
    USAGE,
)
from bot.store.embedded import EmbeddedRedis
from bot.store.keys import LAYOUT

SHARDS = LAYOUT.shards

# Commands a client sends itself; everything else in commandstats ran inside a script here
# (the bot issues no other direct command in these phases, which the client count confirms).
CLIENT_COMMANDS = {
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
    "script|load",
    "script|exists",
    "hello",
    "client|setinfo",
    "ping",
    "select",
}
# Ours, for the measurement itself.
IGNORED = {"info", "flushall"}


class CountingConnection(UnixDomainSocketConnection):
    """A unix socket connection that counts the requests it writes: one per command, one per
    pipeline, however many commands the pipeline holds. Each is one round trip."""

    requests: ClassVar[int] = 0

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        CountingConnection.requests += 1
        await super().send_packed_command(command, check_health)


async def command_calls(admin: Redis) -> dict[str, int]:
    stats = await admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


@dataclass(frozen=True)
class Measured:
    label: str  # short, for a column header
    phase: str
    unit: str
    count: int
    round_trips: int
    commands: dict[str, int]  # per command name, calls during the phase

    def per(self, value: int) -> str:
        return f"{value / self.count:.2f}"

    @property
    def client_commands(self) -> int:
        return sum(n for name, n in self.commands.items() if name in CLIENT_COMMANDS)

    @property
    def script_commands(self) -> int:
        return sum(n for name, n in self.commands.items() if name not in CLIENT_COMMANDS)

    def summary(self) -> list[str]:
        return [
            self.phase,
            self.unit,
            str(self.count),
            self.per(self.round_trips),
            self.per(self.commands.get("evalsha", 0)),
            self.per(self.client_commands),
            self.per(self.script_commands),
        ]


async def measure(
    admin: Redis,
    label: str,
    phase: str,
    unit: str,
    count: int,
    work: Callable[[], Awaitable[None]],
) -> Measured:
    before = await command_calls(admin)
    requests_before = CountingConnection.requests
    await work()
    round_trips = CountingConnection.requests - requests_before
    after = await command_calls(admin)
    commands = {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if name not in IGNORED and calls != before.get(name, 0)
    }
    return Measured(label, phase, unit, count, round_trips, commands)


def counting_client(server: EmbeddedRedis) -> Redis:
    # A blocking pool, so that many cycles at once wait for a connection rather than fail with
    # "Too many connections" (see the wake-up benchmark); it does not change what is sent.
    pool = BlockingConnectionPool(
        connection_class=CountingConnection,
        path=str(server.socket),
        max_connections=100,
        timeout=10,
    )
    return Redis(connection_pool=pool)


async def cycles(
    server: EmbeddedRedis,
    admin: Redis,
    args: argparse.Namespace,
    *,
    label: str,
    phase: str,
    count: int,
    ttl_ms: int,
    echo_delay_ms: int,
    interrupt: bool = True,
) -> Measured:
    """`count` conversations with one message each, settled by one runtime; only the cycles
    are measured (the ingests end before the first window closes)."""
    settings = bench_settings(
        server,
        quiet_ms=args.quiet_ms,
        max_wait_ms=args.quiet_ms,
        ttl_ms=ttl_ms,
        sweep_interval_ms=3_600_000,
        echo_delay_ms=echo_delay_ms,
        interrupt=interrupt,
    )
    redis = counting_client(server)
    runtime = Runtime(settings, make_store(settings, redis), EchoLLM(echo_delay_ms), NullOutbound())
    runtime.start()
    try:
        # Unmeasured round first: the pool opens its connections (HELLO, CLIENT SETINFO).
        for n in range(count):
            await runtime.ingest(message(n, prefix=f"warm-{phase}"))
        await wait_for_replies(runtime, count, phase)
        done = runtime.stats.replies
        for n in range(count):
            await runtime.ingest(message(n, prefix=f"bench-{phase}"))
        if runtime.stats.cycles != done:
            raise RuntimeError("a cycle started during the ingests; raise --quiet-ms")

        async def settle() -> None:
            await wait_for_replies(runtime, done + count, phase)

        measured = await measure(admin, label, phase, "cycle", count, settle)
        if runtime.stats.cycles != done + count:
            raise RuntimeError(f"{phase}: expected {count} cycles, got {runtime.stats.cycles}")
        return measured
    finally:
        await runtime.stop()
        await redis.aclose()


async def run(args: argparse.Namespace) -> list[Measured]:
    results: list[Measured] = []
    async with temporary_server() as server:
        admin = Redis.from_url(server.url)
        try:
            # Loaded up front, so that no phase pays a NOSCRIPT miss and a SCRIPT LOAD.
            for script in (INGEST, ACQUIRE, RENEW, RELEASE, INTERRUPT, PRESEND, COMMIT, DUE, USAGE):
                await admin.script_load(script)

            redis = counting_client(server)
            settings = bench_settings(
                server,
                quiet_ms=args.quiet_ms,
                max_wait_ms=args.quiet_ms,
                ttl_ms=30_000,
                sweep_interval_ms=1000,
            )
            store = make_store(settings, redis)
            await store.ping()  # opens the connection outside the measurement

            async def ingest_all() -> None:
                for n in range(args.n):
                    await store.ingest(message(n, prefix="ingest"))

            results.append(await measure(admin, "a", "(a) ingest", "message", args.n, ingest_all))
            results.append(
                await measure(
                    admin, "a'", "(a') ingest, redelivered", "message", args.n, ingest_all
                )
            )
            await admin.flushall()

            async def sweep_all() -> None:
                for _ in range(args.sweeps):
                    await store.due()

            results.append(
                await measure(admin, "d", "(d) sweep, nothing due", "sweep", args.sweeps, sweep_all)
            )
            await redis.aclose()

            results.append(
                await cycles(
                    server,
                    admin,
                    args,
                    label="b",
                    phase="(b) cycle",
                    count=args.n,
                    ttl_ms=30_000,
                    echo_delay_ms=0,
                )
            )
            # (c) and (e): a slow model and a short TTL, so that the cycles renew their leases.
            renewing = functools.partial(
                cycles,
                server,
                admin,
                args,
                count=args.renew_n,
                ttl_ms=args.renew_ttl_ms,
                echo_delay_ms=args.renew_delay_ms,
            )
            await admin.flushall()
            results.append(
                await renewing(
                    label="c",
                    phase=f"(c) cycle, {args.renew_delay_ms} ms LLM, TTL {args.renew_ttl_ms}",
                    interrupt=False,
                )
            )
            await admin.flushall()
            results.append(
                await renewing(label="e", phase=f"(e) as (c), interrupt watch every {POLL_MS} ms")
            )
        finally:
            await admin.aclose()
    return sorted(results, key=lambda m: m.label)


def report(results: list[Measured], args: argparse.Namespace) -> None:
    print(f"settings: quiet_ms={args.quiet_ms}, echo LLM, null outbound, {SHARDS} due shards")
    print()
    print("per unit: round trips counted by the client; commands by the server (commandstats)")
    print_table(
        ["phase", "unit", "count", "round trips", "EVALSHA", "client cmds", "in-script cmds"],
        [m.summary() for m in results],
    )
    print()
    print("server commands per unit, by name (in-script ones cost no round trip)")
    names = sorted(
        {name for m in results for name in m.commands},
        key=lambda name: (name not in CLIENT_COMMANDS, name),
    )
    headers = ["command", *(f"({m.label})" for m in results)]
    rows = [[name, *(m.per(m.commands.get(name, 0)) for m in results)] for name in names]
    print_table(headers, rows)
    by_label = {m.label: m for m in results}
    ingest, cycle, renewing = by_label["a"], by_label["b"], by_label["c"]
    per_ingest = ingest.round_trips / ingest.count
    per_cycle = cycle.round_trips / cycle.count
    renewals = (renewing.round_trips - renewing.count * per_cycle) / renewing.count
    expected = args.renew_delay_ms // (args.renew_ttl_ms // 3)
    print()
    print(f"ingest: {per_ingest:.2f} round trip per message")
    print(f"cycle: {per_cycle:.2f} round trips (acquire, usage, pre-send check, commit)")
    print(
        f"renewals: {renewals:.2f} extra round trips per cycle for {args.renew_delay_ms} ms of "
        f"generation at TTL {args.renew_ttl_ms} ms (one per TTL/3 = {args.renew_ttl_ms // 3} ms;"
        f" expected {expected})"
    )
    print(
        f"a burst of k messages answered by one reply: k + {per_cycle:.0f} round trips, "
        "plus one per TTL/3 of generation"
    )
    watching = by_label["e"]
    reads = (watching.commands.get("hget", 0) - renewing.commands.get("hget", 0)) / watching.count
    polls = (watching.round_trips - renewing.round_trips) / watching.count
    print(
        f"interrupt watch: {reads:.2f} extra HGET per cycle for {args.renew_delay_ms} ms of "
        f"generation (one per {POLL_MS} ms; expected {args.renew_delay_ms // POLL_MS}), all of a "
        f"replica's generating conversations in one pipeline: {polls:+.2f} round trips per "
        f"cycle with {watching.count} generating at once (within the renewals' noise)"
    )
    sweep = by_label["d"]
    print(
        f"sweep: {sweep.round_trips / sweep.count:.2f} round trips per sweep for {SHARDS} "
        "EVALSHA in one pipeline"
    )


POLL_MS = LLMSettings().interrupt_poll_ms


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.roundtrips")
    parser.add_argument("-n", type=int, default=200, help="messages and cycles to count")
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--quiet-ms", type=int, default=500)
    parser.add_argument("--renew-n", type=int, default=50)
    parser.add_argument("--renew-ttl-ms", type=int, default=600)
    parser.add_argument("--renew-delay-ms", type=int, default=500)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        report(asyncio.run(run(args)), args)


if __name__ == "__main__":
    main()
