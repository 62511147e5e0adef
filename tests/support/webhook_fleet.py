"""A fleet of `lastword run` replicas in webhook mode against the fake Telegram: starting
them, posting updates and reading their replies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from bot.store.embedded import EmbeddedRedis
from tests.support.core_waits import CoreWaits
from tests.support.fakes.limits import Violation
from tests.support.fakes.loopback import free_port
from tests.support.fakes.telegram_server import (
    FakeTelegram,
    post_update,
)
from tests.support.running import START_S, Running
from tests.support.telegram_runs import SECRET, bot_env


@dataclass(frozen=True)
class Replica:
    webhook: str  # where to post updates
    metrics: int  # the port of its /metrics
    bot: Running


@contextlib.asynccontextmanager
async def fleet(
    server: EmbeddedRedis,
    fake: FakeTelegram,
    short_dir: Path,
    *,
    each: Callable[[int], dict[str, str]] = lambda n: {},
    **extra: str,
) -> AsyncIterator[list[Replica]]:
    """Three replicas in webhook mode, started at once, with `extra` settings (and replica
    n's own, `each(n)`); ready when each has registered its webhook."""
    replicas, bots = [], []
    try:
        for n in range(3):
            hook, metrics = free_port(), free_port()
            env = bot_env(
                server,
                fake,
                short_dir / str(n),
                LASTWORD_TELEGRAM__MODE="webhook",
                LASTWORD_TELEGRAM__WEBHOOK_LISTEN=f"127.0.0.1:{hook}",
                LASTWORD_TELEGRAM__WEBHOOK_SECRET=SECRET,
                LASTWORD_TELEGRAM__WEBHOOK_URL="https://bot.example/telegram",
                LASTWORD_METRICS_LISTEN=f"127.0.0.1:{metrics}",
                # The platform's own, as the fake enforces them.
                LASTWORD_TELEGRAM__CHAT_MESSAGES_PER_SECOND="1",
                **extra,
            )
            bots.append(await Running.start(env | each(n)))
            replicas.append(Replica(f"http://127.0.0.1:{hook}/telegram", metrics, bots[-1]))
        # Three starts at once take the CPU of three.
        for bot in bots:
            registered = fake.wait_for_calls("setWebhook", 3, timeout=3 * START_S)
            await bot.until(registered, "every replica's webhook")
        yield replicas
    finally:
        await asyncio.gather(*(bot.stop() for bot in bots))


def core_waits(replicas: list[Replica], server: EmbeddedRedis) -> CoreWaits:
    """What the replicas, their server and this process (the fake Bot API) wait for a core:
    the machine's part of a latency. The server's pid is read at each sample (a restart
    changes it); a pid gone keeps the count it last had."""
    return CoreWaits(
        lambda: (
            [r.bot.process.pid for r in replicas] + ([server.process.pid] if server.process else [])
        )
    )


async def post(replica: Replica, update: dict[str, object]) -> int:
    return await post_update(replica.webhook, update, SECRET)


def replies(fake: FakeTelegram) -> dict[int | str | None, list[str | None]]:
    by_chat: dict[int | str | None, list[str | None]] = {}
    for message in fake.sent_messages:
        by_chat.setdefault(message.chat_id, []).append(message.text)
    return by_chat


def described(violations: list[Violation]) -> str:
    return ", ".join(f"{v.limit}:{v.key} {v.method}" for v in violations[:10])


# What a timing assertion's message shows of each replica's log: its warnings and errors,
# and any line that tells of a 429 or a hold, the last few of them.
WAIT_WORDS = (" WARNING ", " ERROR ", "429", "retry", "hold", "held", "flood")
WAIT_LINES = 15


def why_late(fake: FakeTelegram, replicas: list[Replica]) -> str:
    """For a reply that came late: the fake's limit violations, and each replica's lines of
    waiting. The cause of a timing failure on a loaded machine, in the failure's message."""
    violations = described(fake.limits.violations) if fake.limits is not None else "no limits"
    told = [f"violations: {violations or 'none'}"]
    for n, replica in enumerate(replicas):
        lines = [line for line in replica.bot.log if any(w in line for w in WAIT_WORDS)]
        told.append(f"replica {n}, {len(lines)} lines of waiting, the last:")
        told.extend("  " + line.rstrip() for line in lines[-WAIT_LINES:])
    return "\n".join(told)
