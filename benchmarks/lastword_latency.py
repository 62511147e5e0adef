"""Black-box reply latency: `lastword run` on the console, as a user meets it.

    python -m benchmarks.lastword_latency [--rows today speculate] [--bursts 6] [--seed 7]
        [--quiet-ms 2000] [--model-s 1.5] [--speculate-ms 400] [--floor-ms 600]

The bot runs as the README's "Try it" runs it: `lastword run`, console platform, the embedded
store in a fresh data directory, stdin and stdout piped (so no drafts), against the loopback
`FakeOpenAI` in this process, whose every answer takes `--model-s` (streamed, the pieces
spread over it). Per row, two users talk to it at once, each to a bot process of their own
(the console is one conversation): one sends single lines, the other bursts of 2-4 lines
0.2-1 s apart; each waits for the reply, then 0.5-1.5 s, before the next burst (seeded). One
line first, answered and not counted, warms the bot up.

What counts is what the user sees: from writing a burst's last line to the pipe until the
reply covering it is read from the bot's stdout. The table gives its median and p95, and the
median over `quiet + model` (the wait a fixed window costs: 1.0 means the bot adds nothing to
it; the issue's goal is at most 0.65 with speculation), and replies per burst (more than 1:
a burst was answered in parts).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.command_line import timed_run
from benchmarks.wakeup import percentile, print_table
from bot.config.settings import DebounceSettings
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.forked import Forked, spawn
from tests.support.running import clean_environ

TOKEN = re.compile(r"\bb\d+m\d+\b")
ROWS = ("today", "speculate", "learned", "both")
# How long a bot may take to start, or to exit once its input ends, before it is killed.
START_S = 30.0
EXIT_S = 15.0


def covering(request: RecordedRequest) -> str:
    """The fake's answer, one line: the tokens of the lines it was asked to answer."""
    return "covers " + " ".join(TOKEN.findall(request.last_user_text))


@dataclass(frozen=True)
class Burst:
    # Seconds to wait before each line after the first.
    gaps: tuple[float, ...]


def bursts(rng: random.Random, count: int, multi: bool) -> list[Burst]:
    sizes = [rng.randint(2, 4) if multi else 1 for _ in range(count)]
    return [Burst(tuple(rng.uniform(0.2, 1.0) for _ in range(size - 1))) for size in sizes]


@dataclass
class Session:
    """One user's run against one bot: latencies in ms, replies read, bursts sent."""

    kind: str
    latencies_ms: list[int]
    replies: int
    bursts: int
    problems: list[str]


