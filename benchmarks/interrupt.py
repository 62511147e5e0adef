"""Answering at the last word: reply latency, split and stale replies, LLM requests and tokens,
for the ways of waiting for the user; and interrupting stale generations, on vs off.

    python -m benchmarks.interrupt [--rows today speculate learned both peers] [--users 200]
        [--seed 7] [--quiet-ms 2000] [--max-wait-ms 8000] [--details]
    python -m benchmarks.interrupt --workload typists [--rows both typing] [--model-s 0.5]
    python -m benchmarks.interrupt --compare [--ttft-s 0.5 0]

By default one seeded burst workload runs once per row, each a way of waiting for the user's
last word: `today` (the quiet window as configured, `--quiet-ms` and `--max-wait-ms`, fixed,
no speculation), `speculate` (generation starts after `--speculate-ms` of quiet, the reply
held until the window closes), `learned` (the quiet window follows the user's gaps, down to
`--floor-ms`), `both`, and `peers` (a fixed `--peers-quiet-ms` window, 500 ms as OpenClaw's
default debounce, with interrupt on). All rows interrupt a stale generation. One table
compares them: last message -> reply p50 and p95; replies per burst (a burst is a run of
messages the workload sends with short gaps; one reply covers several when a message lands
while the reply to the earlier ones is generated); split bursts (answered in parts: a reply
went out covering some of a burst's messages but not its last); stale replies (sent after a
message they do not cover had been taken in); LLM requests per reply;
prompt and completion tokens per reply, as the fake provider bills them (a request's prompt
when it lands, so a restarted request pays its prompt again; every piece streamed, cancelled
requests' included); newer message -> stream closed; the bot's event-loop lag.

`--workload typists` runs issue 35's comparison instead: whether a platform that reports its
users' typing lets the window cost nothing. Its users are of three kinds, a third each:
single-liners (one message, then they stop), fast bursts (2-4 messages 0.2-0.5 s apart) and
slow typists (2-3 lines 3.3-3.7 s apart, starting the next line 0.2-0.4 s after sending one).
Each user sends typing signals (`Runtime.user_typing`) as a Discord client does: when they
start writing a line (1-3 s before a first message, 0.05-0.15 s after the message before a
fast follow-up), and every `TYPING_REPEAT_S` while they keep writing it. Every row gets the
signals, but only the `typing` row's platform declares that it sees typing
(`bot.message.SeesTyping`); for the others the runtime ignores them, as it does on Telegram.
So the `typing` row is `both` on Discord, and `both` is the same bot where typing is not
reported. The model answers 40-80 tokens in a fixed `--model-s` (0.5 s; the first token at
half of it), so that the figure can be held against the best possible, max(floor, speculation
start + model time): the table gives each row's last message -> reply p50 and p95, overall and
per kind of user, their distance from the best possible, split bursts (every user means one
burst: a slow typist answered before their last line is one), replies per burst, tokens per
reply, and the model time as the fake served it.

`--compare` runs the comparison this benchmark was first written for instead: the `today` row
with `llm.interrupt` on (a generation is cancelled as soon as a newer message arrives) and off
(row `off`: the generation finishes and the pre-send check throws its reply away, as in the
seeds), for every time to first token given, with the detailed figures below.

Each run gets a fresh embedded server in a temporary directory, one in-process runtime, the
real `OpenAILLM` (streaming) pointed at the loopback `FakeOpenAI`, and a platform that
timestamps every send. The fake runs in a child process of its own: sharing the bot's event
loop, its per-piece sleeps drifted under load and stretched the 1-4 s latency several times
over.

Workload: each user starts at a random moment in the first `--stagger-s` seconds and sends 3-6
messages; each gap is short (0.2-1 s, within the quiet window) or long (1.5-6 s, so that it
often lands while the reply to the earlier messages is being generated), half and half. The
fake answers 150-300 words in a latency of 1-4 s: the first piece comes `--ttft-s` into it
(time to first token: queueing and prefill, at most half the latency) and the pieces are
spread evenly over the rest. The workload runs once per time to first token given: by default
0.5 s, typical of a hosted chat model (and, with `--compare`, then 0, where tokens stream
from the instant the request lands, which no real provider does and which leaves an
interrupt the least to save).
Length and latency are drawn from a generator seeded with the seed and the request's last user
turn, so that both modes see the same answer to the same prompt. The words are three letters
each, so the fake's own usage count (characters / 4) equals the pieces it streams: one piece
is one token in every figure below.

It measures, per run (`--details` prints these for every row):

- LLM requests started, per user and per reply delivered (a reply ends one burst);
- generated tokens thrown away, two ways. From the fake: the pieces it streamed for requests
  the client hung up on, plus every piece of finished requests whose text was never sent
  (requests are matched to sends by their text). From the runtime's `Stats`:
  `interrupted_tokens` (pieces the client had received when it cancelled) plus
  `discarded_tokens` (the usage the provider reported for replies the pre-send check
  dropped). The fake's count is the bill and the reference; it can be higher: pieces written
  before the client hung up but not yet read, and replies dropped on a lost lease, which
  `Stats` counts nowhere. Each thrown-away request is also split at the arrival of the
  message that made it stale (the fake's process samples every open stream every 10 ms):
  pieces before it no interrupt could save, pieces after it are what interrupting can save;
- median and p95 time from each user's last message (when `ingest` returned) to the send that
  covers it (the idempotency key carries the version a reply covers);
- replies per user, and whether each reply covered everything its user had sent by the time
  it went out; at the end, V == W for every conversation and the last send covers the last
  message;
- event-loop lag of the bot and of the fake: a loaded bot reads the stream late, which delays
  both the reply and the interrupt.

The ratio of thrown-away tokens, on / off, is issue 5's figure (it must be at most 0.5).
A run that does not settle within `--settle-s` prints what is missing instead of hanging.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import os
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

from pydantic import SecretStr

from benchmarks.child import Child
from benchmarks.command_line import timed_run
from benchmarks.wakeup import percentile, print_table, temporary_server
from bot.config.settings import DebounceSettings, InstalledSettings, LLMSettings, Settings
from bot.core.runtime import Runtime
from bot.llm.openai import OpenAILLM
from bot.message import InboundMessage, NoFiles, Place, Unavailable
from bot.service.app import make_store
from bot.stats import Stats
from bot.store import Store
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis, server_binary
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest

PLATFORM = "bench"
# Three-letter words: with the separating space, four characters, which the fake's usage
# estimate (characters / 4) counts as one token, the same as one streamed piece.
WORDS = [a + b + c for a in "bdfgklmnprst" for b in "aeiou" for c in "bdgkmnprst"]


# -- workload -------------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    index: int
    # Seconds from the start of the run at which each message is sent.
    offsets: tuple[float, ...]
    # Runs of messages sent with short gaps, what the user means as one message each: the
    # version (1, 2...) of each one's last message.
    burst_ends: tuple[int, ...]
    # What kind of user this is, for the figures by kind (`typists`'s KINDS).
    kind: str = "bursts"
    # Seconds from the start of the run at which the user's client sends a typing signal.
    typing: tuple[float, ...] = ()

    @property
    def conversation(self) -> str:
        return f"{PLATFORM}:{self.index}"

    def split(self, covered: list[int]) -> int:
        """How many of the bursts the replies (by the versions they cover) answered in parts:
        a reply went out covering some of a burst's messages but not its last."""
        starts = (0, *self.burst_ends[:-1])
        return sum(
            any(start < version < end for version in covered)
            for start, end in zip(starts, self.burst_ends, strict=True)
        )

    def message(self, n: int) -> InboundMessage:
        text = f"user {self.index} message {n + 1}: what about the thing I said?"
        return InboundMessage(
            PLATFORM, str(self.index), f"u{self.index}", f"{self.index}-{n + 1}", text
        )


