"""What memory costs a reply: `lastword run` on the console with memory on (each user's facts
kept: 20 by default) and with memory off, on the same workload.

    python -m benchmarks.facts [--facts 20] [--bursts 6] [--seed 7] [--quiet-ms 2000]
        [--model-s 1.5]

The workload and the bots are `benchmarks.lastword_latency`'s (two users at once, each to a
bot process of its own, one sending single lines and one bursts; the loopback fake provider
answering in `--model-s`), with speculation and the learned window off and no rate limit, so
the window is the same in both rows. Each user first sends `--facts` lines of /remember
(answered and not counted): with memory on they are kept, so every measured request carries
them; with memory off they are answered that memory is off, so both histories hold the same
burst.

Per row and user: the median and p95 from a burst's last line to its reply, and the prompt
tokens per reply (each request that answered a measured burst, counted as lastword counts
them: its messages' text and its tools' schemas), with
what memory adds to them: the facts' block itself, and the rest (the memory tool's schema and
the system prompt's note of it). Reading the facts is one store call per reply, made beside
the spending read that every reply makes already (at once: it adds a call, not a wait).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.command_line import timed_run
from benchmarks.lastword_latency import TOKEN, ConsoleBot, add_workload_args, bursts, covering
from benchmarks.wakeup import percentile, print_table
from bot.llm.remembered import MEMORY_CLOSE, MEMORY_OPEN
from bot.tokens import Counter
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.running import clean_environ

ROWS = ("off", "on")
# The longest a bot may take to start, or to answer the saving of the facts.
START_S = 30.0
COUNTER = Counter()


@dataclass
class Result:
    """One user's run: latencies in ms, and the prompt tokens of each measured reply."""

    row: str
    kind: str
    latencies_ms: list[int]
    prompt_tokens: list[int]
    block_tokens: list[int]
    problems: list[str]


def bot_env(args: argparse.Namespace, base_url: str, data_dir: Path, row: str) -> dict[str, str]:
    return clean_environ() | {
        "LASTWORD_PLATFORM": "console",
        "LASTWORD_DATA_DIR": str(data_dir),
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": base_url,
        "LASTWORD_LLM__API_KEY": "bench",
        "LASTWORD_LLM__MODEL": "bench",
        "LASTWORD_DEBOUNCE__QUIET_MS": str(args.quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(args.max_wait_ms),
        "LASTWORD_DEBOUNCE__SPECULATE_MS": "0",
        # The same window in both rows: the facts' burst must not teach it the user's pace,
        # nor count against their rate.
        "LASTWORD_DEBOUNCE__LEARN": "false",
        "LASTWORD_ACCESS__RATE_PER_MINUTE": "0",
        "LASTWORD_MEMORY__ENABLED": str(row == "on").lower(),
        "LASTWORD_MEMORY__FACTS": str(max(args.facts, 1)),
    }


async def session(
    args: argparse.Namespace, fake: FakeOpenAI, row: str, multi: bool, seed: str
) -> Result:
    """One user, one bot: the facts saved (memory on), then the measured bursts."""
    # The same bursts in both rows; `seed` also marks this session's lines.
    rng = random.Random(f"{args.seed}:{multi}")
    kind = "bursts of 2-4" if multi else "single lines"
    result = Result(row, kind, [], [], [], [])
    timeout_s = args.max_wait_ms / 1000 + args.model_s + 10
    with tempfile.TemporaryDirectory(prefix="lastword-facts-") as data_dir:
        bot = await ConsoleBot.start(bot_env(args, fake.base_url, Path(data_dir), row))
        try:
            # In both rows, so both histories hold the same burst (with memory off, each
            # /remember is answered that memory is off).
            for n in range(args.facts):
                await bot.say(f"/remember fact {n}: something worth keeping in mind, {seed}")
            await bot.say(f"b0m1 to warm up {seed}")
            await bot.reply_covering("b0m1", START_S)
            for number, burst in enumerate(bursts(rng, args.bursts, multi), 1):
                token, last = await bot.burst(number, burst, rng, f" {seed}")
                at, _ = await bot.reply_covering(token, timeout_s)
                result.latencies_ms.append(int((at - last) * 1000))
                answered = [
                    r
                    for r in fake.requests
                    if seed in r.last_user_text and token in TOKEN.findall(r.last_user_text)
                ]
                result.prompt_tokens += [request_tokens(r) for r in answered[-1:]]
                result.block_tokens += [block_tokens(r) for r in answered[-1:]]
        except TimeoutError:
            result.problems.append(f"{row}, {kind}: no reply within {timeout_s:g} s; stopped there")
        finally:
            await bot.close()
    return result


def request_tokens(request: RecordedRequest) -> int:
    """The request's prompt tokens as lastword counts them (`bot.tokens`): every message's
    text, and the tools' schemas as sent."""
    texts = [content_text(m.get("content")) for m in request.messages]
    tools = request.body.get("tools")
    return sum(map(COUNTER.count, texts)) + (COUNTER.count(json.dumps(tools)) if tools else 0)


def content_text(content: object) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def block_tokens(request: RecordedRequest) -> int:
    """The tokens of the facts' block the request carries (0: none), as lastword counts."""
    text = request.last_user_text
    start, end = text.find(MEMORY_OPEN), text.find(MEMORY_CLOSE)
    if start < 0 or end < 0:
        return 0
    return COUNTER.count(text[start : end + len(MEMORY_CLOSE)])


async def run(args: argparse.Namespace) -> None:
    results: list[Result] = []
    async with FakeOpenAI(reply=covering) as fake:
        fake.delay_s = args.model_s
        for row in ROWS:
            results += await asyncio.gather(
                *(
                    session(args, fake, row, multi, f"s{args.seed}{row}{multi}")
                    for multi in (False, True)
                )
            )
    print(
        f"lastword run (console, piped, embedded store), quiet {args.quiet_ms} ms, no "
        f"speculation, model {args.model_s:g} s (streamed), {args.bursts} bursts per user, "
        f"{args.facts} facts per user with memory on, seed {args.seed}"
    )
    off = {r.kind: r for r in results if r.row == "off"}
    rows = []
    for r in results:
        p50 = statistics.median(r.latencies_ms) if r.latencies_ms else 0
        tokens = statistics.median(r.prompt_tokens) if r.prompt_tokens else 0
        block = statistics.median(r.block_tokens) if r.block_tokens else 0
        base = off[r.kind]
        base_p50 = statistics.median(base.latencies_ms) if base.latencies_ms else 0
        base_tokens = statistics.median(base.prompt_tokens) if base.prompt_tokens else 0
        rows.append(
            [
                f"memory {r.row}" + (f" ({args.facts} facts)" if r.row == "on" else ""),
                r.kind,
                str(len(r.latencies_ms)),
                f"{p50 / 1000:.2f}",
                f"{percentile(sorted(r.latencies_ms), 95) / 1000:.2f}" if r.latencies_ms else "-",
                f"{p50 / base_p50:.3f}" if base_p50 else "-",
                f"{tokens:.0f}",
                f"{tokens - base_tokens:+.0f}",
                f"{block:.0f}",
                f"{tokens - base_tokens - block:+.0f}",
            ]
        )
    headers = ["row", "user", "bursts", "last line -> reply p50 s", "p95 s", "p50 / off"]
    headers += ["prompt tok / reply", "vs off", "facts block tok", "tool + note tok"]
    print_table(headers, rows)
    for r in results:
        for problem in r.problems:
            print(f"  ! {problem}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.facts",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--facts", type=int, default=20, help="per user, with memory on")
    add_workload_args(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
