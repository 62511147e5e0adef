"""Tools: side-effect executions per call the model asked for under an interrupt storm (with
and without a replica killed), the time lastword itself adds around each tool step, whose
word a call obeys (a veto written while the call is held in the window, /retry storms, and an
admin-only server that comes up late and takes a tool's name), and everyone else's replies
while one server streams 100 MB.

    python -m benchmarks.tools [--users 30] [--seed 7] [--tool-s 1.0] [--storm 4 6]
        [--gap-ms 300] [--stagger-s 8] [--no-kill] [--steps-users 80] [--steps-every-ms 300]
        [--veto-users 12] [--veto-quiet-ms 3000] [--retry-users 10] [--retries 3]
        [--admin-users 8] [--admin-asks 3] [--flood-bytes 100000000] [--flood-users 4]
        [--flood-asks 3] [--flood-quiet-ms 300]
        [--rows storm kill steps veto retry admin flood]

`--rows` runs only the rows named (all by default; `--no-kill` leaves out `kill`), and prints
only their tables.

Everything runs as in production, over loopback: `lastword run` processes (the real Telegram
adapter in webhook mode, the real OpenAI client, the real MCP client) on an embedded server,
the fake Bot API and the fake provider each in a child process of its own
(`benchmarks/child.py`), and the test MCP server (`tests/support/fakes/mcp_append_server.py`) over
stdio, one per replica, as lastword starts it. The provider plays a model that uses one tool
(`ToolPolicy`), its answers 0.2-0.6 s long (seeded by the prompt). In every row but the steps
run, the model books: it calls `append` (a side effect, `--tool-s` long: one line in a file
per real run) once per turn, under whatever name the user is offered it, unless the user turn
says "DON'T", when it answers in text and calls nothing.

1. The storm. `--users` users (seeded) start over `--stagger-s` seconds; each one's messages
   alternate between two replicas. A user asks once for a booking; the model calls `append`
   once per burst. As soon as the tool has started (its line is in the side-effect file), the
   user sends `--storm` more messages, `--gap-ms` apart. The row `kill` does it again and
   sends replica a SIGKILL once a third of the users' calls have started; from then on every
   message goes to replica b, which takes over a's conversations once their leases expire.
   Per row:
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
3. The veto in the window (row `veto`). `--veto-users` users start over `--veto-stagger-s`
   seconds on two replicas, speculation on (the shipped speculate_ms, a `--veto-quiet-ms`
   window that does not learn, so that it stays open long enough). A user asks once for a
   booking; once they have been quiet for speculate_ms a generation starts while the window is
   still open, the model calls `append`, and the call is held: it has side effects and the
   user may still write. The benchmark sees the hold in Redis (the turn's record holds the
   step and no start of its call, and the window's deadline is more than `VETO_MARGIN_MS`
   ahead on the server's clock) and the user at once writes "wait, DON'T book it", inside the
   window. The newest word governs: the held call never runs, the next generation tells the
   model it was not run (`bot.core.steps.NOT_RUN`), and the model, reading the veto, answers
   without calling. Per row: requested calls; vetoed (the veto sent while the call was held);
   told "not run" (users whose model read `NOT_RUN` for the held call); side-effect runs of
   vetoed calls (their lines in the file) and per vetoed call (0.00); replies per user (1);
   users whose both messages the reply answered.
4. /retry storms (row `retry`). `--retry-users` users start over `--retry-stagger-s` seconds,
   their messages alternating between two replicas, the shipped window. Each asks once (odd
   users begin that burst with /reset, which makes the /reset's version the turn's id), the
   model calls `append` once, and once the reply is in (V == W in Redis) the user sends
   /retry, `--retries` times, each once the previous reply is in. Every retry asks the model
   again with the turn's recorded calls and results, on whichever replica takes it. Per row:
   requested calls, side-effect runs and runs per requested call (1.00), duplicate keys,
   replies per user (1 + retries).
5. A late admin-only server (row `late admin`). One replica, two MCP servers over stdio, both
   the test server, writing to two files: "admin" first, `"adminOnly": true`, started as
   `sh -c '[ -f FLAG ] && exec python -m tests.support.fakes.mcp_append_server'`, so that every
   start fails until FLAG exists; "public" second. While admin is down, public's tools keep their
   names; once it is up, admin's `append` takes the name (the first server configured keeps a
   shared name) and public's is offered as `public_append`. `--admin-users` users, none of
   them an admin (`LASTWORD_ACCESS__ADMINS` names someone else), start over
   `--admin-stagger-s` seconds and ask for bookings, each turn once the previous one is
   answered: at least `--admin-asks` turns, and on until a turn has begun after admin came up.
   Once a third as many calls as there are users have run, the benchmark creates FLAG: admin
   comes up at its next restart (its backoff: 1 s doubling) while turns are in flight; the
   benchmark sees the moment in the replica's log (the rename's WARNING). Per row: the calls
   requested; of them, those asked as `append` (offered before admin came up) and as
   `public_append`; in flight (asked as `append`, run after admin came up: a call looked up by
   its name when it runs would then find admin's tool); side-effect runs on the admin server
   (0: no call of a non-admin ever runs there) and on the public one, per requested call;
   replies per user.
6. A server streams 100 MB (rows `no flood` and `a server streams 100 MB`, `--rows flood`).
   One replica, the test server over stdio (as "big"), `LASTWORD_METRICS_LISTEN` on, a fixed
   window (`--flood-quiet-ms`, no speculation, no learning), the model answering in text but
   for user A (user 0), for whom it calls `flood` with n = `--flood-bytes` once: the server
   writes that many bytes as one message, the replica's bounded transport
   (`bot/tools/stdio.py`) stops it once the message is over
   `LASTWORD_TOOLS__MAX_MESSAGE_BYTES` (the shipped 4 MiB), the call is an error result, and
   the server starts again after its backoff. `--flood-users` other users (users 1..) start
   over the window and the model's longest answer (seeded), and each sends `--flood-asks`
   messages, each once the previous one is answered (V == W, polled every `WATCH_S`). After
   a warm-up (each of them once, not counted), this runs twice on the same replica, the same
   messages both times (the model takes as long over each: its delay is seeded without the
   message's number): "no flood", then with A asking at the start. Per row: the other users'
   messages and replies, and each one's time from its post to its reply reaching the fake Bot
   API (median, max); the replica's event-loop lag over the phase, from its own /metrics: the
   bound of the highest bucket of `lastword_event_loop_lag_seconds` reached (the histogram
   read before and after the phase), and the most `lastword_event_loop_lag_recent_seconds`
   (its decaying worst, a stall read at 90 % of it at least) was read at, every
   `LAG_SAMPLE_S`; and how long the replica waited for a core over the phase (the kernel's
   run-queue wait: a lag the busy machine caused, not the replica's stall). In the flood row:
   the messages in flight when the replica logged the message over the limit (posted before,
   answered after); A's reply (it says the answer was too long: the error reached the model)
   and when, from A's message; the server's stops (the replica's "is not running" lines) and
   starts (its own file), once it has started again.

All times are `time.monotonic()`, one clock for every process on Linux. The machine is shared:
the figures are noisy, the "max" column most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import aiohttp

from benchmarks.child import Child
from benchmarks.command_line import timed_run
from benchmarks.flood import LAG_RECENT, LagWatch, ready, scrape, settle
from benchmarks.wakeup import percentile, print_table, temporary_server
from bot.config.settings import DebounceSettings, InstalledSettings, ToolsSettings
from bot.core.steps import NOT_RUN
from bot.service.app import make_store
from bot.store import Store
from bot.store.connect import Client, make_client
from bot.store.embedded import EmbeddedRedis
from bot.store.replies import as_text
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest, ToolCalls, ToolPolicy
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.mcp import append_command
from tests.support.running import Running, clean_environ

ROOT = Path(__file__).resolve().parent.parent
SECRET = "tools-webhook-secret"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Chats are 10_000 + user, as `benchmarks.flood.settle` reads them.
CHAT_BASE = 10_000
# Every message names its user and its number; the first one in a turn names the burst.
MESSAGE = re.compile(r"\bu(\d+) m(\d+):")
STEP = re.compile(r"^u(\d+) s(\d+)$")
UNKNOWN = "outcome of this call is unknown"
# The word that makes the model book nothing.
VETO = "DON'T"
# What the public server's `append` is offered as once the admin server has taken the name,
# and what the replica logs as it renames it: the moment admin's tools are offered.
PUBLIC_APPEND = "public_append"
ADMIN_UP = f"is offered as {PUBLIC_APPEND}"
# The admin row's one admin, as production names some: none of the row's users, so that every
# one of them is refused the admin-only server's tools.
ADMIN_ID = "1"
# Short leases and sweeps, as the process tests use: a killed replica's conversations are
# taken over within seconds, not the shipped 30 s.
LEASE_TTL_MS = 1500
SWEEP_MS = 200
POST_TIMEOUT_S = 10.0
# How long a user waits for its tool to start before giving up on its storm.
TOOL_START_S = 30.0
SETTLE_S = 40.0
WATCH_S = 0.02
# How long a user of the veto row waits for its call to be held; and how much of the window
# must be left when it is seen held, since seeing it and writing are two steps, and a window
# that closed between them would let the call start before the veto.
HOLD_S = 15.0
VETO_MARGIN_MS = 500
# The id of a user's first turn (the first version of its burst): the veto row's only one.
FIRST_TURN = 1
# How long the admin server may take to come up once FLAG exists: its restarts back off 1, 2,
# 4, 8, 16 s, so the next one may be that far.
ADMIN_UP_S = 40.0
# The flood row: its server's name, the user whose tool floods (A), and what the replica logs
# when a server's message is over the limit, and when a server has stopped; what A's reply
# says when the error reached the model.
FLOOD_SERVER = "big"
FLOODER = 0
OVERLONG = "wrote a message over"
NOT_RUNNING = f"MCP server {FLOOD_SERVER} ({sys.executable}) is not running"
TOO_LONG_SAID = f"TooLong: the answer of the MCP server {FLOOD_SERVER} was over"
# How long the log may take to show the stop once the phase is over; how long the server may
# take to start again (its backoff, 1 s, then its start).
LOG_S = 2.0
RESTART_S = 20.0
# How often the replica's recent loop lag is read during the flood row's phases.
LAG_SAMPLE_S = 0.02


# -- the provider: a model that uses one tool -----------------------------------------------


Reply = Callable[[RecordedRequest], str | ToolCalls]


@dataclass(frozen=True)
class Model:
    """What the fake provider plays, sent to its process: `storm` (one booking per burst,
    `tool_s` long, on whichever `append` the user is offered; none once the user turn says
    DON'T), `steps` (`steps` calls of one tool per turn, the tool by the user) or `flood`
    (user `FLOODER` has `flood` answer `flood_bytes` bytes; everyone else is answered in
    text)."""

    mode: str
    seed: int
    tool_s: float
    steps: int
    model_s: tuple[float, float]
    flood_bytes: int = 0

    def policy(self, request: RecordedRequest) -> Reply:
        user, first = turn(request)
        if self.mode == "flood":
            if user != FLOODER:
                return noted
            flood = json.dumps({"n": self.flood_bytes})
            return ToolPolicy("flood", flood, answer="Flood: {result}\n{user}")
        if self.mode == "storm":
            if VETO in request.last_user_text:
                return refused
            booking = json.dumps({"text": f"u{user} m{first}", "delay_s": self.tool_s})
            return ToolPolicy(booking_tool(request), booking, answer="Done: {result}\n{user}")
        k = len(request.tool_steps(this_turn=True))
        looked_up = json.dumps({"text": f"u{user} s{k}"})
        tool = "read_only_echo" if user % 2 == 0 else "append"
        return ToolPolicy(tool, looked_up, steps=self.steps, answer="Found: {results}")

    def delay(self, request: RecordedRequest) -> float:
        steps = len(request.tool_steps(this_turn=True))
        text = request.last_user_text
        if self.mode == "flood":
            # Without the message's number: a question takes as long in either phase.
            text = MESSAGE.sub(lambda found: f"u{found[1]}:", text)
        key = f"{self.seed}:{text}:{steps}"
        return random.Random(key).uniform(*self.model_s)


def turn(request: RecordedRequest) -> tuple[int, int]:
    """(user, first message) of the request's user turn: the burst it answers."""
    found = MESSAGE.search(request.last_user_text)
    return (int(found[1]), int(found[2])) if found else (-1, -1)


def booking_tool(request: RecordedRequest) -> str:
    """The name the request offers `append` under: its own, or its server's prefix on it once
    another server took the name (`public_append`)."""
    names = request.tool_names
    return next((n for n in names if n == "append" or n.endswith("_append")), "append")


def refused(request: RecordedRequest) -> str:
    """The model's answer once the user said DON'T: nothing booked, the user turn quoted."""
    return f"Not booked, as you said.\n{request.last_user_text}"


def noted(request: RecordedRequest) -> str:
    """The model's answer in text, no tool called, the user turn quoted."""
    return f"Noted.\n{request.last_user_text}"


@dataclass(frozen=True)
class Served:
    """One request as the fake provider saw it, sent back from its process."""

    user: int
    first: int
    steps: int  # tool steps already in it, this turn
    tool: str  # the tool it was answered with a call of, as named in it ('': none)
    results: tuple[str, ...]  # the tool results in it, this turn
    started_at: float
    ended_at: float | None
    finished: bool

    @property
    def called(self) -> bool:
        return bool(self.tool)


class TimedOpenAI(FakeOpenAI):
    """The fake provider, noting which requests it answered with a call, and of which tool
    (when each answer's last byte went out, it notes for every request:
    `RecordedRequest.ended_at`)."""

    def __init__(self, model: Model) -> None:
        super().__init__(reply=self._reply)
        self.model = model
        self.delay_for = model.delay
        self.called: dict[int, str] = {}

    def _reply(self, request: RecordedRequest) -> str | ToolCalls:
        answer = self.model.policy(request)(request)
        if isinstance(answer, ToolCalls):
            self.called[id(request)] = answer.calls[0][0]
        return answer

    def served(self) -> list[Served]:
        return [
            Served(
                *turn(r),
                steps=len(r.tool_steps(this_turn=True)),
                tool=self.called.get(id(r), ""),
                results=tuple(result.text for result in r.tool_results(this_turn=True)),
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
    """The Bot API until the run is over; then the replies it took: (chat, text, when)."""
    async with FakeTelegram() as telegram:
        conn.send(telegram.api_url)
        with contextlib.suppress(EOFError):
            await asyncio.to_thread(conn.recv)
        sent = [(int(c.chat_id or 0), c.text or "", c.at) for c in telegram.sent_messages]
    with contextlib.suppress(OSError):
        conn.send(sent)


# -- the replicas -----------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    running: Running
    url: str
    alive: bool = True


def append_server(effects: Path, times: Path | None = None, **config: Any) -> dict[str, Any]:
    """The test MCP server over stdio, in the `mcpServers` shape: appending a line to `effects`
    per run of `append`, noting its runs' times in `times` if given; `config` adds keys or
    overrides them (the command that starts it, `adminOnly`)."""
    env = {"LW_APPEND_FILE": str(effects)}
    if times is not None:
        env["LW_TIMES_FILE"] = str(times)
    # Forked from the suite's zygote, as the replicas are (`tests.support.mcp`).
    server = {**append_command(env), "cwd": str(ROOT), "env": env}
    return server | config


@dataclass
class Setup:
    """What a run's replicas are given: the server, the fakes, the files, the settings, and
    the MCP servers (none given: one "booking" server writing `effects` and `times`)."""

    server: EmbeddedRedis
    folder: Path
    api_url: str
    llm_url: str
    settings: dict[str, str]
    mcp: dict[str, Any] = field(default_factory=dict)

    @property
    def effects(self) -> Path:
        return self.folder / "effects.txt"

    @property
    def times(self) -> Path:
        return self.folder / "times.txt"

    def env(self, name: str, port: int) -> dict[str, str]:
        servers = self.mcp or {"booking": append_server(self.effects, self.times)}
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
                "LASTWORD_TOOLS__MCP_SERVERS": json.dumps(servers),
            }
            | self.settings
        )

    async def replica(self, name: str) -> Replica:
        port = free_port()
        running = await Running.start(self.env(name, port))
        url = f"http://127.0.0.1:{port}/telegram"
        try:
            await ready(url, 30.0)
        except BaseException:
            await running.stop()
            raise
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


T = TypeVar("T")


@dataclass(frozen=True)
class Ran(Generic[T]):
    """One row's run: what its load said, what the replicas were given, the replies Telegram
    took (chat, text, when it took them), the provider's requests, and the replicas' ERROR
    lines."""

    load: T
    setup: Setup
    delivered: list[tuple[int, str, float]]
    served: list[Served]
    errors: list[str]

    @property
    def replies(self) -> list[tuple[int, str]]:
        """The replies Telegram took: (chat, text)."""
        return [(chat, text) for chat, text, _ in self.delivered]


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A folder for one row's files (data directories, side-effect files), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="lw-tools-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def run_row(
    model: Model,
    folder: Path,
    settings: dict[str, str],
    names: Sequence[str],
    load: Callable[[Setup, list[Replica]], Awaitable[T]],
    mcp: dict[str, Any] | None = None,
) -> Ran[T]:
    """The fakes, a fresh server and the replicas `names`; `load` run on them, then all
    stopped, and what each said."""
    async with fakes(model) as (api_url, llm_url, reports), temporary_server() as server:
        setup = Setup(server, folder, api_url, llm_url, settings, mcp or {})
        started = await asyncio.gather(*(setup.replica(n) for n in names), return_exceptions=True)
        replicas = [r for r in started if isinstance(r, Replica)]
        try:
            for failed in started:
                if isinstance(failed, BaseException):
                    raise failed
            done = await load(setup, replicas)
        finally:
            for replica in replicas:
                await replica.running.stop()
        problems = errors(replicas)
    delivered = cast(list[tuple[int, str, float]], reports[0])
    return Ran(done, setup, delivered, cast(list[Served], reports[1]), problems)