def workload(args: argparse.Namespace) -> list[User]:
    """The users of the workload `--workload` names, seeded."""
    return typists(args) if args.workload == "typists" else bursts(args)


def bursts(args: argparse.Namespace) -> list[User]:
    """The default workload: users who write in bursts, sending no typing signals."""
    rng = random.Random(args.seed)
    users = []
    for index in range(args.users):
        at = rng.uniform(0, args.stagger_s)
        offsets = [at]
        ends = []
        for _ in range(rng.randint(*args.messages) - 1):
            if rng.random() < 0.5:
                at += rng.uniform(0.2, 1.0)
            else:
                at += rng.uniform(1.5, 6.0)
                ends.append(len(offsets))
            offsets.append(at)
        users.append(User(index, tuple(offsets), (*ends, len(offsets))))
    return users


# Issue 35's kinds of users, in the order the `typists` workload deals them out.
KINDS = ("single-liner", "fast burst", "slow typist")
# A Discord client repeats its typing signal this often while the user keeps writing (the
# signal lasts about 10 s on screen).
TYPING_REPEAT_S = 8.0


def signals(start: float, sent: float) -> list[float]:
    """When a client sends typing signals for a line the user starts writing at `start` and
    sends at `sent`: at the first keystroke, then every TYPING_REPEAT_S until it is sent."""
    times = []
    while start < sent:
        times.append(start)
        start += TYPING_REPEAT_S
    return times


def typists(args: argparse.Namespace) -> list[User]:
    """Issue 35's workload: single-liners, fast bursts and slow typists in turn, each of whom
    means everything they send as one burst, with the typing signals of a Discord client."""
    rng = random.Random(args.seed)
    users = []
    for index in range(args.users):
        kind = KINDS[index % len(KINDS)]
        # When the user starts writing each line, and when they send it.
        starts = [rng.uniform(0, args.stagger_s)]
        offsets = [starts[0] + rng.uniform(1.0, 3.0)]
        if kind == "fast burst":
            for _ in range(rng.randint(2, 4) - 1):
                starts.append(offsets[-1] + rng.uniform(0.05, 0.15))
                offsets.append(offsets[-1] + rng.uniform(0.2, 0.5))
        elif kind == "slow typist":
            for _ in range(rng.randint(2, 3) - 1):
                starts.append(offsets[-1] + rng.uniform(0.2, 0.4))
                offsets.append(offsets[-1] + rng.uniform(3.3, 3.7))
        typing = [
            t for start, sent in zip(starts, offsets, strict=True) for t in signals(start, sent)
        ]
        users.append(User(index, tuple(offsets), (len(offsets),), kind, tuple(typing)))
    return users


@dataclass(frozen=True)
class Model:
    """The ranges the fake's answers are drawn from, per request."""

    latency_s: tuple[float, float] = (1.0, 4.0)
    words: tuple[int, int] = (150, 300)


def model_of(args: argparse.Namespace) -> Model:
    """The model the workload runs against. For `typists`, a fixed latency, so that the best
    possible figure is one number, and short answers: the fake sleeps between pieces, and
    150-300 of them in 0.25 s stretched its 0.5 s to 0.66 s (p50, 200 users, a busy machine),
    where 40-80 keep it within about 40 ms."""
    if args.workload == "typists":
        return Model((args.model_s, args.model_s), (40, 80))
    return Model()


