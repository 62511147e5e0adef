"""Tools: side-effect executions per call the model asked for under an interrupt storm (with
and without a replica killed), and the time lastword itself adds around each tool step.

    python -m benchmarks.tools [--users 30] [--seed 7] [--tool-s 1.0] [--storm 4 6]
        [--gap-ms 300] [--stagger-s 8] [--no-kill] [--steps-users 80] [--steps-every-ms 300]

Everything runs as in production, over loopback: `lastword run` processes (the real Telegram
adapter in webhook mode, the real OpenAI client, the real MCP client) on an embedded server,
the fake Bot API and the fake provider each in a child process of its own
(`benchmarks/child.py`), and the test MCP server (`tests/fakes/mcp_append_server.py`) over
stdio, one per replica, as lastword starts it. The provider plays a model that uses one tool
(`ToolPolicy`), its answers 0.2-0.6 s long (seeded by the prompt).

1. The storm. `--users` users (seeded) start over `--stagger-s` seconds; each one's messages
   alternate between two replicas. A user asks once for a booking; the model calls `append`
   (a side effect, `--tool-s` long) once per burst. As soon as the tool has started (its line
   is in the side-effect file), the user sends `--storm` more messages, `--gap-ms` apart. The
   row `kill` does it again and sends replica a SIGKILL once a third of the users' calls have
   started; from then on every message goes to replica b, which takes over a's conversations
   once their leases expire. Per row:
   - requested calls: the bursts in which the model asked for the call, counted from the
     provider's requests: distinct (user, first message of the turn) over the requests it
     answered with the call (a request cut short and asked again in the same burst is the
     same call);
   - side-effect executions: lines in the file the tool appends to, one per real run; and
     duplicate keys among them (a call run twice would show one);
   - executions per requested call (1.00; at most 1.00 with a kill, the rest "unknown");
   - unknown outcomes: replies in which the model was told the call's outcome is unknown (a
     call started by the killed replica and never finished);
   - replies per user (1), and the users whose every message appears in the turn their reply
     answered (the model's answer quotes the user turn it was given).
2. Lastword's time per tool step, on a quiet run: one replica, `--steps-users` users, one
   every `--steps-every-ms`, each asking once; the model calls its tool in `--steps-per-turn`
   steps (even users `read_only_echo`, odd users `append` without delay), then answers. For
   each step: the provider's next request start, minus the end of the response that asked for
   the call (when the fake wrote its last byte), minus the tool's own run time (the MCP server
   notes its start and end). What is left is lastword's: reading the end of the stream,
   recording the step and beginning the call in Redis, the MCP round trip (both ways, the
   server's own JSON-RPC handling included), ending the call, and building and sending the
   next request. Split at the tool's start: "before" (stream end -> tool start) and "after"
   (tool end -> next request). Speculation is off in this run, so that a call with side
   effects never waits for the window to close (that wait is the user's, not lastword's).

All times are `time.monotonic()`, one clock for every process on Linux. The machine is shared:
the figures are noisy, the "max" column most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import aiohttp

from benchmarks.child import Child
from benchmarks.command_line import timed_run
from benchmarks.flood import ready, settle
from benchmarks.wakeup import percentile, print_table, temporary_server
from bot.embedded import EmbeddedRedis
from bot.settings import DebounceSettings, ToolsSettings
from tests.fakes.loopback import free_port
from tests.fakes.openai_server import FakeOpenAI, RecordedRequest, ToolCalls, ToolPolicy
from tests.fakes.telegram_server import FakeTelegram
from tests.running import Running, clean_environ

ROOT = Path(__file__).resolve().parent.parent
SECRET = "tools-webhook-secret"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Chats are 10_000 + user, as `benchmarks.flood.settle` reads them.
CHAT_BASE = 10_000
# Every message names its user and its number; the first one in a turn names the burst.
MESSAGE = re.compile(r"\bu(\d+) m(\d+):")
STEP = re.compile(r"^u(\d+) s(\d+)$")
UNKNOWN = "outcome of this call is unknown"
# Short leases and sweeps, as the process tests use: a killed replica's conversations are
# taken over within seconds, not the shipped 30 s.
LEASE_TTL_MS = 1500
SWEEP_MS = 200
POST_TIMEOUT_S = 10.0
# How long a user waits for its tool to start before giving up on its storm.
TOOL_START_S = 30.0
SETTLE_S = 40.0
WATCH_S = 0.02


# -- the provider: a model that uses one tool -----------------------------------------------


@dataclass(frozen=True)
class Model:
    """What the fake provider plays, sent to its process: `storm` (one booking per burst,
    `tool_s` long) or `steps` (`steps` calls of one tool per turn, the tool by the user)."""

    mode: str
    seed: int
    tool_s: float
    steps: int
    model_s: tuple[float, float]

    def policy(self, request: RecordedRequest) -> ToolPolicy:
        user, first = turn(request)
        if self.mode == "storm":
            booking = json.dumps({"text": f"u{user} m{first}", "delay_s": self.tool_s})
            return ToolPolicy("append", booking, answer="Done: {result}\n{user}")
        k = len(request.tool_steps(this_turn=True))
        looked_up = json.dumps({"text": f"u{user} s{k}"})
        tool = "read_only_echo" if user % 2 == 0 else "append"
        return ToolPolicy(tool, looked_up, steps=self.steps, answer="Found: {results}")

    def delay(self, request: RecordedRequest) -> float:
        steps = len(request.tool_steps(this_turn=True))
        key = f"{self.seed}:{request.last_user_text}:{steps}"
        return random.Random(key).uniform(*self.model_s)


def turn(request: RecordedRequest) -> tuple[int, int]:
    """(user, first message) of the request's user turn: the burst it answers."""
    found = MESSAGE.search(request.last_user_text)
    return (int(found[1]), int(found[2])) if found else (-1, -1)