class ConsoleBot:
    """`lastword run` with piped stdin and stdout: lines in, replies out, each with its time."""

    def __init__(self, process: asyncio.subprocess.Process | Forked) -> None:
        self.process = process
        self.replies: asyncio.Queue[tuple[float, str]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, env: dict[str, str]) -> ConsoleBot:
        # Forked from a process that has imported lastword (`tests.support.forked`), as the
        # other benchmarks' replicas are: a start costs a fork, not an interpreter's imports.
        process = await spawn(
            "run",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.replies.put_nowait((time.monotonic(), line.decode(errors="replace").strip()))

    async def say(self, text: str) -> float:
        """Write one line; when it was written."""
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode() + b"\n")
        await self.process.stdin.drain()
        return time.monotonic()

    async def burst(
        self, number: int, burst: Burst, rng: random.Random, mark: str = ""
    ) -> tuple[str, float]:
        """After a pause of 0.5-1.5 s, send burst `number`'s lines, each line's words naming
        it (`b<number>m<line>`, then `mark`): the token of its last line, and when that was
        written."""
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        last = await self.say(f"line b{number}m1{mark}, about this and that")
        for index, gap in enumerate(burst.gaps, 2):
            await asyncio.sleep(gap)
            last = await self.say(f"line b{number}m{index}{mark}, and more")
        return f"b{number}m{len(burst.gaps) + 1}", last

    async def reply_covering(self, token: str, timeout_s: float) -> tuple[float, int]:
        """When the reply covering `token` was read, and how many replies came until then."""
        count = 0
        async with asyncio.timeout(timeout_s):
            while True:
                at, text = await self.replies.get()
                count += 1
                if token in TOKEN.findall(text):
                    return at, count

    async def close(self) -> None:
        """End its input, as Ctrl-D does: it delivers what it owes, then exits."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), EXIT_S)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        await self._reader


def bot_env(args: argparse.Namespace, base_url: str, data_dir: Path, row: str) -> dict[str, str]:
    speculate = row in ("speculate", "both")
    return clean_environ() | {
        "LASTWORD_PLATFORM": "console",
        "LASTWORD_DATA_DIR": str(data_dir),
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": base_url,
        "LASTWORD_LLM__API_KEY": "bench",
        "LASTWORD_LLM__MODEL": "bench",
        "LASTWORD_DEBOUNCE__QUIET_MS": str(args.quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(args.max_wait_ms),
        "LASTWORD_DEBOUNCE__SPECULATE_MS": str(args.speculate_ms if speculate else 0),
        "LASTWORD_DEBOUNCE__LEARN": str(row in ("learned", "both")).lower(),
        "LASTWORD_DEBOUNCE__FLOOR_MS": str(args.floor_ms),
    }


async def session(
    args: argparse.Namespace, base_url: str, row: str, multi: bool, seed: str
) -> Session:
    """One user, one bot: the bursts, and what the user waited for each reply."""
    rng = random.Random(seed)
    kind = "bursts of 2-4" if multi else "single lines"
    result = Session(kind, [], 0, 0, [])
    # Longer than any reply can take: the window's cap, the model, and slack for a slow start.
    timeout_s = args.max_wait_ms / 1000 + args.model_s + 10
    with tempfile.TemporaryDirectory(prefix="lastword-latency-") as data_dir:
        bot = await ConsoleBot.start(bot_env(args, base_url, Path(data_dir), row))
        try:
            await bot.say("b0m1 to warm up")
            await bot.reply_covering("b0m1", START_S)
            for number, burst in enumerate(bursts(rng, args.bursts, multi), 1):
                token, last = await bot.burst(number, burst, rng)
                at, replies = await bot.reply_covering(token, timeout_s)
                result.latencies_ms.append(int((at - last) * 1000))
                result.replies += replies
                result.bursts += 1
        except TimeoutError:
            result.problems.append(f"{kind}: no reply within {timeout_s:g} s; stopped there")
        finally:
            await bot.close()
    return result


async def run_row(args: argparse.Namespace, base_url: str, row: str) -> list[Session]:
    """Both users at once, each against a bot process of its own."""
    return list(
        await asyncio.gather(
            *(
                session(args, base_url, row, multi, f"{args.seed}:{multi}")
                for multi in (False, True)
            )
        )
    )


def label(args: argparse.Namespace, row: str) -> str:
    return {
        "today": f"fixed {args.quiet_ms} ms (before speculation)",
        "speculate": f"speculate {args.speculate_ms} ms",
        "learned": f"learned, floor {args.floor_ms} ms",
        "both": f"speculate {args.speculate_ms} + learned {args.floor_ms}",
    }[row]


async def run(args: argparse.Namespace) -> None:
    results: list[tuple[str, list[Session]]] = []
    async with FakeOpenAI(reply=covering) as fake:
        fake.delay_s = args.model_s
        for row in args.rows:
            results.append((row, await run_row(args, fake.base_url, row)))
    print(
        f"lastword run (console, piped, embedded store), quiet {args.quiet_ms} ms, max wait "
        f"{args.max_wait_ms} ms, model {args.model_s:g} s (streamed), {args.bursts} bursts per "
        f"user, seed {args.seed}"
    )
    fixed_ms = args.quiet_ms + args.model_s * 1000
    rows = []
    for row, sessions in results:
        for s in sessions:
            lat = sorted(s.latencies_ms)
            median = statistics.median(lat) if lat else 0
            rows.append(
                [
                    label(args, row),
                    s.kind,
                    str(s.bursts),
                    f"{median / 1000:.2f}" if lat else "-",
                    f"{percentile(lat, 95) / 1000:.2f}" if lat else "-",
                    f"{median / fixed_ms:.2f}" if lat else "-",
                    f"{s.replies / max(s.bursts, 1):.2f}",
                ]
            )
    headers = ["row", "user", "bursts", "last line -> reply p50 s", "p95 s"]
    headers += ["p50 / (quiet + model)", "replies / burst"]
    print_table(headers, rows)
    for _, sessions in results:
        for s in sessions:
            for problem in s.problems:
                print(f"  ! {problem}")


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The workload's options, which `benchmarks.facts` shares: bursts, seed, window, model."""
    parser.add_argument("--bursts", type=int, default=6, help="per user, after the warm-up")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quiet-ms", type=int, default=DebounceSettings().quiet_ms)
    parser.add_argument("--max-wait-ms", type=int, default=DebounceSettings().max_wait_ms)
    parser.add_argument("--model-s", type=float, default=1.5, help="every answer's latency")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lastword_latency",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=["today", "speculate"])
    add_workload_args(parser)
    parser.add_argument("--speculate-ms", type=int, default=DebounceSettings().speculate_ms)
    parser.add_argument("--floor-ms", type=int, default=DebounceSettings().floor_ms)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