class Provider:
    """What the fake answers: seeded by the prompt, so both modes get the same answers."""

    def __init__(self, seed: int, ttft_s: float = 0.0, model: Model = Model()) -> None:
        self.seed = seed
        self.ttft_s = ttft_s
        self.model = model
        # Request (by identity: the fake keeps every request it recorded) -> its answer.
        self.texts: dict[int, str] = {}

    def reply(self, request: RecordedRequest) -> str:
        rng = random.Random(f"{self.seed}:reply:{request.last_user_text}")
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*self.model.words)))
        self.texts[id(request)] = text
        return text

    def delay(self, request: RecordedRequest) -> float:
        rng = random.Random(f"{self.seed}:delay:{request.last_user_text}")
        return rng.uniform(*self.model.latency_s)

    def first_token(self, request: RecordedRequest) -> float:
        """Time to first token, within the latency: at most half of it."""
        return min(self.ttft_s, self.delay(request) / 2)


# -- the provider, in a process of its own -------------------------------------------------

# How often the provider's process notes how far each open request has streamed.
SAMPLE_S = 0.01


@dataclass(frozen=True)
class Served:
    """One request as the fake provider saw it, sent back from its process."""

    started_at: float
    # When it finished streaming (None: it did not).
    ended_at: float | None
    last_user_text: str
    # What the fake answered (None: it never got as far as choosing an answer).
    text: str | None
    pieces: int
    # What the fake billed for the prompt (every request pays its own).
    prompt_tokens: int
    finished: bool
    cancelled: bool
    # When the sampler first saw the request finished or cancelled.
    closed_at: float | None
    # (time first seen, pieces streamed) at every change, SAMPLE_S apart at most.
    timeline: tuple[tuple[float, int], ...]

    def pieces_by(self, at: float) -> int:
        """Pieces streamed by `at` (to within one sample)."""
        index = bisect.bisect_right(self.timeline, (at, self.pieces + 1))
        return self.timeline[index - 1][1] if index else 0


@dataclass(frozen=True)
class ProviderReport:
    served: list[Served]
    lags_ms: list[int]
    problems: list[str]


class Sampler:
    """Follows every open request's streamed pieces over time, so that the pieces streamed
    before a given moment (the newer message's arrival) can be told apart afterwards."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.timelines: list[list[tuple[float, int]]] = []
        self.closed_at: list[float | None] = []
        self.open: list[int] = []

    def sample(self) -> None:
        now = time.monotonic()
        while len(self.timelines) < len(self.fake.requests):
            self.open.append(len(self.timelines))
            self.timelines.append([])
            self.closed_at.append(None)
        still_open = []
        for i in self.open:
            request, timeline = self.fake.requests[i], self.timelines[i]
            if not timeline or timeline[-1][1] != request.pieces_streamed:
                timeline.append((now, request.pieces_streamed))
            if request.finished or request.cancelled:
                self.closed_at[i] = now
            else:
                still_open.append(i)
        self.open = still_open

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_S)


def provider_main(seed: int, ttft_s: float, model: Model, conn: Connection) -> None:
    """The provider's process: the fake on loopback until the bot has settled."""
    asyncio.run(serve_provider(seed, ttft_s, model, conn))


async def serve_provider(seed: int, ttft_s: float, model: Model, conn: Connection) -> None:
    provider = Provider(seed, ttft_s, model)
    lag = LoopLag()
    async with FakeOpenAI(reply=provider.reply) as fake:
        fake.delay_for = provider.delay
        if ttft_s > 0:
            fake.first_token_for = provider.first_token
        sampler = Sampler(fake)
        tasks = [asyncio.create_task(sampler.run()), asyncio.create_task(lag.run())]
        conn.send(fake.base_url)
        # Anything, or the bot's end closing, means the run is over.
        with contextlib.suppress(EOFError):
            await asyncio.to_thread(conn.recv)
        problems = await wait_requests_closed(fake, 5.0)
        for task in tasks:
            task.cancel()
        sampler.sample()
        served = [
            Served(
                started_at=r.started_at,
                ended_at=r.ended_at,
                last_user_text=r.last_user_text,
                text=provider.texts.get(id(r)),
                pieces=r.pieces_streamed,
                prompt_tokens=r.prompt_tokens,
                finished=r.finished,
                cancelled=r.cancelled,
                closed_at=sampler.closed_at[i],
                timeline=tuple(sampler.timelines[i]),
            )
            for i, r in enumerate(fake.requests)
        ]
    with contextlib.suppress(OSError):
        conn.send(ProviderReport(served, lag.lags_ms, problems))


async def wait_requests_closed(fake: FakeOpenAI, timeout_s: float) -> list[str]:
    """The fake marks a hung-up request cancelled once aiohttp notices: give it a moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        open_ = [r for r in fake.requests if not (r.finished or r.cancelled)]
        if not open_:
            return []
        if time.monotonic() > deadline:
            return [f"{len(open_)} requests neither finished nor cancelled after settling"]
        await asyncio.sleep(0.05)


# -- the platform ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    at: float
    text: str
    # The version the reply covers, from the idempotency key "<conversation>:<version>:<part>".
    version: int


class TimedOutbound(NoFiles):
    """A platform that keeps every part it is given, with the time it was given."""

    max_message_chars = 4096
    # Typing indicators touch no Redis; repeating them rarely keeps the event loop quiet.
    typing_interval_s = 3600.0

    def __init__(self) -> None:
        self.sent: dict[str, list[Sent]] = {}
        self.notices = 0

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        version = idempotency_key.removeprefix(conversation + ":").split(":")[0]
        if not version.isdigit():
            self.notices += 1  # a rate-limit notice or the like: not a reply
            return
        self.sent.setdefault(conversation, []).append(Sent(time.monotonic(), text, int(version)))

    async def typing(self, conversation: str) -> None:
        return None


class TypingOutbound(TimedOutbound):
    """The `typing` row's platform: one that reports its users' typing, as Discord does in DMs
    (`bot.message.SeesTyping`), so the runtime acts on the workload's typing signals."""

    def sees_typing(self, place: Place) -> bool:
        return True