@dataclass(frozen=True)
class Served:
    """One request as the fake provider saw it, sent back from its process."""

    user: int
    first: int
    steps: int  # tool steps already in it, this turn
    called: bool  # answered with the tool call
    started_at: float
    ended_at: float | None
    finished: bool


class TimedOpenAI(FakeOpenAI):
    """The fake provider, noting which requests it answered with a call (when each answer's
    last byte went out, it notes for every request: `RecordedRequest.ended_at`)."""

    def __init__(self, model: Model) -> None:
        super().__init__(reply=self._reply)
        self.model = model
        self.delay_for = model.delay
        self.called: set[int] = set()

    def _reply(self, request: RecordedRequest) -> str | ToolCalls:
        answer = self.model.policy(request)(request)
        if isinstance(answer, ToolCalls):
            self.called.add(id(request))
        return answer

    def served(self) -> list[Served]:
        return [
            Served(
                *turn(r),
                steps=len(r.tool_steps(this_turn=True)),
                called=id(r) in self.called,
                started_at=r.started_at,
                ended_at=r.ended_at,
                finished=r.finished,
            )
            for r in self.requests
        ]


def provider_main(model: Model, conn: Connection) -> None:
    asyncio.run(serve_provider(model, conn))


async def serve_provider(model: Model, conn: Connection) -> None:
    async with TimedOpenAI(model) as provider:
        conn.send(provider.base_url)
        with contextlib.suppress(EOFError):
            await asyncio.to_thread(conn.recv)
        served = provider.served()
    with contextlib.suppress(OSError):
        conn.send(served)


def telegram_main(conn: Connection) -> None:
    asyncio.run(serve_telegram(conn))


async def serve_telegram(conn: Connection) -> None:
    """The Bot API until the run is over; then the replies it took: (chat, text)."""
    async with FakeTelegram() as telegram:
        conn.send(telegram.api_url)
        with contextlib.suppress(EOFError):
            await asyncio.to_thread(conn.recv)
        sent = [(int(c.chat_id or 0), c.text or "") for c in telegram.sent_messages]
    with contextlib.suppress(OSError):
        conn.send(sent)


# -- the replicas -----------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    running: Running
    url: str
    alive: bool = True


