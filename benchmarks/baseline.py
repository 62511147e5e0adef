"""What the design buys: one burst workload through a naive bot and through lastword.

    python -m benchmarks.baseline [--users 200] [--bursts 2] [--seed 7]

The workload (seeded): `--users` users, each sending `--bursts` bursts of 3 or 4 messages
within `--burst-s` (1 s), the bursts `--gap-s` (4-6 s) apart, the first ones spread over
`--spread-s`. Each delivery goes to one of two processes at random, as behind a load
balancer, and `--redeliver` (10 %) of the messages are delivered a second time 0.5-3 s later,
to either process, as a platform does when it missed an acknowledgement. The model is a fake
that takes `--llm-ms` (200 ms) and answers with the messages it was asked about.

Both designs run as 2 OS processes (this module with ``--worker``) against one real server
(the embedded one), with the same quiet time (`--quiet-ms`, 1 s):

- naive: per message, append it to the history by read-modify-write (GET the JSON list,
  append, SET), keep it in the process's memory, `asyncio.sleep(quiet)`; if no newer message
  reached this process meanwhile, take the conversation's `asyncio.Lock` (process memory, so
  the two processes do not exclude each other), answer everything this process holds for it
  with one model call, send, append the reply (read-modify-write again). No dedupe of ids;
- lastword: the real runtime (`Runtime`, the store's scripts, timers, sweep, interrupt) with
  the echo model at the same delay and an outbound that records what it is given; max wait
  `--max-wait-ms`, everything else at its defaults.

From what the processes sent and stored (each message's id is in its text, so a reply names
the messages it covers) the report counts:

- lost: messages no reply covers;
- duplicate: replies that cover a message an earlier reply covered, or answer a burst an
  earlier reply already answered (two replies to one burst);
- stale: replies sent while a newer message of the user (one after every message the reply
  covers) was already stored;
- history: answered messages and sent replies missing from the stored history at the end.

"Stored" is when the store call returned (the naive SET, lastword's `Runtime.ingest`), the
same for both. A run ends `--settle-s` after the last delivery; a message still unanswered
then counts as lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis as SyncRedis
from redis.asyncio import Redis

from benchmarks.command_line import reap, timed_run
from benchmarks.wakeup import print_table
from bot.config.settings import DebounceSettings, InstalledSettings, LLMSettings
from bot.core.runtime import Runtime
from bot.llm.echo import EchoLLM
from bot.message import InboundMessage, NoFiles, Unavailable
from bot.service.app import make_store
from bot.store import HistoryEntry, Keys
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "bench"
DESIGNS = ("naive", "lastword")
PROCESSES = 2
TOKEN = re.compile(r"\bu\d+b\d+m\d+\b")
# Between "ready" and the first delivery: time for the plan to reach both processes.
START_DELAY_S = 0.5
# A worker that says nothing for this long is stuck.
WORKER_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Delivery:
    at: float  # seconds from the start
    user: int
    burst: int
    seq: int  # the message's place among its user's messages
    token: str  # the message id, also in its text
    process: int

    def message(self) -> InboundMessage:
        return InboundMessage(
            PLATFORM, str(self.user), str(self.user), self.token, f"about {self.token}"
        )


def workload(args: argparse.Namespace) -> list[Delivery]:
    rng = random.Random(args.seed)
    deliveries: list[Delivery] = []
    for user in range(args.users):
        start = rng.uniform(0, args.spread_s)
        seq = 0
        for burst in range(args.bursts):
            size = rng.choice((3, 4))
            times = [start, *sorted(start + rng.uniform(0, args.burst_s) for _ in range(size - 1))]
            for n, at in enumerate(times):
                token = f"u{user}b{burst}m{n}"
                deliveries.append(Delivery(at, user, burst, seq, token, rng.randrange(PROCESSES)))
                if rng.random() < args.redeliver:
                    later = at + rng.uniform(0.5, 3.0)
                    again = Delivery(later, user, burst, seq, token, rng.randrange(PROCESSES))
                    deliveries.append(again)
                seq += 1
            start = times[-1] + rng.uniform(*args.gap_s)
    return sorted(deliveries, key=lambda d: d.at)


# --- worker processes ----------------------------------------------------------------------


class Recorder(NoFiles):
    """The platform of both designs: what was stored, and every reply sent, with times."""

    max_message_chars = 4096
    typing_interval_s = 3600.0

    def __init__(self) -> None:
        self.stored: list[tuple[str, float]] = []
        self.sent: list[tuple[str, str, float]] = []

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        self.sent.append((idempotency_key, text, time.time()))

    async def typing(self, conversation: str) -> None:
        return None


def echo(texts: Sequence[str]) -> str:
    """What both designs' model answers: the echo model's words."""
    return "You said: " + " / ".join(texts)


def naive_history_key(conversation: str) -> str:
    return f"naive:{conversation}:history"


class Naive:
    """The bot one writes first: a sleep per message for debounce, a lock in process memory,
    history by read-modify-write, no dedupe."""

    def __init__(self, redis: Redis, recorder: Recorder, quiet_s: float, llm_s: float) -> None:
        self.redis = redis
        self.recorder = recorder
        self.quiet_s = quiet_s
        self.llm_s = llm_s
        self.held: dict[str, list[InboundMessage]] = {}
        self.arrivals: dict[str, int] = {}
        self.locks: dict[str, asyncio.Lock] = {}

    async def append(self, conversation: str, entry: dict[str, str]) -> list[dict[str, str]]:
        key = naive_history_key(conversation)
        raw = await self.redis.get(key)
        history: list[dict[str, str]] = json.loads(raw) if raw else []
        history.append(entry)
        await self.redis.set(key, json.dumps(history))
        return history

    async def handle(self, message: InboundMessage) -> None:
        conversation = message.conversation
        await self.append(conversation, {"role": "user", "id": message.message_id})
        self.recorder.stored.append((message.message_id, time.time()))
        self.held.setdefault(conversation, []).append(message)
        arrival = self.arrivals[conversation] = self.arrivals.get(conversation, 0) + 1
        await asyncio.sleep(self.quiet_s)
        if self.arrivals[conversation] != arrival:
            return  # a newer message's own wait answers it
        async with self.locks.setdefault(conversation, asyncio.Lock()):
            batch = self.held.pop(conversation, [])
            if not batch:
                return
            await self.redis.get(naive_history_key(conversation))  # the prompt's history
            await asyncio.sleep(self.llm_s)
            answer = echo([m.text for m in batch])
            await self.recorder.send(conversation, answer, uuid.uuid4().hex)
            await self.append(conversation, {"role": "assistant", "text": answer})


async def replay(plan: dict[str, Any], deliver: Any) -> None:
    """Each delivery of the plan at its time (wall clock, shared by both processes), as a
    task of its own, as adapters take updates in."""
    t0 = float(plan["t0"])
    tasks: list[asyncio.Task[None]] = []
    for at, raw in plan["deliveries"]:
        delay = t0 + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(deliver(InboundMessage.from_json(raw))))
    await asyncio.gather(*tasks)
    await asyncio.sleep(max(0.0, float(plan["end"]) - time.time()))


async def worker(args: argparse.Namespace) -> None:
    recorder = Recorder()
    print(json.dumps({"event": "ready"}), flush=True)
    plan: dict[str, Any] = json.loads(sys.stdin.readline())
    if args.worker == "naive":
        redis = Redis.from_url(args.url)
        naive = Naive(redis, recorder, args.quiet_ms / 1000, args.llm_ms / 1000)
        try:
            await replay(plan, naive.handle)
        finally:
            await redis.aclose()
    else:
        settings = InstalledSettings(
            platform="console",
            redis_url=args.url,
            data_dir=Path(tempfile.gettempdir()) / "lw-baseline",
            debounce=DebounceSettings(quiet_ms=args.quiet_ms, max_wait_ms=args.max_wait_ms),
            llm=LLMSettings(provider="echo", echo_delay_ms=args.llm_ms),
            replica_id=f"baseline-{os.getpid()}",
            log_level="WARNING",
        )
        store = make_store(settings, make_client(args.url))
        runtime = Runtime(settings, store, EchoLLM(args.llm_ms), recorder)

        async def deliver(message: InboundMessage) -> None:
            while True:
                try:
                    if await runtime.ingest(message):
                        recorder.stored.append((message.message_id, time.time()))
                    return
                except Unavailable:
                    await asyncio.sleep(0.05)  # not acknowledged: the platform retries

        runtime.start()
        try:
            await replay(plan, deliver)
        finally:
            await runtime.stop()
            await store.close()
    print(json.dumps({"stored": recorder.stored, "sent": recorder.sent}), flush=True)


# --- the parent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    at: float
    user: int
    tokens: frozenset[str]


@dataclass(frozen=True)
class Outcome:
    design: str
    messages: int
    bursts: int
    replies: int
    lost: int
    covered_twice: int
    duplicate: int
    stale: int
    history_messages_missing: int
    history_replies_missing: int


def start_workers(design: str, url: str, args: argparse.Namespace) -> list[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LASTWORD_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "benchmarks.baseline", "--worker", design, "--url", url]
    command += ["--quiet-ms", str(args.quiet_ms), "--max-wait-ms", str(args.max_wait_ms)]
    command += ["--llm-ms", str(args.llm_ms)]
    return [
        subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        for _ in range(PROCESSES)
    ]


def read_line(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker exited (code {process.wait()}) without its report")
    reply: dict[str, Any] = json.loads(line)
    return reply


def run_design(
    design: str, server: EmbeddedRedis, deliveries: list[Delivery], args: argparse.Namespace
) -> tuple[list[tuple[str, float]], list[tuple[str, str, float]]]:
    processes = start_workers(design, server.url, args)
    try:
        for process in processes:
            read_line(process)  # ready
        t0 = time.time() + START_DELAY_S
        end = t0 + deliveries[-1].at + args.settle_s
        for index, process in enumerate(processes):
            mine = [[d.at, d.message().to_json()] for d in deliveries if d.process == index]
            assert process.stdin is not None
            process.stdin.write(json.dumps({"t0": t0, "end": end, "deliveries": mine}) + "\n")
            process.stdin.flush()
        reports = [read_line(process) for process in processes]
    finally:
        for process in processes:
            reap(process, WORKER_TIMEOUT_S)
    stored = [(str(t), float(at)) for r in reports for t, at in r["stored"]]
    sent = [(str(k), str(text), float(at)) for r in reports for k, text, at in r["sent"]]
    return stored, sent


def stored_history(admin: SyncRedis, design: str, user: int) -> tuple[set[str], int]:
    """The message ids, and the number of replies, in a user's history at the end."""
    conversation = f"{PLATFORM}:{user}"
    if design == "naive":
        raw = admin.get(naive_history_key(conversation))
        entries: list[dict[str, str]] = json.loads(raw) if raw else []
        ids = {e["id"] for e in entries if e["role"] == "user"}
        return ids, sum(1 for e in entries if e["role"] == "assistant")
    raw_entries: list[bytes] = admin.lrange(Keys(conversation).history, 0, -1)  # type: ignore[assignment]
    found = [HistoryEntry.from_json(h.decode()) for h in raw_entries]
    ids = {t for e in found if e.role == "user" for t in TOKEN.findall(e.text)}
    return ids, sum(1 for e in found if e.role == "assistant")