# -- the users ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    user: int
    at: float  # seconds from the start of the row
    storm: int  # messages after the tool started
    replica: int  # which replica takes the first message; then they alternate


def plans(seed: int, users: int, stagger_s: float, storm: Sequence[int] = (0, 0)) -> list[Plan]:
    rng = random.Random(seed)
    return [
        Plan(u, rng.uniform(0, stagger_s), rng.randint(storm[0], storm[1]), rng.randrange(2))
        for u in range(users)
    ]


def update(user: int, n: int, text: str, *, raw: bool = False) -> dict[str, Any]:
    """Telegram's update for message `n` of `user`: "u<user> m<n>: <text>", or `text` as it
    is if `raw` (a command)."""
    chat = CHAT_BASE + user
    person = {"id": chat, "is_bot": False, "first_name": f"U{user}"}
    return {
        "update_id": user * 100 + n + 1,
        "message": {
            "message_id": n + 1,
            "from": person,
            "chat": {"id": chat, "type": "private", "first_name": f"U{user}"},
            "date": int(time.time()),
            "text": text if raw else f"u{user} m{n}: {text}",
        },
    }


def booking(plan: Plan) -> str:
    return f"book a table for {plan.user % 8 + 2}, please"


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


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
            lines = lines_of(self.path)
            self.lines = len(lines)
            for line in lines:
                self.started[effect_user(line)].set()
            if self.lines >= self.kill_at:
                self.reached.set()
            await asyncio.sleep(WATCH_S)