@dataclass
class Setup:
    """What a run's replicas are given: the server, the fakes, the files, the settings."""

    server: EmbeddedRedis
    folder: Path
    api_url: str
    llm_url: str
    settings: dict[str, str]

    @property
    def effects(self) -> Path:
        return self.folder / "effects.txt"

    @property
    def times(self) -> Path:
        return self.folder / "times.txt"

    def env(self, name: str, port: int) -> dict[str, str]:
        booking = {
            "command": sys.executable,
            "args": ["-m", "tests.fakes.mcp_append_server"],
            "cwd": str(ROOT),
            "env": {"LW_APPEND_FILE": str(self.effects), "LW_TIMES_FILE": str(self.times)},
        }
        return (
            clean_environ()
            | {
                "LASTWORD_PLATFORM": "telegram",
                "LASTWORD_REDIS_URL": self.server.url,
                "LASTWORD_DATA_DIR": str(self.folder / name),
                "LASTWORD_LOG_LEVEL": "WARNING",
                "LASTWORD_TELEGRAM__TOKEN": FakeTelegram().token,
                "LASTWORD_TELEGRAM__API_URL": self.api_url,
                "LASTWORD_TELEGRAM__MODE": "webhook",
                "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}",
                "LASTWORD_TELEGRAM__WEBHOOK_SECRET": SECRET,
                "LASTWORD_LLM__PROVIDER": "openai",
                "LASTWORD_LLM__BASE_URL": self.llm_url,
                "LASTWORD_LLM__API_KEY": "sk-tools-bench",
                "LASTWORD_LLM__MODEL": "gpt-4o-mini",
                "LASTWORD_LEASE__TTL_MS": str(LEASE_TTL_MS),
                "LASTWORD_SWEEP_INTERVAL_MS": str(SWEEP_MS),
                "LASTWORD_TOOLS__MCP_SERVERS": json.dumps({"booking": booking}),
            }
            | self.settings
        )

    async def replica(self, name: str) -> Replica:
        port = free_port()
        running = await Running.start(self.env(name, port))
        url = f"http://127.0.0.1:{port}/telegram"
        await ready(url, 30.0)
        return Replica(name, running, url)


def errors(replicas: Sequence[Replica]) -> list[str]:
    return [
        f"{r.name}: {line.strip()}" for r in replicas for line in r.running.log if "ERROR" in line
    ]


@contextlib.asynccontextmanager
async def fakes(model: Model) -> AsyncIterator[tuple[str, str, list[object]]]:
    """The Bot API and the provider in processes of their own; yields (api_url, llm_url, a
    list that receives their reports: the replies and the provider's requests)."""
    telegram = Child("fake-telegram", telegram_main)
    provider = Child("fake-openai", provider_main, model)
    reports: list[object] = []
    try:
        api_url, llm_url = cast(str, await telegram.start()), cast(str, await provider.start())
        yield api_url, llm_url, reports
        reports += [await telegram.finish(), await provider.finish()]
    finally:
        await telegram.close()
        await provider.close()


# -- the storm ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    user: int
    at: float  # seconds from the start of the row
    storm: int  # messages after the tool started
    replica: int  # which replica takes the first message; then they alternate


def plans(args: argparse.Namespace) -> list[Plan]:
    rng = random.Random(args.seed)
    return [
        Plan(u, rng.uniform(0, args.stagger_s), rng.randint(*args.storm), rng.randrange(2))
        for u in range(args.users)
    ]


def update(user: int, n: int, text: str) -> dict[str, Any]:
    chat = CHAT_BASE + user
    person = {"id": chat, "is_bot": False, "first_name": f"U{user}"}
    return {
        "update_id": user * 100 + n + 1,
        "message": {
            "message_id": n + 1,
            "from": person,
            "chat": {"id": chat, "type": "private", "first_name": f"U{user}"},
            "date": int(time.time()),
            "text": f"u{user} m{n}: {text}",
        },
    }