def judge(
    design: str,
    deliveries: list[Delivery],
    stored: list[tuple[str, float]],
    sent: list[tuple[str, str, float]],
    admin: SyncRedis,
) -> Outcome:
    message = {d.token: d for d in deliveries}
    first_stored: dict[str, float] = {}
    for token, at in stored:
        first_stored[token] = min(at, first_stored.get(token, at))
    by_key: dict[str, Reply] = {}
    for key, text, at in sent:
        tokens = frozenset(TOKEN.findall(text))
        if key in by_key:  # a reply in several parts
            earlier = by_key[key]
            by_key[key] = Reply(earlier.at, earlier.user, earlier.tokens | tokens)
        elif tokens:
            by_key[key] = Reply(at, message[min(tokens)].user, tokens)
    replies = sorted(by_key.values(), key=lambda r: r.at)

    covered: dict[str, int] = {}
    answered_bursts: set[tuple[int, int]] = set()
    duplicate = stale = 0
    for reply in replies:
        bursts = {(reply.user, message[t].burst) for t in reply.tokens}
        if any(t in covered for t in reply.tokens) or bursts & answered_bursts:
            duplicate += 1
        answered_bursts |= bursts
        for token in reply.tokens:
            covered[token] = covered.get(token, 0) + 1
        newest = max(message[t].seq for t in reply.tokens)
        if any(
            d.user == reply.user and d.seq > newest and first_stored.get(d.token, 1e18) < reply.at
            for d in message.values()
        ):
            stale += 1

    missing_messages = missing_replies = 0
    for user in {d.user for d in deliveries}:
        ids, replies_kept = stored_history(admin, design, user)
        answered = {t for r in replies if r.user == user for t in r.tokens}
        missing_messages += len(answered - ids)
        missing_replies += max(0, sum(1 for r in replies if r.user == user) - replies_kept)
    return Outcome(
        design=design,
        messages=len(message),
        bursts=len({(d.user, d.burst) for d in deliveries}),
        replies=len(replies),
        lost=sum(1 for t in message if t not in covered),
        covered_twice=sum(1 for n in covered.values() if n > 1),
        duplicate=duplicate,
        stale=stale,
        history_messages_missing=missing_messages,
        history_replies_missing=missing_replies,
    )