@contextlib.asynccontextmanager
async def followed(effects: Effects) -> AsyncIterator[Effects]:
    """`effects` followed while the block runs."""
    watching = asyncio.create_task(effects.run())
    try:
        yield effects
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching


async def arrive(plan: Plan, began: float) -> None:
    """Wait for the user's start: `plan.at` seconds after the row `began`."""
    await asyncio.sleep(max(0.0, began + plan.at - time.monotonic()))


@dataclass
class Storm:
    """The users of one row, posting to the replicas; what each one got to send."""

    replicas: list[Replica]
    session: aiohttp.ClientSession
    effects: Effects
    gap_s: float
    sent: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)

    async def post(self, plan: Plan, n: int, text: str, *, raw: bool = False) -> None:
        """Message `n` to its replica, or the other one if that is dead (as Telegram would
        deliver it again elsewhere); noted as sent once a replica took it."""
        first = (plan.replica + n) % 2
        for index in (first, 1 - first):
            replica = self.replicas[index]
            if not replica.alive:
                continue
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.session.post(
                    replica.url,
                    json=update(plan.user, n, text, raw=raw),
                    headers={SECRET_HEADER: SECRET},
                ) as response:
                    if response.status == 200:
                        self.sent[plan.user].append(n)
                        return
        self.problems.append(f"u{plan.user} m{n} was taken by no replica")

    async def answered(self, server: EmbeddedRedis, plan: Plan) -> bool:
        """Wait until the user's messages so far are answered (V == W); False, noted as a
        problem, if they are not within `SETTLE_S`."""
        if await settle(server, {plan.user}, SETTLE_S):
            self.problems.append(f"u{plan.user}: not answered within {SETTLE_S:g} s")
            return False
        return True

    async def user(self, plan: Plan, began: float) -> None:
        await arrive(plan, began)
        await self.post(plan, 0, booking(plan))
        try:
            await asyncio.wait_for(self.effects.started[plan.user].wait(), TOOL_START_S)
        except TimeoutError:
            self.problems.append(f"u{plan.user}: the tool never started")
            return
        for n in range(1, plan.storm + 1):
            await self.post(plan, n, f"also, detail {n}")
            await asyncio.sleep(self.gap_s)

    async def vetoing(self, plan: Plan, began: float, store: Store, vetoed: set[int]) -> None:
        """Ask for a booking; once its call is held in the window, say DON'T."""
        await arrive(plan, began)
        await self.post(plan, 0, booking(plan))
        if not await held(store, plan.user):
            self.problems.append(f"u{plan.user}: the call was never seen held in the window")
            return
        await self.post(plan, 1, f"wait, {VETO} book it")
        if 1 in self.sent[plan.user]:
            vetoed.add(plan.user)

    async def retrying(self, plan: Plan, began: float, server: EmbeddedRedis, retries: int) -> None:
        """Ask for a booking (odd users after a /reset, in the same burst), then /retry
        `retries` times, each once the previous reply is in."""
        await arrive(plan, began)
        n = 0
        if plan.user % 2:
            await self.post(plan, n, "/reset", raw=True)
            n += 1
        await self.post(plan, n, booking(plan))
        for _ in range(retries):
            if not await self.answered(server, plan):
                return
            n += 1
            await self.post(plan, n, "/retry", raw=True)

    async def questions(
        self,
        plan: Plan,
        began: float,
        store: Store,
        asks: Sequence[tuple[int, str]],
        sent_at: dict[tuple[int, int], float],
    ) -> None:
        """At the user's start, message n with its text, for each of `asks`, each once the
        previous one is answered; when each was posted goes in `sent_at`."""
        await arrive(plan, began)
        for n, text in asks:
            sent_at[plan.user, n] = time.monotonic()
            await self.post(plan, n, text)
            if not await self.replied(store, plan.user):
                return

    async def replied(self, store: Store, user: int) -> bool:
        """Wait until the user's messages so far are answered (V == W), polled every
        `WATCH_S`; False, noted as a problem, if they are not within `SETTLE_S`."""
        conversation = f"telegram:{CHAT_BASE + user}"
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            v, w = await store.counters(conversation)
            if v == w:
                return True
            await asyncio.sleep(WATCH_S)
        self.problems.append(f"u{user}: not answered within {SETTLE_S:g} s")
        return False

    async def asking(
        self, plan: Plan, began: float, server: EmbeddedRedis, asks: int, admin: LateAdmin
    ) -> None:
        """Ask for bookings, one turn after the other: at least `asks`, and on until one
        began after the admin server came up (or it was given up on)."""
        await arrive(plan, began)
        n, after = 0, False
        while n < asks or not (after or admin.given_up()):
            after = after or admin.up.is_set()
            await self.post(plan, n, booking(plan))
            if not await self.answered(server, plan):
                return
            n += 1


