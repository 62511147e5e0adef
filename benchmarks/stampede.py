"""A stampede of replies from three replicas: does the fleet keep to the bot's limit?

    python -m benchmarks.stampede [--users 300] [--rate 30] [--replicas 3]
                                  [--modes off replica shared]

Three `lastword run` replicas (the real Telegram adapter in webhook mode, the echo model) on
one embedded server, against the loopback fake Bot API enforcing Telegram's limits: at most
`--rate` calls in any sliding second bot-wide (every sending call: messages, drafts, typing),
one message a second per chat. A call past a limit is answered 429 with a `retry_after`, as
Telegram does, and counted.

`--users` users each send one DM at the same moment, spread over the replicas as a load
balancer would; each is owed one reply. For each way of keeping the limits
(`LASTWORD_OUTBOUND__BUDGET`): `off` (as before the budget: 429s waited out by the replica
that got them), `replica` (each replica paces itself alone), `shared` (one budget in Redis),
it prints:

- 429s the fake answered, in all and after the first second of replies;
- replies delivered (of `--users`), and duplicates;
- the time to deliver them all: from the first reply to the last, counting the first second
  whole (a sliding-second limit lets `--rate` out at once, then `--rate` a second), against
  the floor the bot-wide limit allows, users / rate; and their ratio.

Each mode gets a fresh server, fresh replicas and a fresh fake; one run each.

Then what the budget costs each platform call, measured on its own: the two script calls a
call makes (`budget_take` before it, `budget_done` once it is answered), each one round trip to
an embedded server over its unix socket, `--calls` times in a row (median and p99, µs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.command_line import timed_run
from benchmarks.flood import ready
from benchmarks.wakeup import bench_settings, percentile, print_table, temporary_server
from bot.app import make_store
from bot.connect import make_client
from bot.embedded import EmbeddedRedis
from bot.message import BOT_SCOPE, Scope
from bot.store import BudgetKeys
from tests.fakes.loopback import free_port
from tests.fakes.telegram_server import FakeTelegram, post_update, telegram_limits
from tests.running import Running, clean_environ

SECRET = "stampede-webhook-secret"
# Replies still missing this long after the last one came are counted as not delivered.
QUIET_END_S = 20.0


@dataclass(frozen=True)
class Outcome:
    mode: str
    refused: int
    refused_after_first_s: int
    delivered: int
    duplicates: int
    span_s: float


def bot_env(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, port: int, mode: str, rate: int
) -> dict[str, str]:
    return clean_environ() | {
        "LASTWORD_PLATFORM": "telegram",
        "LASTWORD_REDIS_URL": server.url,
        "LASTWORD_DATA_DIR": str(data_dir),
        "LASTWORD_LOG_LEVEL": "ERROR",
        "LASTWORD_LLM__PROVIDER": "echo",
        "LASTWORD_DEBOUNCE__QUIET_MS": "300",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "1500",
        "LASTWORD_TELEGRAM__TOKEN": fake.token,
        "LASTWORD_TELEGRAM__API_URL": fake.api_url,
        "LASTWORD_TELEGRAM__MODE": "webhook",
        "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}",
        "LASTWORD_TELEGRAM__WEBHOOK_SECRET": SECRET,
        "LASTWORD_TELEGRAM__MESSAGES_PER_SECOND": str(rate),
        "LASTWORD_OUTBOUND__BUDGET": mode,
    }


@contextlib.asynccontextmanager
async def replicas(
    count: int, folder: Path, env_of: Callable[[Path, int], dict[str, str]]
) -> AsyncIterator[list[str]]:
    """`count` replicas, each with the settings `env_of(its data folder, its webhook port)`:
    their webhook URLs, once each answers."""
    bots: list[Running] = []
    urls = []
    try:
        for n in range(count):
            port = free_port()
            bots.append(await Running.start(env_of(folder / f"r{n}", port)))
            urls.append(f"http://127.0.0.1:{port}/telegram")
        await asyncio.gather(*(ready(url, 60) for url in urls))
        yield urls
    finally:
        await asyncio.gather(*(bot.stop() for bot in bots))


async def run_once(mode: str, args: argparse.Namespace) -> Outcome:
    first_chat = 100_000
    async with (
        temporary_server() as server,
        FakeTelegram(limits=telegram_limits(per_second=args.rate)) as fake,
        replicas(
            args.replicas,
            server.data_dir.parent,
            lambda folder, port: bot_env(server, fake, folder, port, mode, args.rate),
        ) as urls,
    ):
        chats = range(first_chat, first_chat + args.users)
        updates = [fake.private_text_update(c, c, f"news for {c}, please") for c in chats]
        await asyncio.gather(
            *(post_update(urls[n % len(urls)], u, SECRET) for n, u in enumerate(updates))
        )
        # Until every user has a reply, or none came for a while.
        while len({m.chat_id for m in fake.sent_messages}) < args.users:
            seen = len(fake.sent_messages)
            with contextlib.suppress(TimeoutError):
                await fake.wait_for_sent(seen + 1, timeout=QUIET_END_S)
            if len(fake.sent_messages) == seen:
                break
        sent = fake.sent_messages
        assert fake.limits is not None
        violations = fake.limits.violations
        first = min((m.at for m in sent), default=time.monotonic())
        last = max((m.at for m in sent), default=first)
        return Outcome(
            mode=mode,
            refused=len(violations),
            refused_after_first_s=len(fake.limits.violations_after(first + 1.0)),
            delivered=len({m.chat_id for m in sent}),
            duplicates=len(sent) - len({m.chat_id for m in sent}),
            span_s=last - first + 1.0,
        )


def rows(outcomes: Sequence[Outcome], args: argparse.Namespace) -> list[list[str]]:
    floor_s = args.users / args.rate
    return [
        [
            o.mode,
            str(o.refused),
            str(o.refused_after_first_s),
            f"{o.delivered}/{args.users}",
            str(o.duplicates),
            f"{o.span_s:.1f}",
            f"{floor_s:.1f}",
            f"{o.span_s / floor_s:.2f}x",
        ]
        for o in outcomes
    ]


async def cost(calls: int) -> list[list[str]]:
    """The round trips of one paced call, timed: (step, median µs, p99 µs)."""
    async with temporary_server() as server:
        store = make_store(
            bench_settings(
                server, quiet_ms=0, max_wait_ms=0, ttl_ms=30_000, sweep_interval_ms=1000
            ),
            make_client(server.url),
        )
        keys = BudgetKeys("bench")
        scopes = (Scope(BOT_SCOPE, 1_000_000, 1.0), Scope("chat:1", 1_000_000, 1.0))
        took: list[int] = []
        stamped: list[int] = []
        for n in range(calls):
            began = time.perf_counter_ns()
            await store.take(keys, scopes, call="message", ticket="t", order_ms=0, grant=f"g{n}")
            between = time.perf_counter_ns()
            await store.done(keys, scopes, f"g{n}", used=True)
            took.append((between - began) // 1000)
            stamped.append((time.perf_counter_ns() - between) // 1000)
        await store.redis.aclose()
    return [
        [step, f"{statistics.median(values):.0f}", str(percentile(sorted(values), 99))]
        for step, values in (("budget_take", took), ("budget_done", stamped))
    ]


async def run(args: argparse.Namespace) -> None:
    outcomes = [await run_once(mode, args) for mode in args.modes]
    print(
        f"cpus: {os.cpu_count()}; {args.replicas} `lastword run` replicas (telegram webhook, echo"
        f" model); {args.users} users at once; the fake Bot API enforcing {args.rate} calls/s"
        " bot-wide and 1 message/s per chat; one run per mode"
    )
    headers = [
        "budget",
        "429s",
        "429s after 1st s",
        "delivered",
        "duplicates",
        "time to deliver (s)",
        "floor (s)",
        "ratio",
    ]
    print_table(headers, rows(outcomes, args))
    print(f"\nwhat a paced call costs: two script calls, {args.calls} of each in a row")
    print_table(["step", "median (µs)", "p99 (µs)"], await cost(args.calls))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stampede",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--rate", type=int, default=30, help="bot-wide calls a second")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="paced calls timed for the cost")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["off", "replica", "shared"],
        choices=["off", "replica", "shared"],
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