class LoopLag:
    """How late the event loop wakes a 50 ms sleep: the load the measurements ran under."""

    def __init__(self) -> None:
        self.lags_ms: list[int] = []

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.05)
            self.lags_ms.append(int((time.monotonic() - before - 0.05) * 1000))


# -- one mode -------------------------------------------------------------------------------


@dataclass
class Outcome:
    mode: str
    ttft_s: float
    users: list[User]
    provider: ProviderReport
    sent: dict[str, list[Sent]]
    # When ingest returned for each message, per conversation.
    ingested: dict[str, list[float]]
    counters: dict[str, tuple[int, int]]
    stats: Stats
    lags_ms: list[int]
    wall_s: float
    server_version: str
    problems: list[str] = field(default_factory=list)


# The starvation guard to run with: the shipped one (by the oldest message's age, a count as
# its backstop), or the count alone as it was before (3 discards in a row, no age).
# (starvation_age_ms, starvation_limit)
GUARDS: dict[str, tuple[int, int]] = {
    "time": (
        Settings.model_fields["starvation_age_ms"].default,
        Settings.model_fields["starvation_limit"].default,
    ),
    "count": (0, 3),
}


ROWS = ("today", "off", "speculate", "learned", "both", "peers", "typing")


@dataclass(frozen=True)
class Row:
    """One way of waiting for the user's last word, run against the same workload."""

    name: str
    label: str
    debounce: DebounceSettings
    interrupt: bool = True
    # Whether the platform reports the users' typing (the runtime ignores it otherwise).
    sees_typing: bool = False


def rows_of(args: argparse.Namespace) -> dict[str, Row]:
    """Every row the command line can ask for, by name."""

    def window(speculate: bool = False, learn: bool = False) -> DebounceSettings:
        return DebounceSettings(
            quiet_ms=args.quiet_ms,
            max_wait_ms=args.max_wait_ms,
            speculate_ms=args.speculate_ms if speculate else 0,
            learn=learn,
            floor_ms=args.floor_ms,
        )

    peers = DebounceSettings(
        quiet_ms=args.peers_quiet_ms, max_wait_ms=args.max_wait_ms, speculate_ms=0, learn=False
    )
    both = f"speculate {args.speculate_ms} + learned {args.floor_ms}"
    rows = [
        Row("today", f"fixed {args.quiet_ms} ms (before speculation)", window()),
        Row("off", f"fixed {args.quiet_ms} ms, interrupt off", window(), interrupt=False),
        Row("speculate", f"speculate {args.speculate_ms} ms", window(speculate=True)),
        Row("learned", f"learned, floor {args.floor_ms} ms", window(learn=True)),
        Row("both", both, window(speculate=True, learn=True)),
        Row("peers", f"peers (quiet {args.peers_quiet_ms} ms)", peers),
        Row(
            "typing",
            f"{both} + typing",
            window(speculate=True, learn=True),
            sees_typing=True,
        ),
    ]
    return {row.name: row for row in rows}


def mode_settings(
    server: EmbeddedRedis, base_url: str, args: argparse.Namespace, row: Row
) -> Settings:
    return InstalledSettings(
        platform="console",
        redis_url=server.url,
        data_dir=server.data_dir,
        debounce=row.debounce,
        llm=LLMSettings(
            provider="openai",
            base_url=base_url,
            api_key=SecretStr("bench"),
            model="bench",
            stream=True,
            interrupt=row.interrupt,
        ),
        log_level="WARNING",
        starvation_age_ms=GUARDS[args.guard][0],
        starvation_limit=GUARDS[args.guard][1],
    )


async def user_session(runtime: Runtime, user: User, start: float, times: list[float]) -> None:
    for n, offset in enumerate(user.offsets):
        delay = start + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        message = user.message(n)
        # A store hiccup is retried, as an adapter that did not acknowledge would see it again.
        for _ in range(20):
            try:
                await runtime.ingest(message)
                break
            except Unavailable:
                await asyncio.sleep(0.1)
        times.append(time.monotonic())


async def user_typing(runtime: Runtime, user: User, start: float) -> None:
    """The user's client reporting their typing, at the workload's times."""
    place = user.message(0).place
    for offset in user.typing:
        delay = start + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await runtime.user_typing(place)


async def settle(runtime: Runtime, store: Store, users: list[User], timeout_s: float) -> list[str]:
    """Wait until every conversation is answered; on timeout, say which are not and why."""
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(runtime.settled(u.conversation) for u in users))
        return []
    except TimeoutError:
        missing = []
        for user in users:
            v, w = await store.counters(user.conversation)
            running = user.conversation in runtime._running
            if v != w or running:
                missing.append(f"{user.conversation}: V={v} W={w}" + (" (cycle running)" * running))
        return [f"not settled after {timeout_s:g} s: {len(missing)} conversations", *missing]