class Effects:
    """Follows the side-effect file: which users' calls have started, and whether `kill_at`
    of them have."""

    def __init__(self, path: Path, kill_at: int = 0) -> None:
        self.path = path
        self.started: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.kill_at = kill_at
        self.reached = asyncio.Event()
        self.lines = 0

    async def run(self) -> None:
        while True:
            text = self.path.read_text() if self.path.exists() else ""
            lines = text.splitlines()
            self.lines = len(lines)
            for line in lines:
                self.started[effect_user(line)].set()
            if self.lines >= self.kill_at:
                self.reached.set()
            await asyncio.sleep(WATCH_S)


@dataclass
class Storm:
    """The users of one row, posting to the replicas; what each one got to send."""

    replicas: list[Replica]
    session: aiohttp.ClientSession
    effects: Effects
    gap_s: float
    sent: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)

    async def post(self, plan: Plan, n: int, text: str) -> None:
        """Message `n` to its replica, or the other one if that is dead (as Telegram would
        deliver it again elsewhere); noted as sent once a replica took it."""
        first = (plan.replica + n) % 2
        for index in (first, 1 - first):
            replica = self.replicas[index]
            if not replica.alive:
                continue
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.session.post(
                    replica.url, json=update(plan.user, n, text), headers={SECRET_HEADER: SECRET}
                ) as response:
                    if response.status == 200:
                        self.sent[plan.user].append(n)
                        return
        self.problems.append(f"u{plan.user} m{n} was taken by no replica")

    async def user(self, plan: Plan, began: float) -> None:
        await asyncio.sleep(max(0.0, began + plan.at - time.monotonic()))
        await self.post(plan, 0, f"book a table for {plan.user % 8 + 2}, please")
        try:
            await asyncio.wait_for(self.effects.started[plan.user].wait(), TOOL_START_S)
        except TimeoutError:
            self.problems.append(f"u{plan.user}: the tool never started")
            return
        for n in range(1, plan.storm + 1):
            await self.post(plan, n, f"also, detail {n}")
            await asyncio.sleep(self.gap_s)


@dataclass(frozen=True)
class StormRow:
    row: str
    users: int
    messages: int
    requested: int
    executions: int
    duplicate_keys: int
    over: int  # users with more executions than requested calls
    unknown: int
    replies: Counter[int]
    folded: int
    unsettled: int
    killed_after: int | None
    wall_s: float
    problems: list[str]

    def cells(self) -> list[str]:
        per_call = self.executions / self.requested if self.requested else math.nan
        dist = ", ".join(f"{n}: {c}" for n, c in sorted(self.replies.items()))
        replies = sum(n * c for n, c in self.replies.items()) / max(self.users, 1)
        return [
            self.row,
            f"{self.users} / {self.messages}",
            str(self.requested),
            str(self.executions),
            f"{per_call:.2f}",
            str(self.duplicate_keys),
            str(self.over),
            str(self.unknown),
            f"{replies:.2f} ({dist})",
            f"{self.folded} / {self.users}",
            str(self.unsettled),
            f"{self.wall_s:.1f}",
        ]


STORM_HEADERS = [
    "row",
    "users / msgs",
    "requested calls",
    "executions",
    "exec / requested",
    "dup keys",
    "users exec > req",
    "unknown",
    "replies / user (by count)",
    "all folded",
    "unsettled",
    "run s",
]


async def storm_row(args: argparse.Namespace, kill: bool) -> StormRow:
    model = Model("storm", args.seed, args.tool_s, 1, tuple(args.model_s))
    folder = Path(tempfile.mkdtemp(prefix="lw-tools-", dir="/tmp"))
    try:
        async with fakes(model) as (api_url, llm_url, reports), temporary_server() as server:
            setup = Setup(server, folder, api_url, llm_url, storm_settings(args))
            replicas = list(await asyncio.gather(setup.replica("a"), setup.replica("b")))
            try:
                load = await storm_load(args, setup, replicas, kill)
            finally:
                for replica in replicas:
                    await replica.running.stop()
            load.storm.problems += errors(replicas)
        replies = cast(list[tuple[int, str]], reports[0])
        served = cast(list[Served], reports[1])
        return storm_figures("kill" if kill else "storm", args.users, load, replies, served)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Load:
    """What a storm row did: the users' messages, the side effects, the kill."""

    storm: Storm
    effects: Path
    killed_after: int | None  # calls started when replica a was killed
    wall_s: float  # first message to every user answered
    unsettled: int  # users not answered to the end


