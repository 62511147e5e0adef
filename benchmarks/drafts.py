"""Live drafts: how many a reply gets, and how soon the first one shows.

    python -m benchmarks.drafts [--users 50] [--interval-ms 1000] [--seed 7]

One in-process runtime with the real Telegram adapter as its outbound (python-telegram-bot
against the loopback fake Bot API), the real OpenAI client streaming from the fake provider
(150-300 words in 1-4 s, the first after 0.5 s, as a hosted model does), and a real server.
Each user sends one message; every reply is drafted as it streams. Measured from the fakes'
own clocks (one process, one monotonic clock):

- drafts per reply (`sendMessageDraft` calls, the first, empty one included);
- generation start (the provider received the request) to the first draft call, which shows
  "Thinking…", and to the first draft with text;
- the final message after the last draft.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr

from adapters.telegram import TelegramAdapter, TelegramSettings
from benchmarks.command_line import timed_run
from benchmarks.wakeup import percentile, print_table, temporary_server
from bot.config.settings import DebounceSettings, InstalledSettings, LLMSettings
from bot.core.runtime import Runtime
from bot.llm.openai import OpenAILLM
from bot.message import InboundMessage
from bot.service.app import make_store
from bot.store.connect import make_client
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.fakes.telegram_server import FakeTelegram


def answer(seed: int) -> tuple[str, float]:
    """A reply of 150-300 three-letter words, and its latency, drawn from the seed."""
    rng = random.Random(seed)
    return " ".join("abc" for _ in range(rng.randint(150, 300))), rng.uniform(1.0, 4.0)


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    async with temporary_server() as server, FakeTelegram() as telegram, FakeOpenAI() as provider:
        chats = {str(1000 + i): answer(args.seed * 1000 + i) for i in range(args.users)}

        def chat_of(request: RecordedRequest) -> str:
            return request.last_user_text.removeprefix("question from ")

        provider.reply = lambda request: chats[chat_of(request)][0]
        provider.delay_for = lambda request: chats[chat_of(request)][1]
        provider.first_token_for = lambda request: 0.5
        llm = LLMSettings(
            provider="openai", base_url=provider.base_url, api_key=SecretStr("bench"), model="b"
        )
        telegram_settings = TelegramSettings(
            token=SecretStr(telegram.token),
            api_url=telegram.api_url,
            draft_interval_ms=args.interval_ms,
        )
        # A platform's section is the plug-in's, untyped in `Settings`: given as its values.
        platform: dict[str, Any] = {"telegram": telegram_settings.model_dump()}
        settings = InstalledSettings(
            platform="telegram",
            **platform,
            redis_url=server.url,
            llm=llm,
            debounce=DebounceSettings(quiet_ms=200, max_wait_ms=1000),
            log_level="WARNING",
        )
        redis = make_client(server.url)
        adapter = TelegramAdapter(telegram_settings)
        async with adapter.bot:
            runtime = Runtime(settings, make_store(settings, redis), OpenAILLM(llm), adapter)
            runtime.start()
            for chat in chats:
                message = InboundMessage("telegram", chat, chat, "1", f"question from {chat}")
                await runtime.ingest(message)
            await telegram.wait_for_sent(len(chats), timeout=60)
            await runtime.stop()
        await redis.aclose()
    return figures(provider, telegram)


def figures(provider: FakeOpenAI, telegram: FakeTelegram) -> dict[str, list[float]]:
    drafts = [c for c in telegram.calls_to("sendMessageDraft") if c.status == 200]
    out: dict[str, list[float]] = {"drafts": [], "first": [], "first text": [], "final": []}
    for request in provider.requests:
        chat = int(request.last_user_text.removeprefix("question from "))
        mine = [c for c in drafts if c.params.get("chat_id") == chat]
        [final] = [m for m in telegram.sent_messages if m.chat_id == chat]
        texts = [c for c in mine if c.params.get("text")]
        out["drafts"].append(len(mine))
        out["first"].append((mine[0].at - request.started_at) * 1000)
        out["first text"].append((texts[0].at - request.started_at) * 1000)
        out["final"].append((final.at - mine[-1].at) * 1000)
    return out


def report(found: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(
        f"{args.users} users, one message each; replies 150-300 words in 1-4 s, first token "
        f"after 0.5 s; draft interval {args.interval_ms} ms; one run\n"
    )

    def row(name: str, values: list[float], unit: str) -> list[str]:
        ordered = sorted(int(v) for v in values)
        return [
            name,
            f"{statistics.median(values):.1f}{unit}",
            f"{percentile(ordered, 95)}{unit}",
            f"{max(values):.0f}{unit}",
        ]

    print_table(
        ["figure", "median", "p95", "max"],
        [
            row("drafts per reply", found["drafts"], ""),
            row("generation start -> first draft (Thinking…)", found["first"], " ms"),
            row("generation start -> first draft with text", found["first text"], " ms"),
            row("last draft -> final message", found["final"], " ms"),
        ],
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