async def run_mode(args: argparse.Namespace, users: list[User], row: Row, ttft_s: float) -> Outcome:
    lag = LoopLag()
    outbound = TypingOutbound() if row.sees_typing else TimedOutbound()
    ingested: dict[str, list[float]] = {u.conversation: [] for u in users}
    # In a process of its own (benchmarks.child), so that streaming costs the bot no CPU and
    # the bot's load cannot stretch the provider's latency.
    provider = Child("fake-openai", provider_main, args.seed, ttft_s, model_of(args))
    try:
        base_url = cast(str, await provider.start())
        async with temporary_server() as server:
            settings = mode_settings(server, base_url, args, row)
            redis = make_client(server.url)
            store = make_store(settings, redis)
            llm = OpenAILLM(settings.llm)
            runtime = Runtime(settings, store, llm, outbound)
            lagger = asyncio.create_task(lag.run())
            runtime.start()
            started = time.monotonic()
            problems: list[str] = []
            try:
                await asyncio.gather(
                    *(user_session(runtime, u, started, ingested[u.conversation]) for u in users),
                    *(user_typing(runtime, u, started) for u in users),
                )
                problems += await settle(runtime, store, users, args.settle_s)
                wall_s = time.monotonic() - started
                counters = {u.conversation: await store.counters(u.conversation) for u in users}
                info = await redis.info("server")
            finally:
                lagger.cancel()
                await runtime.stop()
                await llm.client.close()
                await redis.aclose()
        report = cast(ProviderReport, await provider.finish())
    finally:
        await provider.close()
    return Outcome(
        row.label,
        ttft_s,
        users,
        report,
        outbound.sent,
        ingested,
        counters,
        runtime.stats,
        lag.lags_ms,
        wall_s,
        str(info.get("valkey_version") or info.get("redis_version")),
        problems + report.problems,
    )


# -- figures --------------------------------------------------------------------------------

MESSAGE_RE = re.compile(r"user (\d+) message (\d+):")


@dataclass(frozen=True)
class Cut:
    """Where a thrown-away generation stood when the message that made it stale arrived."""

    # Pieces streamed before the newer message was ingested: no interrupt could save them.
    before: int
    # Pieces streamed after it: what an interrupt can save.
    after: int
    # Milliseconds from the newer message to the end of the stream (cancel or finish).
    ran_on_ms: int | None


def cut(o: Outcome, request: Served) -> Cut | None:
    """Split a thrown-away request's pieces at the arrival of the message that made it stale:
    the first message of its user beyond those its prompt folded."""
    found = MESSAGE_RE.findall(request.last_user_text)
    if not found:
        return None
    user = int(found[-1][0])
    covered = max(int(n) for _, n in found)
    times = o.ingested[f"{PLATFORM}:{user}"]
    if covered >= len(times):
        return None  # nothing newer: not a stale generation
    newer_at = times[covered]
    before = min(request.pieces_by(newer_at), request.pieces)
    ran_on = None if request.closed_at is None else int((request.closed_at - newer_at) * 1000)
    return Cut(before, request.pieces - before, ran_on)