def run(args: argparse.Namespace) -> tuple[list[Delivery], list[Outcome]]:
    deliveries = workload(args)
    folder = Path(tempfile.mkdtemp(prefix="lw-bench-", dir="/tmp"))
    server = EmbeddedRedis(folder / "redis")
    server.start()
    outcomes: list[Outcome] = []
    try:
        admin = SyncRedis(unix_socket_path=str(server.socket))
        try:
            for design in args.designs:
                admin.flushall()
                stored, sent = run_design(design, server, deliveries, args)
                outcomes.append(judge(design, deliveries, stored, sent, admin))
        finally:
            admin.close()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return deliveries, outcomes


def report(deliveries: list[Delivery], outcomes: list[Outcome], args: argparse.Namespace) -> None:
    messages = len({d.token for d in deliveries})
    bursts = len({(d.user, d.burst) for d in deliveries})
    print(
        f"workload (seed {args.seed}): {args.users} users, {bursts} bursts of 3-4 messages "
        f"within {args.burst_s:g} s, {messages} messages, {len(deliveries) - messages} "
        f"redelivered, over {deliveries[-1].at:.1f} s; {PROCESSES} processes, each delivery "
        "to either at random"
    )
    print(
        f"model: {args.llm_ms} ms fake; quiet {args.quiet_ms} ms for both, lastword max wait "
        f"{args.max_wait_ms} ms; cpus: {os.cpu_count()}"
    )
    print()
    rows = [
        ["replies (one per burst is right)", *(str(o.replies) for o in outcomes)],
        ["lost messages (no reply covers them)", *(str(o.lost) for o in outcomes)],
        ["duplicate replies", *(str(o.duplicate) for o in outcomes)],
        ["  ...messages covered by 2+ replies", *(str(o.covered_twice) for o in outcomes)],
        ["stale replies", *(str(o.stale) for o in outcomes)],
        [
            "answered messages missing from history",
            *(str(o.history_messages_missing) for o in outcomes),
        ],
        ["replies missing from history", *(str(o.history_replies_missing) for o in outcomes)],
    ]
    print_table(["", *(o.design for o in outcomes)], rows)
    print(
        "\nduplicate: a reply covering a message an earlier reply covered, or a second reply to"
        "\none burst. stale: sent while a newer message of the user was already stored."
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.baseline")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=2, help="bursts per user")
    parser.add_argument("--burst-s", type=float, default=1.0, help="a burst's span")
    parser.add_argument("--gap-s", type=float, nargs=2, default=[4.0, 6.0])
    parser.add_argument("--spread-s", type=float, default=4.0, help="first bursts over this")
    parser.add_argument("--redeliver", type=float, default=0.1, help="share redelivered")
    parser.add_argument("--llm-ms", type=int, default=200)
    parser.add_argument("--quiet-ms", type=int, default=1000)
    parser.add_argument("--max-wait-ms", type=int, default=3000)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--designs", nargs="+", choices=DESIGNS, default=list(DESIGNS))
    parser.add_argument("--worker", choices=DESIGNS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        asyncio.run(worker(args))
        return
    with timed_run():
        deliveries, outcomes = run(args)
        report(deliveries, outcomes, args)


if __name__ == "__main__":
    main()