async def storm_load(
    args: argparse.Namespace, setup: Setup, replicas: list[Replica], kill: bool
) -> Load:
    """Run the users, and the kill once a third of their calls have started."""
    effects = Effects(setup.effects, kill_at=max(1, args.users // 3))
    watching = asyncio.create_task(effects.run())
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    began = time.monotonic()
    killed_after: int | None = None
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            storm = Storm(replicas, session, effects, args.gap_ms / 1000)
            users = [asyncio.create_task(storm.user(p, began)) for p in plans(args)]
            if kill:
                killed_after = await kill_mid_storm(effects, replicas[0], args.stagger_s)
            await asyncio.gather(*users)
        unsettled = await settle(setup.server, set(range(args.users)), SETTLE_S)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    wall_s = time.monotonic() - began
    return Load(storm, setup.effects, killed_after, wall_s, unsettled)


async def kill_mid_storm(effects: Effects, replica: Replica, stagger_s: float) -> int | None:
    """SIGKILL `replica` once enough calls have started; how many had (None: never killed,
    too few started in time)."""
    try:
        await asyncio.wait_for(effects.reached.wait(), stagger_s + TOOL_START_S)
    except TimeoutError:
        return None
    replica.alive = False
    await replica.running.kill()
    return effects.lines


def storm_settings(args: argparse.Namespace) -> dict[str, str]:
    return {
        "LASTWORD_DEBOUNCE__QUIET_MS": str(args.quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(max(args.quiet_ms, DebounceSettings().max_wait_ms)),
    }


def storm_figures(
    row: str, users: int, load: Load, sent: list[tuple[int, str]], served: list[Served]
) -> StormRow:
    """The row's figures from the replies Telegram took, the provider's requests and the
    side-effect file."""
    storm = load.storm
    requested = {(s.user, s.first) for s in served if s.called}
    lines = load.effects.read_text().splitlines() if load.effects.exists() else []
    keys = [line.split("\t")[1] for line in lines]
    ran = Counter(effect_user(line) for line in lines)
    asked = Counter(user for user, _ in requested)
    replies: dict[int, list[str]] = defaultdict(list)
    for chat, text in sent:
        replies[chat - CHAT_BASE].append(text)
    folded = sum(
        all(any(f"u{u} m{n}:" in text for text in replies[u]) for n in storm.sent[u])
        for u in range(users)
    )
    return StormRow(
        row=row,
        users=users,
        messages=sum(len(n) for n in storm.sent.values()),
        requested=len(requested),
        executions=len(lines),
        duplicate_keys=len(keys) - len(set(keys)),
        over=sum(ran[u] > asked[u] for u in range(users)),
        unknown=sum(UNKNOWN in text for texts in replies.values() for text in texts),
        replies=Counter(len(replies[u]) for u in range(users)),
        folded=folded,
        unsettled=load.unsettled,
        killed_after=load.killed_after,
        wall_s=load.wall_s,
        problems=storm.problems,
    )


def effect_user(line: str) -> int:
    """The user whose call wrote this line of the side-effect file ("u3 m0<TAB>key")."""
    found = MESSAGE.search(line.split("\t")[0] + ":")
    return int(found[1]) if found else -1


# -- the time lastword adds per tool step -----------------------------------------------------


@dataclass(frozen=True)
class Step:
    tool: str
    lastword_us: int
    before_us: int
    after_us: int
    tool_us: int


async def steps_run(args: argparse.Namespace) -> tuple[list[Step], list[str]]:
    """The quiet run: users one every `--steps-every-ms` on one replica; every tool step's
    times, and what went wrong."""
    model = Model("steps", args.seed, 0.0, args.steps_per_turn, tuple(args.steps_model_s))
    folder = Path(tempfile.mkdtemp(prefix="lw-tools-", dir="/tmp"))
    try:
        async with fakes(model) as (api_url, llm_url, reports), temporary_server() as server:
            setup = Setup(server, folder, api_url, llm_url, steps_settings(args))
            replica = await setup.replica("a")
            try:
                problems = await steps_load(args, setup, replica)
            finally:
                await replica.running.stop()
            problems += errors([replica])
        steps, missing = steps_of(cast(list[Served], reports[1]), setup.times)
        if missing:
            problems.append(f"{missing} tool steps could not be matched and were left out")
        return steps, problems
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def steps_settings(args: argparse.Namespace) -> dict[str, str]:
    return {
        "LASTWORD_DEBOUNCE__QUIET_MS": str(args.steps_quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(args.steps_quiet_ms * 4),
        "LASTWORD_DEBOUNCE__SPECULATE_MS": "0",
        "LASTWORD_DEBOUNCE__LEARN": "false",
    }


async def steps_load(args: argparse.Namespace, setup: Setup, replica: Replica) -> list[str]:
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        users = Storm([replica, replica], session, Effects(setup.effects), gap_s=0.0)
        for user in range(args.steps_users):
            await users.post(Plan(user, at=0.0, storm=0, replica=0), 0, "look it up")
            await asyncio.sleep(args.steps_every_ms / 1000)
    unsettled = await settle(setup.server, set(range(args.steps_users)), SETTLE_S)
    return users.problems + ([f"{unsettled} users not answered"] if unsettled else [])


def steps_of(served: list[Served], times: Path) -> tuple[list[Step], int]:
    """Each tool step's times: (user, k) -> the request that asked (k steps before it), the
    tool's run, and the request after it (k + 1 steps); how many could not be matched."""
    runs: dict[tuple[int, int], tuple[str, float, float]] = {}
    for line in times.read_text().splitlines() if times.exists() else []:
        tool, text, _key, started, ended = line.split("\t")
        found = STEP.match(text)
        if found:
            runs[int(found[1]), int(found[2])] = (tool, float(started), float(ended))
    asking = {
        (s.user, s.steps): s for s in served if s.called and s.finished and s.ended_at is not None
    }
    following: dict[tuple[int, int], Served] = {}
    for s in sorted(served, key=lambda s: s.started_at):
        following.setdefault((s.user, s.steps), s)
    steps, missing = [], 0
    for (user, k), (tool, start, end) in sorted(runs.items()):
        asked, after = asking.get((user, k)), following.get((user, k + 1))
        if asked is None or asked.ended_at is None or after is None:
            missing += 1
            continue
        before_s, after_s = start - asked.ended_at, after.started_at - end
        steps.append(Step(tool, us(before_s + after_s), us(before_s), us(after_s), us(end - start)))
    return steps, missing


def us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def ms(values: list[int], p: float) -> str:
    return f"{percentile(sorted(values), p) / 1000:.1f}" if values else "-"


def steps_table(steps: list[Step]) -> None:
    rows = []
    for tool in ("read_only_echo", "append", "both"):
        mine = [s for s in steps if tool in (s.tool, "both")]
        total = [s.lastword_us for s in mine]
        before = [s.before_us for s in mine]
        after = [s.after_us for s in mine]
        rows.append(
            [
                tool,
                str(len(mine)),
                ms(total, 50),
                ms(total, 95),
                ms(total, 100),
                f"{ms(before, 50)} / {ms(before, 95)}",
                f"{ms(after, 50)} / {ms(after, 95)}",
                ms([s.tool_us for s in mine], 50),
            ]
        )
    headers = ["tool", "steps", "lastword p50 ms", "p95 ms", "max ms"]
    headers += ["before call p50 / p95", "after call p50 / p95", "tool's own p50 ms"]
    print_table(headers, rows)


# -- the report -----------------------------------------------------------------------------


def header(args: argparse.Namespace, argv: Sequence[str], load: tuple[float, ...]) -> None:
    print("command: python -m benchmarks.tools " + " ".join(argv))
    print(
        f"cpus: {os.cpu_count()}, load average (1, 5, 15 min) at the start "
        f"{' '.join(f'{x:.2f}' for x in load)}, at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())};"
        f" `lastword run` replicas (telegram webhook), the fake Bot API and provider in 2"
        f" processes, the append MCP server over stdio per replica; seed {args.seed}"
    )
    shipped = DebounceSettings()
    print(
        f"storm: {args.users} users over {args.stagger_s:g} s, 2 replicas, tool (append) "
        f"{args.tool_s:g} s, then {args.storm[0]}-{args.storm[1]} messages {args.gap_ms} ms "
        f"apart; model answers {args.model_s[0]:g}-{args.model_s[1]:g} s; debounce quiet_ms="
        f"{args.quiet_ms} max_wait_ms={max(args.quiet_ms, shipped.max_wait_ms)} speculate_ms="
        f"{shipped.speculate_ms} learn={shipped.learn} (shipped: {shipped.quiet_ms}, "
        f"{shipped.max_wait_ms}, {shipped.speculate_ms}, {shipped.learn}); lease ttl_ms="
        f"{LEASE_TTL_MS}, sweep_interval_ms={SWEEP_MS}, step_limit={ToolsSettings().step_limit}"
    )
    print(
        f"steps: {args.steps_users} users one every {args.steps_every_ms} ms, 1 replica, "
        f"{args.steps_per_turn} tool steps each (even users read_only_echo, odd users append "
        f"without delay), model answers {args.steps_model_s[0]:g}-{args.steps_model_s[1]:g} s;"
        f" quiet_ms={args.steps_quiet_ms}, speculation off"
    )


def storm_table(rows: list[StormRow]) -> None:
    print("\n== side effects under the interrupt storm")
    print_table(STORM_HEADERS, [r.cells() for r in rows])
    for r in rows:
        if r.killed_after is not None:
            print(f"  {r.row}: replica a killed (SIGKILL) once {r.killed_after} calls had started")
        for line in r.problems[:10]:
            print(f"  ! {r.row}: {line}")
    print(
        "  requested calls: distinct (user, first message of the turn) over the provider's "
        "requests it answered with the call;\n  executions: lines the tool appended; unknown:"
        " replies whose model was told the call's outcome is unknown"
    )


async def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    load = os.getloadavg()
    rows = [await storm_row(args, kill=False)]
    if not args.no_kill:
        rows.append(await storm_row(args, kill=True))
    steps, problems = await steps_run(args)
    header(args, argv, load)
    storm_table(rows)
    print("\n== lastword's own time per tool step (quiet run, 1 replica)")
    steps_table(steps)
    for line in problems[:10]:
        print(f"  ! steps: {line}")
    print(
        "  lastword = next request start - end of the response that asked - the tool's own time;"
        "\n  before: stream end -> tool start; after: tool end -> next request start"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--tool-s", type=float, default=1.0, help="the booking tool's run")
    parser.add_argument(
        "--storm", type=int, nargs=2, default=[4, 6], metavar=("FEWEST", "MOST"),
        help="messages each user sends once the tool has started",
    )  # fmt: skip
    parser.add_argument("--gap-ms", type=int, default=300, help="between storm messages")
    parser.add_argument("--stagger-s", type=float, default=8.0, help="spread of user starts")
    parser.add_argument("--quiet-ms", type=int, default=DebounceSettings().quiet_ms)
    parser.add_argument(
        "--model-s", type=float, nargs=2, default=[0.2, 0.6], metavar=("LOW", "HIGH")
    )
    parser.add_argument("--no-kill", action="store_true", help="leave out the kill -9 row")
    parser.add_argument("--steps-users", type=int, default=80)
    parser.add_argument("--steps-every-ms", type=int, default=300)
    parser.add_argument("--steps-per-turn", type=int, default=4)
    parser.add_argument("--steps-quiet-ms", type=int, default=300)
    parser.add_argument(
        "--steps-model-s", type=float, nargs=2, default=[0.05, 0.15], metavar=("LOW", "HIGH")
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    with timed_run():
        asyncio.run(run(parse_args(given), given))


if __name__ == "__main__":
    main()