@dataclass(frozen=True)
class Figures:
    mode: str
    ttft_s: float
    users: int
    messages: int
    bursts: int
    # Bursts answered in parts (see `User.split`).
    split: int
    requests: int
    prompt_tokens: int
    cancelled: int
    finished_sent: int
    finished_dropped: int
    replies: int
    generated: int
    thrown_fake: int
    thrown_stats: int
    thrown_before: int
    thrown_after: int
    unmatched: int
    ran_on_ms: list[int]
    latencies_ms: list[int]
    # The same, per kind of user (`User.kind`).
    latencies_by_kind: dict[str, list[int]]
    # How long the fake took over each request it finished: the model time the bot saw.
    model_ms: list[int]
    replies_per_user: Counter[int]
    overtaken: int
    # The longest any message waited for the reply that covered it.
    longest_wait_ms: int
    unanswered: list[str]
    stats: Stats
    lags_ms: list[int]
    provider_lags_ms: list[int]
    wall_s: float
    problems: list[str]
    server_version: str

    @classmethod
    def of(cls, o: Outcome) -> Figures:
        delivered = {s.text.strip() for sends in o.sent.values() for s in sends}
        served = o.provider.served
        cancelled = [r for r in served if r.cancelled]
        finished = [r for r in served if r.finished]
        dropped = [r for r in finished if (r.text or "").strip() not in delivered]
        thrown_fake = sum(r.pieces for r in cancelled) + sum(r.pieces for r in dropped)
        cuts = [c for c in (cut(o, r) for r in [*cancelled, *dropped]) if c is not None]
        latencies: list[int] = []
        by_kind: dict[str, list[int]] = {}
        per_user: Counter[int] = Counter()
        overtaken = 0
        longest = 0
        unanswered: list[str] = []
        for user in o.users:
            conv = user.conversation
            times = o.ingested[conv]
            sends = o.sent.get(conv, [])
            per_user[len(sends)] += 1
            for s in sends:
                # Did the user say more than this reply covers before it went out?
                if sum(1 for t in times if t < s.at) > s.version:
                    overtaken += 1
            v, w = o.counters[conv]
            covering = [s for s in sends if s.version >= len(user.offsets)]
            if v != len(user.offsets) or v != w or not covering:
                unanswered.append(f"{conv}: sent {len(user.offsets)}, V={v} W={w}")
                continue
            latency = int((covering[0].at - times[-1]) * 1000)
            latencies.append(latency)
            by_kind.setdefault(user.kind, []).append(latency)
            for version, sent_at in enumerate(times, 1):
                answer = next((s for s in sends if s.version >= version), None)
                if answer is not None:
                    longest = max(longest, int((answer.at - sent_at) * 1000))
        return cls(
            mode=o.mode,
            ttft_s=o.ttft_s,
            users=len(o.users),
            messages=sum(len(u.offsets) for u in o.users),
            bursts=sum(len(u.burst_ends) for u in o.users),
            split=sum(
                u.split([s.version for s in o.sent.get(u.conversation, [])]) for u in o.users
            ),
            requests=len(served),
            prompt_tokens=sum(r.prompt_tokens for r in served),
            cancelled=len(cancelled),
            finished_sent=len(finished) - len(dropped),
            finished_dropped=len(dropped),
            replies=sum(len(s) for s in o.sent.values()),
            generated=sum(r.pieces for r in served),
            thrown_fake=thrown_fake,
            thrown_stats=o.stats.interrupted_tokens + o.stats.discarded_tokens,
            thrown_before=sum(c.before for c in cuts),
            thrown_after=sum(c.after for c in cuts),
            unmatched=len(cancelled) + len(dropped) - len(cuts),
            ran_on_ms=sorted(c.ran_on_ms for c in cuts if c.ran_on_ms is not None),
            latencies_ms=sorted(latencies),
            latencies_by_kind={kind: sorted(ms) for kind, ms in by_kind.items()},
            model_ms=sorted(
                int((r.ended_at - r.started_at) * 1000) for r in finished if r.ended_at is not None
            ),
            replies_per_user=per_user,
            overtaken=overtaken,
            longest_wait_ms=longest,
            unanswered=unanswered,
            stats=o.stats,
            lags_ms=sorted(o.lags_ms),
            provider_lags_ms=sorted(o.provider.lags_ms),
            wall_s=o.wall_s,
            problems=o.problems,
            server_version=o.server_version,
        )

    def rows(self) -> list[list[str]]:
        s = self.stats
        lat = self.latencies_ms
        lags = self.lags_ms or [0]
        plags = self.provider_lags_ms or [0]
        rx = self.ran_on_ms
        dist = ", ".join(f"{n}: {c}" for n, c in sorted(self.replies_per_user.items()))
        diff = self.thrown_fake - self.thrown_stats
        return [
            ["users / messages", f"{self.users} / {self.messages}"],
            ["LLM requests started", str(self.requests)],
            ["  per user", f"{self.requests / self.users:.2f}"],
            ["  per reply delivered", f"{self.requests / max(self.replies, 1):.2f}"],
            [
                "  cancelled / finished+sent / finished+dropped",
                f"{self.cancelled} / {self.finished_sent} / {self.finished_dropped}",
            ],
            ["tokens generated (fake)", str(self.generated)],
            ["prompt tokens billed (fake)", str(self.prompt_tokens)],
            ["tokens thrown away (fake)", str(self.thrown_fake)],
            [
                "tokens thrown away (Stats)",
                f"{self.thrown_stats} = {s.interrupted_tokens} interrupted"
                f" + {s.discarded_tokens} discarded",
            ],
            ["  fake - Stats", f"{diff:+d}"],
            ["  share of generated", f"{self.thrown_fake / max(self.generated, 1):.1%}"],
            [
                "  before / after the newer message (est.)",
                f"{self.thrown_before} / {self.thrown_after}"
                + (f" ({self.unmatched} unmatched)" if self.unmatched else ""),
            ],
            [
                "  newer message -> stream ends, p50 / p95 ms",
                f"{percentile(rx, 50)} / {percentile(rx, 95)}" if rx else "-",
            ],
            ["completion tokens (Stats)", str(s.completion_tokens)],
            [
                "Stats: interrupted / discarded / forced",
                f"{s.interrupted} / {s.discarded} / {s.forced}",
            ],
            ["Stats: apologies / lost leases", f"{s.apologies} / {s.lost}"],
            ["replies delivered", f"{self.replies} ({self.replies / self.users:.2f} per user)"],
            ["  users by number of replies", dist],
            ["  replies overtaken by a message", str(self.overtaken)],
            [
                "  forced by the starvation guard, per 100 replies",
                f"{100 * s.forced / max(self.replies, 1):.1f}",
            ],
            ["any message -> its reply, max ms", str(self.longest_wait_ms)],
            ["last message -> reply, median ms", str(statistics.median(lat)) if lat else "-"],
            ["last message -> reply, p95 ms", str(percentile(lat, 95)) if lat else "-"],
            ["last message -> reply, max ms", str(lat[-1]) if lat else "-"],
            ["users answered to the end (V == W)", f"{len(lat)} / {self.users}"],
            [
                "event-loop lag p50 / p99 / max ms, bot",
                f"{percentile(lags, 50)} / {percentile(lags, 99)} / {lags[-1]}",
            ],
            [
                "event-loop lag p50 / p99 / max ms, provider",
                f"{percentile(plags, 50)} / {percentile(plags, 99)} / {plags[-1]}",
            ],
            ["run time s (first message to settled)", f"{self.wall_s:.1f}"],
        ]


def ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "-"


def header(args: argparse.Namespace, version: str) -> None:
    print(f"server: {Path(server_binary()).name} {version} (embedded, unix socket)")
    print(f"cpus: {os.cpu_count()}, bot and fake provider in two processes, seed {args.seed}")
    print(
        f"settings: quiet_ms={args.quiet_ms} max_wait_ms={args.max_wait_ms} unless the row "
        "says otherwise, "
        f"lease ttl_ms=30000, interrupt_poll_ms={LLMSettings().interrupt_poll_ms}, "
        f"starvation guard: {args.guard} (age_ms, limit = {GUARDS[args.guard]}), "
        f"stream=True, OpenAILLM -> FakeOpenAI"
    )
    ttft = f"time to first token {' and '.join(f'{t:g}' for t in args.ttft_s)} s"
    if args.workload == "typists":
        print(
            f"workload: {args.users} users starting over {args.stagger_s:g} s, a third each "
            "single-liners (1 message), fast bursts (2-4 messages 0.2-0.5 s apart) and slow "
            "typists (2-3 lines 3.3-3.7 s apart), typing signals as a Discord client sends "
            f"them; replies 40-80 tokens in {args.model_s:g} s, {ttft} "
            "(at most half the latency)"
        )
        return
    print(
        f"workload: {args.users} users starting over {args.stagger_s:g} s, "
        f"{args.messages[0]}-{args.messages[1]} messages each, "
        "gaps 0.2-1 s or 1.5-6 s (1:1); replies 150-300 tokens, latency 1-4 s, "
        f"{ttft} (at most half the latency)"
    )