async def until(ready: Callable[[], bool], within_s: float) -> float | None:
    """When `ready()` first held, polled every `WATCH_S`; None if not within `within_s`."""
    deadline = time.monotonic() + within_s
    while not ready():
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(WATCH_S)
    return time.monotonic()


async def server_ms(redis: Client) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def held(store: Store, user: int) -> bool:
    """Wait until the user's call is held: the first step of their first turn recorded, its
    call not started, and the window open for more than `VETO_MARGIN_MS` on the server's
    clock. False if the call started, or was not held with that much window left, or nothing
    came within `HOLD_S`."""
    conversation = f"telegram:{CHAT_BASE + user}"
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        record = await store.tool_record(conversation, FIRST_TURN)
        if (0, 0) in record.calls:
            return False
        if record.steps:
            window = store.layout.keys(conversation).window
            closes = int(as_text(await store.redis.hget(window, "deadline")) or 0)
            return closes - await server_ms(store.redis) > VETO_MARGIN_MS
        await asyncio.sleep(WATCH_S)
    return False


@contextlib.asynccontextmanager
async def store_of(server: EmbeddedRedis) -> AsyncIterator[Store]:
    """The store on a row's server, for the benchmark's own reads."""
    settings = InstalledSettings(platform="console", redis_url=server.url, data_dir=server.data_dir)
    redis = make_client(server.url)
    try:
        yield make_store(settings, redis)
    finally:
        await redis.aclose()