def details(figures: Figures) -> None:
    print(f"\n== {figures.mode}, time to first token {figures.ttft_s:g} s")
    print_table(["figure", "value"], figures.rows())
    for line in figures.problems + figures.unanswered[:20]:
        print(f"  ! {line}")


def report(on: Figures, off: Figures) -> None:
    details(on)
    details(off)
    print(f"\n== comparison (on vs off), time to first token {on.ttft_s:g} s")
    rows = [
        ["LLM requests", str(on.requests), str(off.requests), ratio(on.requests, off.requests)],
        [
            "tokens thrown away (fake)",
            str(on.thrown_fake),
            str(off.thrown_fake),
            ratio(on.thrown_fake, off.thrown_fake),
        ],
        [
            "tokens thrown away (Stats)",
            str(on.thrown_stats),
            str(off.thrown_stats),
            ratio(on.thrown_stats, off.thrown_stats),
        ],
        [
            "tokens generated",
            str(on.generated),
            str(off.generated),
            ratio(on.generated, off.generated),
        ],
    ]
    for name, p in (("median", 50), ("p95", 95)):
        a = percentile(on.latencies_ms, p) if on.latencies_ms else 0
        b = percentile(off.latencies_ms, p) if off.latencies_ms else 0
        rows.append([f"last message -> reply {name} ms", str(a), str(b), ratio(a, b)])
    rows.append(
        [
            "thrown away before the newer message",
            str(on.thrown_before),
            str(off.thrown_before),
            ratio(off.thrown_before, off.thrown_fake) + " *",
        ]
    )
    rows.append(
        [
            "thrown away after the newer message",
            str(on.thrown_after),
            str(off.thrown_after),
            ratio(on.thrown_after, off.thrown_after),
        ]
    )
    print_table(["figure", "on", "off", "on / off"], rows)
    print(
        "* with interrupt off, the pieces streamed before the message that made them stale, over"
        "\n  all it threw away: the best ratio an instant interrupt could reach on this workload."
    )


def summary(pairs: list[tuple[float, Figures, Figures]]) -> None:
    """Issue 5's figure for every time to first token: thrown-away tokens, on over off."""
    print("\n== thrown-away tokens, interrupt on / off (the fake's count; issue 5 wants <= 0.5)")
    rows = []
    for ttft_s, on, off in pairs:
        verdict = "met" if on.thrown_fake * 2 <= off.thrown_fake else "NOT met"
        rows.append(
            [
                f"{ttft_s:g} s",
                str(on.thrown_fake),
                str(off.thrown_fake),
                ratio(on.thrown_fake, off.thrown_fake),
                ratio(off.thrown_before, off.thrown_fake),
                verdict,
            ]
        )
    print_table(["time to first token", "on", "off", "on / off", "best possible", "<= 0.5"], rows)


def seconds(ms: Sequence[int], p: float) -> str:
    return f"{percentile(ms, p) / 1000:.2f}" if ms else "-"


def compared(runs: list[Figures]) -> None:
    """The rows side by side, per time to first token: issue 22's table."""
    print(
        f"\n== ways of waiting for the last word, time to first token {runs[0].ttft_s:g} s "
        "(tokens as the fake bills them)"
    )
    rows = []
    for f in runs:
        replies = max(f.replies, 1)
        closed, lags = f.ran_on_ms, f.lags_ms or [0]
        rows.append(
            [
                f.mode,
                seconds(f.latencies_ms, 50),
                seconds(f.latencies_ms, 95),
                f"{f.replies / f.bursts:.2f}",
                str(f.split),
                str(f.overtaken),
                f"{f.requests / replies:.2f}",
                f"{f.prompt_tokens / replies:.0f}",
                f"{f.generated / replies:.0f}",
                f"{percentile(closed, 50)} / {percentile(closed, 95)}" if closed else "-",
                str(percentile(lags, 99)),
                f"{len(f.latencies_ms)} / {f.users}",
            ]
        )
    headers = ["row", "last -> reply p50 s", "p95 s", "replies / burst", "split bursts"]
    headers += ["stale replies"]
    headers += ["requests / reply", "prompt tok / reply", "completion tok / reply"]
    headers += ["newer -> closed p50 / p95 ms", "loop lag p99 ms", "answered"]
    print_table(headers, rows)
    for f in runs:
        for line in f.problems + f.unanswered[:20]:
            print(f"  ! {f.mode}: {line}")
    print(
        f"  bursts: runs of messages 0.2-1 s apart ({runs[0].bursts} in {runs[0].messages} "
        "messages; a reply may cover several); split: a burst answered in parts;\n"
        "  stale: a reply sent after a message it does not cover was taken in"
    )


def best_possible_ms(args: argparse.Namespace) -> int:
    """The soonest a reply can follow the last message of a user who has stopped typing:
    not before the window's floor, nor before a generation started after `--speculate-ms` of
    quiet has taken the model's time; where speculation would not start before the floor, the
    generation starts at it."""
    floor_ms: int = min(args.floor_ms, args.quiet_ms)
    speculate_ms: int = args.speculate_ms
    model_ms: int = round(args.model_s * 1000)
    if 0 < speculate_ms < floor_ms:
        return max(floor_ms, speculate_ms + model_ms)
    return floor_ms + model_ms


def typists_compared(runs: list[Figures], args: argparse.Namespace) -> None:
    """The rows side by side on the typists' workload, against the best possible: issue 35's
    table."""
    best = best_possible_ms(args)
    print(
        f"\n== typing signals, model time {args.model_s:g} s, time to first token "
        f"{runs[0].ttft_s:g} s: best possible last message -> reply = max(floor "
        f"{min(args.floor_ms, args.quiet_ms)}, speculation {args.speculate_ms} + model "
        f"{round(args.model_s * 1000)}) = {best} ms"
    )
    rows = []
    for f in runs:
        lat, model, lags = f.latencies_ms, f.model_ms, f.lags_ms or [0]
        replies = max(f.replies, 1)
        rows.append(
            [
                f.mode,
                seconds(lat, 50),
                seconds(lat, 95),
                f"{percentile(lat, 50) - best:+d}" if lat else "-",
                str(f.split),
                f"{f.replies / f.bursts:.2f}",
                f"{f.prompt_tokens / replies:.0f} + {f.generated / replies:.0f}",
                *(seconds(f.latencies_by_kind.get(kind, []), 50) for kind in KINDS),
                str(percentile(model, 50)) if model else "-",
                str(percentile(lags, 99)),
                f"{len(lat)} / {f.users}",
            ]
        )
    headers = ["row", "last -> reply p50 s", "p95 s", "p50 - best ms", "split bursts"]
    headers += ["replies / burst", "prompt + completion tok / reply"]
    headers += [f"{kind}s p50 s" for kind in KINDS]
    headers += ["model p50 ms", "loop lag p99 ms", "answered"]
    print_table(headers, rows)
    for f in runs:
        for line in f.problems + f.unanswered[:20]:
            print(f"  ! {f.mode}: {line}")
    users = workload(args)
    kinds = Counter(u.kind for u in users)
    counts = ", ".join(f"{kinds[kind]} {kind}s" for kind in KINDS)
    print(
        f"  bursts: one per user, everything they send ({counts}); "
        "split: a burst answered in parts;\n"
        "  model: the fake's request -> last piece, as it served them"
    )
    sent = sum(len(u.typing) for u in users)
    for f in runs:
        s = f.stats
        if s.typing_signals:
            print(
                f"  typing signals, {f.mode}: {sent} sent, {s.typing_signals} passed on to the "
                f"store, {s.typing_held} held a window, {s.typing_cut} cut a speculation"
            )


async def run(args: argparse.Namespace) -> None:
    users = workload(args)
    rows = rows_of(args)
    names = ["today", "off"] if args.compare else args.rows
    if args.ttft_s is None:
        args.ttft_s = [0.5, 0.0] if args.compare else [0.5]
    runs = [
        [Figures.of(await run_mode(args, users, rows[name], ttft_s)) for name in names]
        for ttft_s in args.ttft_s
    ]
    header(args, runs[0][0].server_version)
    if args.compare:
        for on, off in runs:
            report(on, off)
        summary([(on.ttft_s, on, off) for on, off in runs])
        return
    for figures in runs:
        if args.details:
            for f in figures:
                details(f)
        if args.workload == "typists":
            typists_compared(figures, args)
        else:
            compared(figures)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.interrupt",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    # The shipped window by default: the figures are about lastword as it is installed.
    parser.add_argument("--quiet-ms", type=int, default=DebounceSettings().quiet_ms)
    parser.add_argument("--max-wait-ms", type=int, default=DebounceSettings().max_wait_ms)
    parser.add_argument("--stagger-s", type=float, default=10.0, help="spread of user starts")
    parser.add_argument("--settle-s", type=float, default=30.0, help="after the last message")
    parser.add_argument(
        "--messages",
        type=int,
        nargs=2,
        default=[3, 6],
        metavar=("FEWEST", "MOST"),
        help="messages per user; more keep a user typing across several generations",
    )
    parser.add_argument(
        "--guard",
        choices=sorted(GUARDS),
        default="time",
        help="the starvation guard: time (as shipped) or count (3 discards, the one before)",
    )
    parser.add_argument(
        "--ttft-s",
        type=float,
        nargs="+",
        help="times to first token to run the workload with, within each request's latency "
        "(at most half of it); 0: the pieces are spread over the whole latency "
        "(default 0.5, and 0 with --compare)",
    )
    parser.add_argument(
        "--workload",
        choices=("bursts", "typists"),
        default="bursts",
        help="bursts (the default) or issue 35's single-liners, fast bursts and slow typists, "
        "who send typing signals",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=ROWS,
        help="the ways of waiting to run, in this order (off: today with interrupt off; "
        "typing: both, on a platform that reports typing, --workload typists only); default "
        "today speculate learned both peers, or both typing for --workload typists",
    )
    parser.add_argument(
        "--model-s", type=float, default=0.5, help="--workload typists: the model's latency"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="interrupt on vs off (rows today and off) with the detailed figures, instead",
    )
    parser.add_argument("--details", action="store_true", help="every row's detailed figures")
    parser.add_argument("--speculate-ms", type=int, default=DebounceSettings().speculate_ms)
    parser.add_argument("--floor-ms", type=int, default=DebounceSettings().floor_ms)
    parser.add_argument(
        "--peers-quiet-ms", type=int, default=500, help="the peers' fixed window (OpenClaw's)"
    )
    args = parser.parse_args(argv)
    typists = args.workload == "typists"
    if args.rows is None:
        args.rows = (
            ["both", "typing"] if typists else ["today", "speculate", "learned", "both", "peers"]
        )
    if not typists and "typing" in args.rows:
        parser.error("the typing row needs --workload typists: only its users send typing signals")
    if typists and args.compare:
        parser.error("--compare runs the bursts workload")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