# -- the storm ------------------------------------------------------------------------------


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
        return [
            self.row,
            f"{self.users} / {self.messages}",
            str(self.requested),
            str(self.executions),
            ratio(self.executions, self.requested),
            str(self.duplicate_keys),
            str(self.over),
            str(self.unknown),
            replies_cell(self.replies, self.users),
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


def ratio(part: int, whole: int) -> str:
    return f"{part / whole:.2f}" if whole else "-"


def replies_cell(replies: Counter[int], users: int) -> str:
    """Replies per user on average, and how many users got how many: "1.00 (1: 30)"."""
    dist = ", ".join(f"{n}: {c}" for n, c in sorted(replies.items()))
    mean = sum(n * c for n, c in replies.items()) / max(users, 1)
    return f"{mean:.2f} ({dist})"


def replies_by_user(sent: list[tuple[int, str]]) -> dict[int, list[str]]:
    replies: dict[int, list[str]] = defaultdict(list)
    for chat, text in sent:
        replies[chat - CHAT_BASE].append(text)
    return replies


def folded(users: int, sent: dict[int, list[int]], replies: dict[int, list[str]]) -> int:
    """The users whose every message appears in a reply they got (the model's answer quotes
    the user turn it was given)."""
    return sum(
        all(any(f"u{u} m{n}:" in text for text in replies[u]) for n in sent[u])
        for u in range(users)
    )


def requested_calls(served: list[Served]) -> dict[tuple[int, int], str]:
    """The calls the model asked for: (user, first message of the turn) -> the tool's name
    (a request cut short and asked again in the same burst is the same call)."""
    return {(s.user, s.first): s.tool for s in served if s.called}


async def storm_row(args: argparse.Namespace, kill: bool) -> StormRow:
    model = Model("storm", args.seed, args.tool_s, 1, tuple(args.model_s))
    with scratch() as folder:
        ran = await run_row(
            model,
            folder,
            storm_settings(args),
            ("a", "b"),
            lambda setup, replicas: storm_load(args, setup, replicas, kill),
        )
        ran.load.storm.problems.extend(ran.errors)
        return storm_figures("kill" if kill else "storm", args.users, ran.load, ran)


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
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    began = time.monotonic()
    killed_after: int | None = None
    async with followed(Effects(setup.effects, kill_at=max(1, args.users // 3))) as effects:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            storm = Storm(replicas, session, effects, args.gap_ms / 1000)
            row = plans(args.seed, args.users, args.stagger_s, args.storm)
            users = [asyncio.create_task(storm.user(p, began)) for p in row]
            if kill:
                killed_after = await kill_mid_storm(effects, replicas[0], args.stagger_s)
            await asyncio.gather(*users)
        unsettled = await settle(setup.server, set(range(args.users)), SETTLE_S)
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


def storm_figures(row: str, users: int, load: Load, ran: Ran[Load]) -> StormRow:
    """The row's figures from the replies Telegram took, the provider's requests and the
    side-effect file."""
    storm = load.storm
    requested = requested_calls(ran.served)
    lines = lines_of(load.effects)
    keys = [line.split("\t")[1] for line in lines]
    ran_for = Counter(effect_user(line) for line in lines)
    asked = Counter(user for user, _ in requested)
    replies = replies_by_user(ran.replies)
    return StormRow(
        row=row,
        users=users,
        messages=sum(len(n) for n in storm.sent.values()),
        requested=len(requested),
        executions=len(lines),
        duplicate_keys=len(keys) - len(set(keys)),
        over=sum(ran_for[u] > asked[u] for u in range(users)),
        unknown=sum(UNKNOWN in text for texts in replies.values() for text in texts),
        replies=Counter(len(replies[u]) for u in range(users)),
        folded=folded(users, storm.sent, replies),
        unsettled=load.unsettled,
        killed_after=load.killed_after,
        wall_s=load.wall_s,
        problems=storm.problems,
    )


def effect_turn(text: str) -> tuple[int, int]:
    """(user, first message of the turn) of a call's text ("u3 m0")."""
    found = MESSAGE.search(text + ":")
    return (int(found[1]), int(found[2])) if found else (-1, -1)


def effect_user(line: str) -> int:
    """The user whose call wrote this line of the side-effect file ("u3 m0<TAB>key")."""
    return effect_turn(line.split("\t")[0])[0]


# -- the newest word, /retry, a late admin-only server ----------------------------------------


@dataclass(frozen=True)
class Users:
    """What the users of a row did: their messages, the ones they vetoed, how long until all
    were answered, and how many were not."""

    storm: Storm
    began: float
    wall_s: float
    unsettled: int
    vetoed: set[int] = field(default_factory=set)


async def users_load(
    setup: Setup,
    replicas: list[Replica],
    row: list[Plan],
    user: Callable[[Storm, Plan, float], Awaitable[None]],
    vetoed: set[int] | None = None,
) -> Users:
    """Run `user(storm, plan, began)` for every plan of `row`, on the replicas (one given: it
    takes every message), then wait for every user to be answered."""
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    began = time.monotonic()
    pair = replicas if len(replicas) == 2 else [replicas[0], replicas[0]]
    async with aiohttp.ClientSession(timeout=timeout) as session:
        storm = Storm(pair, session, Effects(setup.effects), gap_s=0.0)
        await asyncio.gather(*(user(storm, plan, began) for plan in row))
    unsettled = await settle(setup.server, {plan.user for plan in row}, SETTLE_S)
    return Users(storm, began, time.monotonic() - began, unsettled, vetoed or set())


def veto_settings(args: argparse.Namespace) -> dict[str, str]:
    """Speculation on, as shipped, in a window that stays `--veto-quiet-ms` long: a learned
    one would shrink to its floor for users who never wrote before, and close before the
    model asks for the call."""
    return {
        "LASTWORD_DEBOUNCE__QUIET_MS": str(args.veto_quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(
            max(args.veto_quiet_ms * 2, DebounceSettings().max_wait_ms)
        ),
        "LASTWORD_DEBOUNCE__SPECULATE_MS": str(DebounceSettings().speculate_ms),
        "LASTWORD_DEBOUNCE__LEARN": "false",
    }


@dataclass(frozen=True)
class VetoRow:
    users: int
    messages: int
    requested: int
    vetoed: int
    told: int  # users whose model read that the held call was not run
    runs: int  # side-effect runs of vetoed calls
    replies: Counter[int]
    folded: int
    unsettled: int
    wall_s: float
    problems: list[str]

    def cells(self) -> list[str]:
        return [
            "veto",
            f"{self.users} / {self.messages}",
            str(self.requested),
            str(self.vetoed),
            str(self.told),
            str(self.runs),
            ratio(self.runs, self.vetoed),
            replies_cell(self.replies, self.users),
            f"{self.folded} / {self.users}",
            str(self.unsettled),
            f"{self.wall_s:.1f}",
        ]


VETO_HEADERS = [
    "row",
    "users / msgs",
    "requested calls",
    "vetoed while held",
    "told not run",
    "runs of vetoed",
    "runs / vetoed call",
    "replies / user (by count)",
    "both answered",
    "unsettled",
    "run s",
]


async def veto_row(args: argparse.Namespace) -> VetoRow:
    model = Model("storm", args.seed, args.tool_s, 1, tuple(args.model_s))
    with scratch() as folder:
        ran = await run_row(
            model, folder, veto_settings(args), ("a", "b"), lambda s, r: veto_load(args, s, r)
        )
        users, load = args.veto_users, ran.load
        requested = requested_calls(ran.served)
        told = {s.user for s in ran.served if s.user in load.vetoed and NOT_RUN in s.results}
        runs = [line for line in lines_of(ran.setup.effects) if effect_user(line) in load.vetoed]
        replies = replies_by_user(ran.replies)
        return VetoRow(
            users=users,
            messages=sum(len(n) for n in load.storm.sent.values()),
            requested=len(requested),
            vetoed=len(load.vetoed),
            told=len(told),
            runs=len(runs),
            replies=Counter(len(replies[u]) for u in range(users)),
            folded=folded(users, load.storm.sent, replies),
            unsettled=load.unsettled,
            wall_s=load.wall_s,
            problems=load.storm.problems + ran.errors,
        )


async def veto_load(args: argparse.Namespace, setup: Setup, replicas: list[Replica]) -> Users:
    vetoed: set[int] = set()
    async with store_of(setup.server) as store:
        return await users_load(
            setup,
            replicas,
            plans(args.seed, args.veto_users, args.veto_stagger_s),
            lambda storm, plan, began: storm.vetoing(plan, began, store, vetoed),
            vetoed,
        )


@dataclass(frozen=True)
class RetryRow:
    users: int
    messages: int
    retries: int
    requested: int
    runs: int
    duplicate_keys: int
    replies: Counter[int]
    unsettled: int
    wall_s: float
    problems: list[str]

    def cells(self) -> list[str]:
        return [
            "retry",
            f"{self.users} / {self.messages}",
            str(self.retries),
            str(self.requested),
            str(self.runs),
            ratio(self.runs, self.requested),
            str(self.duplicate_keys),
            replies_cell(self.replies, self.users),
            str(self.unsettled),
            f"{self.wall_s:.1f}",
        ]


RETRY_HEADERS = [
    "row",
    "users / msgs",
    "/retry per user",
    "requested calls",
    "side-effect runs",
    "runs / requested",
    "dup keys",
    "replies / user (by count)",
    "unsettled",
    "run s",
]


async def retry_row(args: argparse.Namespace) -> RetryRow:
    model = Model("storm", args.seed, args.tool_s, 1, tuple(args.model_s))
    with scratch() as folder:
        ran = await run_row(
            model, folder, storm_settings(args), ("a", "b"), lambda s, r: retry_load(args, s, r)
        )
        users, load = args.retry_users, ran.load
        lines = lines_of(ran.setup.effects)
        keys = [line.split("\t")[1] for line in lines]
        replies = replies_by_user(ran.replies)
        return RetryRow(
            users=users,
            messages=sum(len(n) for n in load.storm.sent.values()),
            retries=args.retries,
            requested=len(requested_calls(ran.served)),
            runs=len(lines),
            duplicate_keys=len(keys) - len(set(keys)),
            replies=Counter(len(replies[u]) for u in range(users)),
            unsettled=load.unsettled,
            wall_s=load.wall_s,
            problems=load.storm.problems + ran.errors,
        )


async def retry_load(args: argparse.Namespace, setup: Setup, replicas: list[Replica]) -> Users:
    return await users_load(
        setup,
        replicas,
        plans(args.seed, args.retry_users, args.retry_stagger_s),
        lambda storm, plan, began: storm.retrying(plan, began, setup.server, args.retries),
    )


@dataclass
class LateAdmin:
    """The admin server's FLAG, created once `effects` reached its mark (or `wait_s` passed),
    and the moment the replica offers admin's tools, from its log."""

    flag: Path
    replica: Replica
    effects: Effects
    wait_s: float
    up: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    flag_at: float | None = None
    up_at: float | None = None

    def given_up(self) -> bool:
        return self.done.is_set() and not self.up.is_set()

    async def run(self) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.effects.reached.wait(), self.wait_s)
            self.flag.touch()
            self.flag_at = time.monotonic()
            self.up_at = await until(lambda: self.replica.running.said(ADMIN_UP) > 0, ADMIN_UP_S)
            if self.up_at is not None:
                self.up.set()
        finally:
            self.done.set()


def admin_servers(folder: Path) -> dict[str, Any]:
    """ "admin" (admin-only, down until FLAG exists) first, so that it takes the shared names
    once it is up; "public" second, noting its runs' times."""
    flag, python = shlex.quote(str(folder / "FLAG")), shlex.quote(sys.executable)
    script = f"[ -f {flag} ] && exec {python} -m tests.support.fakes.mcp_append_server"
    admin = append_server(folder / "admin.txt", command="sh", args=["-c", script], adminOnly=True)
    return {"admin": admin, "public": append_server(folder / "effects.txt", folder / "times.txt")}


@dataclass(frozen=True)
class AdminLoad:
    users: Users
    admin: LateAdmin


@dataclass(frozen=True)
class AdminRow:
    users: int
    messages: int
    requested: int
    as_append: int  # asked as `append`: offered before the admin server was up
    as_public: int  # asked as `public_append`: offered once it was up
    in_flight: int  # asked as `append`, run once the admin server was up
    admin_runs: int
    public_runs: int
    replies: Counter[int]
    flag_s: float | None
    up_s: float | None
    unsettled: int
    wall_s: float
    problems: list[str]

    def cells(self) -> list[str]:
        def at(seconds: float | None) -> str:
            return "-" if seconds is None else f"{seconds:.1f}"

        return [
            "late admin",
            f"{self.users} / {self.messages}",
            str(self.requested),
            f"{self.as_append} / {self.as_public}",
            str(self.in_flight),
            str(self.admin_runs),
            str(self.public_runs),
            ratio(self.public_runs, self.requested),
            replies_cell(self.replies, self.users),
            f"{at(self.flag_s)} / {at(self.up_s)}",
            str(self.unsettled),
            f"{self.wall_s:.1f}",
        ]


ADMIN_HEADERS = [
    "row",
    "users / msgs",
    "requested calls",
    "as append / public_append",
    "in flight",
    "runs on admin",
    "runs on public",
    "public runs / requested",
    "replies / user (by count)",
    "FLAG / admin up at s",
    "unsettled",
    "run s",
]


async def admin_row(args: argparse.Namespace) -> AdminRow:
    model = Model("storm", args.seed, args.tool_s, 1, tuple(args.model_s))
    settings = storm_settings(args) | {"LASTWORD_ACCESS__ADMINS": ADMIN_ID}
    with scratch() as folder:
        ran = await run_row(
            model,
            folder,
            settings,
            ("a",),
            lambda s, r: admin_load(args, s, r[0]),
            admin_servers(folder),
        )
        users, load = args.admin_users, ran.load
        requested = requested_calls(ran.served)

        def since(at: float | None) -> float | None:
            return None if at is None else at - load.users.began

        up_at = load.admin.up_at
        run_at = {
            effect_turn(line.split("\t")[1]): float(line.split("\t")[3])
            for line in lines_of(ran.setup.times)
        }
        in_flight = [
            call
            for call, tool in requested.items()
            if tool == "append" and up_at is not None and run_at.get(call, 0.0) >= up_at
        ]
        replies = replies_by_user(ran.replies)
        problems = load.users.storm.problems + ran.errors
        if up_at is None:
            problems.append(f"the admin server did not come up within {ADMIN_UP_S:g} s of FLAG")
        return AdminRow(
            users=users,
            messages=sum(len(n) for n in load.users.storm.sent.values()),
            requested=len(requested),
            as_append=sum(tool == "append" for tool in requested.values()),
            as_public=sum(tool == PUBLIC_APPEND for tool in requested.values()),
            in_flight=len(in_flight),
            admin_runs=len(lines_of(folder / "admin.txt")),
            public_runs=len(lines_of(ran.setup.effects)),
            replies=Counter(len(replies[u]) for u in range(users)),
            flag_s=since(load.admin.flag_at),
            up_s=since(up_at),
            unsettled=load.users.unsettled,
            wall_s=load.users.wall_s,
            problems=problems,
        )


async def admin_load(args: argparse.Namespace, setup: Setup, replica: Replica) -> AdminLoad:
    """The users asking; FLAG created once a third of them had a call run on the public
    server, and the moment the admin server came up."""
    row = plans(args.seed, args.admin_users, args.admin_stagger_s)
    marks = Effects(setup.effects, kill_at=max(1, args.admin_users // 3))
    async with followed(marks):
        admin = LateAdmin(
            setup.folder / "FLAG", replica, marks, args.admin_stagger_s + TOOL_START_S
        )
        watching = asyncio.create_task(admin.run())
        try:
            users = await users_load(
                setup,
                [replica],
                row,
                lambda storm, plan, began: storm.asking(
                    plan, began, setup.server, args.admin_asks, admin
                ),
            )
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    return AdminLoad(users, admin)


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
    with scratch() as folder:
        ran = await run_row(
            model, folder, steps_settings(args), ("a",), lambda s, r: steps_load(args, s, r[0])
        )
        problems = ran.load + ran.errors
        steps, missing = steps_of(ran.served, ran.setup.times)
        if missing:
            problems.append(f"{missing} tool steps could not be matched and were left out")
        return steps, problems


def steps_settings(args: argparse.Namespace) -> dict[str, str]:
    return fixed_window(args.steps_quiet_ms)


def fixed_window(quiet_ms: int) -> dict[str, str]:
    """A window of `quiet_ms` that neither speculates nor learns: a reply waits for it,
    then for the model, the same for every message."""
    return {
        "LASTWORD_DEBOUNCE__QUIET_MS": str(quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(quiet_ms * 4),
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
    for line in lines_of(times):
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


# -- a server streaming 100 MB ----------------------------------------------------------------


class SampledLag(LagWatch):
    """The replica's loop lag over a phase (`LagWatch`: its histogram before and after), its
    decaying worst recent lag read every `LAG_SAMPLE_S`: that gauge holds a stall until the
    next tick (50 ms) and then loses a tenth a tick, so a stall is read at 90 % of it at
    least."""

    async def _poll(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(LAG_SAMPLE_S)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError):
                self.recent_s.append((await scrape(session, self.url))[LAG_RECENT])


@dataclass(frozen=True)
class Phase:
    """One phase of the flood row: what the users did, when each message was posted, and
    the replica's loop lag over it."""

    users: Users
    sent_at: dict[tuple[int, int], float]
    lag: LagWatch


@dataclass(frozen=True)
class FloodLoad:
    quiet: Phase
    flood: Phase
    stop_at: float | None  # the replica logged A's answer over the limit, stopping the server
    restarted_at: float | None  # the server's next start, in its own file
    stops: int  # "is not running" lines in the replica's log
    starts: int  # the server's starts, in its own file
    problems: list[str]


def flood_server(folder: Path) -> dict[str, Any]:
    """The test server, noting its starts in "starts.txt"."""
    server = append_server(folder / "effects.txt")
    server["env"]["LW_STARTS_FILE"] = str(folder / "starts.txt")
    return {FLOOD_SERVER: server}


def flood_name(args: argparse.Namespace) -> str:
    return f"a server streams {args.flood_bytes / 1e6:g} MB"


def flood_stagger_s(args: argparse.Namespace) -> float:
    """The users' starts are spread over A's window and the model's longest answer, so that
    some are in their window, some generating, some being sent when A's tool answers."""
    return float(args.flood_quiet_ms / 1000 + args.model_s[1])


async def flood_load(
    args: argparse.Namespace, setup: Setup, replica: Replica, metrics_url: str
) -> FloodLoad:
    """Every user once (the warm-up), then the quiet phase, then the same messages while A's
    tool floods; then the server's restart."""
    starts = setup.folder / "starts.txt"
    async with store_of(setup.server) as store:

        def questions(first: int) -> list[tuple[int, str]]:
            return [(first + k, f"question {k}") for k in range(args.flood_asks)]

        async def phase(asks: list[tuple[int, str]], flooding: bool) -> Phase:
            row = plans(args.seed, args.flood_users + 1, flood_stagger_s(args))[1:]
            if flooding:
                row.append(Plan(FLOODER, at=0.0, storm=0, replica=0))
            sent_at: dict[tuple[int, int], float] = {}

            def user(storm: Storm, plan: Plan, began: float) -> Awaitable[None]:
                mine = [(0, "flood me")] if plan.user == FLOODER else asks
                return storm.questions(plan, began, store, mine, sent_at)

            lag = SampledLag(metrics_url, replica.running.process.pid)
            done = await lag.run(users_load(setup, [replica], row, user))
            return Phase(done, sent_at, lag)

        warm = await phase([(0, "hello")], flooding=False)
        quiet = await phase(questions(1), flooding=False)
        stopping = asyncio.create_task(
            until(lambda: replica.running.said(OVERLONG) > 0, SETTLE_S * 2)
        )
        flood = await phase(questions(1 + args.flood_asks), flooding=True)
        seen, _ = await asyncio.wait({stopping}, timeout=LOG_S)
        stopping.cancel()
        stop_at = stopping.result() if seen else None
        restarted_at = None
        if stop_at is not None:
            restarted_at = await until(lambda: len(lines_of(starts)) > 1, RESTART_S)
    problems = [*warm.users.storm.problems, *quiet.users.storm.problems]
    problems += flood.users.storm.problems
    if stop_at is not None and restarted_at is None:
        problems.append(f"the server was not started again within {RESTART_S:g} s")
    stops = replica.running.said(NOT_RUNNING)
    return FloodLoad(quiet, flood, stop_at, restarted_at, stops, len(lines_of(starts)), problems)


@dataclass(frozen=True)
class FloodRow:
    row: str
    users: int
    messages: int
    replied: int
    reply_us: list[int]  # each other user's message to its reply reaching Telegram
    lag_bound: str  # the highest histogram bucket the phase's lags reached, ms
    lag_recent_ms: float | None  # the most the decaying recent lag was read at
    waited_ms: float | None  # what the replica waited for a core over the phase, ms
    in_flight: int | None  # messages posted before the stop and answered after it
    flooder: str  # A's reply: what it said, and when
    servers: str  # the server's stops (logged) / starts (its own file)

    def cells(self) -> list[str]:
        recent = "-" if self.lag_recent_ms is None else f"{self.lag_recent_ms:.0f}"
        return [
            self.row,
            f"{self.users} / {self.messages}",
            str(self.replied),
            ms(self.reply_us, 50),
            ms(self.reply_us, 100),
            self.lag_bound,
            recent,
            "-" if self.waited_ms is None else f"{self.waited_ms:.0f}",
            "-" if self.in_flight is None else str(self.in_flight),
            self.flooder,
            self.servers,
        ]


FLOOD_HEADERS = [
    "row",
    "users / msgs",
    "replied",
    "reply p50 ms",
    "max ms",
    "loop lag max ms (histogram)",
    "recent lag max ms (20 ms polls)",
    "waited for a core ms",
    "in flight at the stop",
    "A's reply",
    "server stops / starts",
]


def replies_at(delivered: list[tuple[int, str, float]]) -> dict[tuple[int, int], tuple[str, float]]:
    """The first reply Telegram took for each message it quotes: (user, n) -> (text, when)."""
    found: dict[tuple[int, int], tuple[str, float]] = {}
    for _, text, when in delivered:
        quoted = MESSAGE.search(text)
        if quoted:
            found.setdefault((int(quoted[1]), int(quoted[2])), (text, when))
    return found


def flood_figures(
    row: str, phase: Phase, replies: dict[tuple[int, int], tuple[str, float]], load: FloodLoad
) -> FloodRow:
    """A phase's row: the other users' reply times, the loop's lag, and in the flood phase
    A's reply and the server's stop and restart."""
    asked = {key: at for key, at in phase.sent_at.items() if key[0] != FLOODER}
    reply_us = [us(replies[key][1] - at) for key, at in asked.items() if key in replies]
    flooding = phase is load.flood
    stop = load.stop_at
    in_flight = None
    if flooding and stop is not None:
        in_flight = sum(at < stop < replies[key][1] for key, at in asked.items() if key in replies)
    flooder = "-"
    if flooding:
        flooder = "none"
        asked_at, reply = phase.sent_at.get((FLOODER, 0)), replies.get((FLOODER, 0))
        if asked_at is not None and reply is not None:
            said = "too long" if TOO_LONG_SAID in reply[0] else repr(reply[0][:30])
            flooder = f"{said}, {reply[1] - asked_at:.1f} s"
    recent = max(phase.lag.recent_s, default=None)
    return FloodRow(
        row=row,
        users=len({user for user, _ in asked}),
        messages=len(asked),
        replied=len(reply_us),
        reply_us=reply_us,
        lag_bound=phase.lag.quantile_ms(1.0),
        lag_recent_ms=None if recent is None else recent * 1000,
        waited_ms=phase.lag.waited_ms,
        in_flight=in_flight,
        flooder=flooder,
        servers=f"{load.stops} / {load.starts}" if flooding else "-",
    )


async def flood_row(args: argparse.Namespace) -> tuple[list[FloodRow], list[str]]:
    """The quiet row and the flood row, from one replica's run; and what went wrong."""
    model = Model("flood", args.seed, 0.0, 1, tuple(args.model_s), args.flood_bytes)
    metrics = free_port()
    settings = fixed_window(args.flood_quiet_ms)
    settings["LASTWORD_METRICS_LISTEN"] = f"127.0.0.1:{metrics}"
    url = f"http://127.0.0.1:{metrics}/metrics"
    with scratch() as folder:
        ran = await run_row(
            model,
            folder,
            settings,
            ("a",),
            lambda s, r: flood_load(args, s, r[0], url),
            flood_server(folder),
        )
    load, replies = ran.load, replies_at(ran.delivered)
    rows = [
        flood_figures("no flood (same messages)", load.quiet, replies, load),
        flood_figures(flood_name(args), load.flood, replies, load),
    ]
    problems = load.problems + ran.errors
    if rows[1].replied < rows[1].messages:
        problems.append(f"{rows[1].messages - rows[1].replied} messages not answered")
    if args.flood_bytes > ToolsSettings().max_message_bytes and "too long" not in rows[1].flooder:
        problems.append(f"A's reply did not say the answer was too long: {rows[1].flooder}")
    return rows, problems


# -- the report -----------------------------------------------------------------------------


def header(
    args: argparse.Namespace, argv: Sequence[str], load: tuple[float, ...], rows: set[str]
) -> None:
    print("command: python -m benchmarks.tools " + " ".join(argv))
    print(
        f"cpus: {os.cpu_count()}, load average (1, 5, 15 min) at the start "
        f"{' '.join(f'{x:.2f}' for x in load)}, at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())};"
        f" `lastword run` replicas (telegram webhook), the fake Bot API and provider in 2"
        f" processes, the append MCP server over stdio per replica; seed {args.seed}"
    )
    shipped = DebounceSettings()
    lines = {
        ("storm", "kill"): storm_line(args, shipped),
        ("steps",): (
            f"steps: {args.steps_users} users one every {args.steps_every_ms} ms, 1 replica, "
            f"{args.steps_per_turn} tool steps each (even users read_only_echo, odd users "
            f"append without delay), model answers {args.steps_model_s[0]:g}-"
            f"{args.steps_model_s[1]:g} s; quiet_ms={args.steps_quiet_ms}, speculation off"
        ),
        ("veto",): (
            f"veto: {args.veto_users} users over {args.veto_stagger_s:g} s, 2 replicas, quiet_ms"
            f"={args.veto_quiet_ms} speculate_ms={shipped.speculate_ms} learn=False; each asks"
            f" once, and writes DON'T once the call is held with over {VETO_MARGIN_MS} ms of"
            f" window left"
        ),
        ("retry",): (
            f"retry: {args.retry_users} users over {args.retry_stagger_s:g} s, 2 replicas, the"
            f" storm's window; each asks once (odd users after /reset in the same burst), then"
            f" /retry x{args.retries}, each once the previous reply is in"
        ),
        ("admin",): (
            f"late admin: {args.admin_users} non-admin users over {args.admin_stagger_s:g} s, 1"
            f" replica, the storm's window; servers admin (adminOnly, down until FLAG) then"
            f" public; each asks at least {args.admin_asks} times, one turn after the other,"
            f" and until a turn began after admin came up; FLAG once"
            f" {max(1, args.admin_users // 3)} calls have run"
        ),
        ("flood",): (
            f"flood: 1 replica, the test server over stdio (message limit"
            f" {ToolsSettings().max_message_bytes} bytes, shipped); {args.flood_users} users"
            f" start over {flood_stagger_s(args):g} s and each asks {args.flood_asks} times, one"
            f" after the other, answered in text; then the same again, with user A asking at"
            f" the start for `flood` to answer {args.flood_bytes} bytes in one message; model"
            f" answers {args.model_s[0]:g}-{args.model_s[1]:g} s; quiet_ms="
            f"{args.flood_quiet_ms}, speculation off; loop lag from the replica's /metrics"
        ),
    }
    for names, line in lines.items():
        if rows & set(names):
            print(line)


def storm_line(args: argparse.Namespace, shipped: DebounceSettings) -> str:
    return (
        f"storm: {args.users} users over {args.stagger_s:g} s, 2 replicas, tool (append) "
        f"{args.tool_s:g} s, then {args.storm[0]}-{args.storm[1]} messages {args.gap_ms} ms "
        f"apart; model answers {args.model_s[0]:g}-{args.model_s[1]:g} s; debounce quiet_ms="
        f"{args.quiet_ms} max_wait_ms={max(args.quiet_ms, shipped.max_wait_ms)} speculate_ms="
        f"{shipped.speculate_ms} learn={shipped.learn} (shipped: {shipped.quiet_ms}, "
        f"{shipped.max_wait_ms}, {shipped.speculate_ms}, {shipped.learn}); lease ttl_ms="
        f"{LEASE_TTL_MS}, sweep_interval_ms={SWEEP_MS}, step_limit={ToolsSettings().step_limit}"
    )


def problems_of(row: str, problems: list[str]) -> None:
    for line in problems[:10]:
        print(f"  ! {row}: {line}")


def storm_table(rows: list[StormRow]) -> None:
    print("\n== side effects under the interrupt storm")
    print_table(STORM_HEADERS, [r.cells() for r in rows])
    for r in rows:
        if r.killed_after is not None:
            print(f"  {r.row}: replica a killed (SIGKILL) once {r.killed_after} calls had started")
        problems_of(r.row, r.problems)
    print(
        "  requested calls: distinct (user, first message of the turn) over the provider's "
        "requests it answered with the call;\n  executions: lines the tool appended; unknown:"
        " replies whose model was told the call's outcome is unknown"
    )


def veto_table(veto: VetoRow) -> None:
    print("\n== the newest word governs a held call: a veto written inside the window")
    print_table(VETO_HEADERS, [veto.cells()])
    problems_of("veto", veto.problems)
    print(
        "  vetoed while held: DON'T sent while the call was recorded, not started, and the "
        "window open;\n  told not run: users whose model then read that the call was not run;"
        " runs of vetoed: their lines in the side-effect file"
    )


def retry_table(retry: RetryRow) -> None:
    print("\n== /retry storms: the turn's record is reused")
    print_table(RETRY_HEADERS, [retry.cells()])
    problems_of("retry", retry.problems)


def admin_table(admin: AdminRow) -> None:
    print("\n== the tool that was checked is the tool that runs: a late admin-only server")
    print_table(ADMIN_HEADERS, [admin.cells()])
    problems_of("late admin", admin.problems)
    print(
        "  as append: offered before the admin server was up; as public_append: after;"
        " in flight: asked as append, run\n  once admin had taken the name; runs on admin:"
        " lines the admin server appended (no user is an admin)"
    )


def steps_report(steps: list[Step], problems: list[str]) -> None:
    print("\n== lastword's own time per tool step (quiet run, 1 replica)")
    steps_table(steps)
    problems_of("steps", problems)
    print(
        "  lastword = next request start - end of the response that asked - the tool's own time;"
        "\n  before: stream end -> tool start; after: tool end -> next request start"
    )


def flood_table(flood: tuple[list[FloodRow], list[str]]) -> None:
    rows, problems = flood
    print("\n== one server's huge answer, everyone else on time (1 replica, one run)")
    print_table(FLOOD_HEADERS, [r.cells() for r in rows])
    problems_of("flood", problems)
    print(
        "  reply: the other users' message posted -> its reply at the fake Telegram (A's left"
        " out); loop lag: the replica's\n  own /metrics over the phase (histogram: the bound of"
        " the highest bucket reached; recent: its decaying worst,\n  read every 20 ms);"
        " waited for a core: the replica's run-queue wait over the phase; in"
        " flight: posted before the replica logged the over-long message, answered after;"
        "\n  A's reply: whether it says the answer was too long (the error reached the model),"
        " and when from A's message;\n  server stops / starts: the replica's \"is not running\""
        " lines / the server's own starts"
    )


# What `--rows` names: every table's rows, each run on its own.
ROWS = ("storm", "kill", "steps", "veto", "retry", "admin", "flood")


async def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    load = os.getloadavg()
    chosen = set(args.rows) - ({"kill"} if args.no_kill else set())
    storms = [await storm_row(args, kill) for kill in (False, True) if ROWS[kill] in chosen]
    steps = await steps_run(args) if "steps" in chosen else None
    veto = await veto_row(args) if "veto" in chosen else None
    retry = await retry_row(args) if "retry" in chosen else None
    admin = await admin_row(args) if "admin" in chosen else None
    flood = await flood_row(args) if "flood" in chosen else None
    header(args, argv, load, chosen)
    if storms:
        storm_table(storms)
    if steps is not None:
        steps_report(*steps)
    if veto is not None:
        veto_table(veto)
    if retry is not None:
        retry_table(retry)
    if admin is not None:
        admin_table(admin)
    if flood is not None:
        flood_table(flood)


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
    parser.add_argument("--veto-users", type=int, default=12)
    parser.add_argument("--veto-stagger-s", type=float, default=4.0)
    parser.add_argument(
        "--veto-quiet-ms", type=int, default=3000,
        help="the veto row's window: long enough for the model to ask before it closes",
    )  # fmt: skip
    parser.add_argument("--retry-users", type=int, default=10)
    parser.add_argument("--retry-stagger-s", type=float, default=3.0)
    parser.add_argument("--retries", type=int, default=3, help="/retry per user")
    parser.add_argument("--admin-users", type=int, default=8)
    parser.add_argument("--admin-stagger-s", type=float, default=4.0)
    parser.add_argument(
        "--admin-asks", type=int, default=3, help="turns per user at least, one after the other"
    )
    parser.add_argument(
        "--flood-bytes", type=int, default=100_000_000,
        help="what A's tool answers, in one message",
    )  # fmt: skip
    parser.add_argument(
        "--flood-users", type=int, default=4, help="the users asking while A's tool floods"
    )
    parser.add_argument("--flood-asks", type=int, default=3, help="messages per user per phase")
    parser.add_argument("--flood-quiet-ms", type=int, default=300)
    parser.add_argument(
        "--rows", nargs="+", choices=ROWS, default=list(ROWS), metavar="ROW",
        help=f"the rows to run, of {' '.join(ROWS)} (default: all)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    with timed_run():
        asyncio.run(run(parse_args(given), given))


if __name__ == "__main__":
    main()
