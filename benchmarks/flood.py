"""A flood on one replica: how many Telegram webhook updates per second it acknowledges, how
quickly, and whether its replies still go out before the user has moved on.

    python -m benchmarks.flood [--rate 150] [--load-s 20] [--senders 100] [--users 5000]
                               [--seed 7] [--runs 1] [--budgets off shared] [--bot-rate 1000]
                               [--traces off on] [--py-spy out.txt]

One `lastword run` process (the real Telegram adapter in webhook mode, the real OpenAI client)
on an embedded server, with the loopback fakes of the Bot API and of the provider each in a
child process of its own, so that neither their CPU nor their event loop is the bot's. The
fake model answers in 0.2-1 s (seeded by the prompt), a reply of about 30 words streamed.

Load: DMs arrive at `--rate` per second (Poisson, seeded) for `--load-s` seconds, each from a
user drawn from a pool of `--users`, posted to the webhook over at most `--senders`
connections at once (Telegram's cap on a webhook's concurrent deliveries is 100). Open loop: a
message waits for a free connection, as Telegram's queue would, and its acknowledgement
latency counts from when it was due, so a slow replica cannot hide its backlog by slowing the
senders down. The debounce window is the shipped one.

It prints:

- messages/s acknowledged (200s over the load time), and how many were answered otherwise;
- acknowledgement latency p50 / p99 / max, from a message's due time to its 200;
- late replies: replies the fake Bot API received more than 1 s after a newer message of the
  same user had been acknowledged (the reply names the newest message its prompt held; the
  fake's receive time and the senders' acknowledgement time are one clock,
  `time.monotonic()`): such a reply passed the pre-send check, then waited to be sent;
- the Bot API calls per message (sendMessage, sendMessageDraft, sendChatAction);
- CPU seconds per message of the bot process (utime + stime from /proc over the load);
- where the machine's CPU went over the load, in cores: the bot, the rest of the benchmark
  (the fakes, the embedded server, the senders), and everything else on the machine (other
  people's work on a shared one): a run whose bot was starved of CPU shows it here;
- the bot's event-loop lag over the load, from its /metrics: p50 and p99 of how late its loop
  ran a 50 ms timer (to the histogram's bucket bounds, so "<= 25" is between 10 and 25 ms),
  and the highest its decaying worst recent lag (what sheds previews) was seen at, polled.

With `--budgets`, each run is made once with each outbound budget named
(`LASTWORD_OUTBOUND__BUDGET`: off, replica, shared), taking turns (so a machine busier for a
while slows them alike), and the acknowledgement p50 and p99 of every run are compared at the
end: each budget's against the first named, run by run and by their medians. `--bot-rate` sets
the bot-wide limit the budget keeps (`LASTWORD_TELEGRAM__MESSAGES_PER_SECOND`; Telegram's 30
a second would cap the replies themselves, so 1000 lets the budget pace without capping).
Without them, the shipped settings.

With `--traces off on`, each run is made once with tracing off and once on (every burst
sampled, `OTEL_TRACES_SAMPLER=always_on`, exported over OTLP/HTTP to a receiver that decodes
them, in a child process of its own), taking turns, and compared as budgets are: what traces
cost the acknowledgement. The spans received are printed with each run.

With `--py-spy PATH`, py-spy (installed separately) samples the bot for the load's middle and
writes its collapsed stacks to PATH; the top frames by share of samples are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar, cast

import aiohttp

from benchmarks.child import Child
from benchmarks.command_line import timed_run
from benchmarks.wakeup import percentile, print_table, temporary_server
from bot.cancel import cancel_and_wait
from bot.config.settings import DebounceSettings, InstalledSettings
from bot.service.app import make_store
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis
from tests.support.core_waits import waited_s
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.fakes.otlp_receiver import FakeOTLP
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import clean_environ

SECRET = "flood-webhook-secret"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# A reply is late when it reaches Telegram this long after a newer message of its user was
# acknowledged (the bound).
LATE_S = 1.0
# Every message says which one it is; the reply names the newest one its prompt held.
TAG = re.compile(r"#(\d+)\b")
FILLER = ("fine", "thanks", "and", "you", "said", "something", "worth", "a", "careful", "answer")
POST_TIMEOUT_S = 30.0
# How long the bot gets to answer everything once the load ends.
SETTLE_S = 30.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


# -- the fakes, each in a process of its own ------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    at: float
    chat_id: int
    text: str


def reply_for(seed: int) -> Any:
    def reply(request: RecordedRequest) -> str:
        newest = max((int(n) for n in TAG.findall(request.last_user_text)), default=0)
        rng = random.Random(f"{seed}:{newest}")
        return f"re #{newest} " + " ".join(rng.choice(FILLER) for _ in range(rng.randint(20, 40)))

    return reply


def delay_for(seed: int, low_s: float, high_s: float) -> Any:
    def delay(request: RecordedRequest) -> float:
        return random.Random(f"{seed}:delay:{request.last_user_text}").uniform(low_s, high_s)

    return delay


def fake_main(kind: str, seed: int, model_s: tuple[float, float], conn: Connection) -> None:
    asyncio.run(serve_fake(kind, seed, model_s, conn))


async def serve_fake(kind: str, seed: int, model_s: tuple[float, float], conn: Connection) -> None:
    """One fake until told the run is over; then what it saw, sent back."""
    if kind == "telegram":
        async with FakeTelegram() as telegram:
            conn.send(telegram.api_url)
            with contextlib.suppress(EOFError):
                await asyncio.to_thread(conn.recv)
            calls = [
                Call(c.method, c.at, int(c.chat_id or 0), c.text or "")
                for c in telegram.calls
                if c.status == 200
            ]
        with contextlib.suppress(OSError):
            conn.send(calls)
        return
    if kind == "otlp":
        async with FakeOTLP() as receiver:
            conn.send(receiver.endpoint)
            with contextlib.suppress(EOFError):
                await asyncio.to_thread(conn.recv)
            received = (receiver.requests, len(receiver.spans))
        with contextlib.suppress(OSError):
            conn.send(received)
        return
    async with FakeOpenAI(reply=reply_for(seed)) as provider:
        provider.delay_for = delay_for(seed, *model_s)
        conn.send(provider.base_url)
        with contextlib.suppress(EOFError):
            await asyncio.to_thread(conn.recv)
        requests = len(provider.requests)
        cancelled = sum(r.cancelled for r in provider.requests)
    with contextlib.suppress(OSError):
        conn.send((requests, cancelled))


# -- the bot --------------------------------------------------------------------------------


def bot_env(
    server: EmbeddedRedis, data_dir: Path, api_url: str, llm_url: str, port: int, metrics: int
) -> Any:
    return (
        clean_environ()
        | model_env(llm_url)
        | {
            "LASTWORD_PLATFORM": "telegram",
            "LASTWORD_REDIS_URL": server.url,
            "LASTWORD_DATA_DIR": str(data_dir),
            "LASTWORD_LOG_LEVEL": "WARNING",
            "LASTWORD_TELEGRAM__TOKEN": FakeTelegram().token,
            "LASTWORD_TELEGRAM__API_URL": api_url,
            "LASTWORD_TELEGRAM__MODE": "webhook",
            "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}",
            "LASTWORD_TELEGRAM__WEBHOOK_SECRET": SECRET,
            "LASTWORD_METRICS_LISTEN": f"127.0.0.1:{metrics}",
        }
    )


def outbound_env(budget: str | None, bot_rate: int | None) -> dict[str, str]:
    """The outbound budget and the bot-wide limit, where the command line sets them."""
    env = {}
    if budget is not None:
        env["LASTWORD_OUTBOUND__BUDGET"] = budget
    if bot_rate is not None:
        env["LASTWORD_TELEGRAM__MESSAGES_PER_SECOND"] = str(bot_rate)
    return env


def traces_env(variant: str | None, endpoint: str | None) -> dict[str, str]:
    """Tracing as `--traces` names it for a run: off, or on with every burst sampled and
    exported to the receiver at `endpoint`; nothing for another run."""
    if variant == "traces off":
        return {"LASTWORD_TRACES__ENABLED": "false"}
    if variant == "traces on" and endpoint is not None:
        return {
            "LASTWORD_TRACES__ENABLED": "true",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        }
    return {}


def model_env(llm_url: str) -> dict[str, str]:
    """The settings of a bot whose model is the fake provider at `llm_url`."""
    return {
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": llm_url,
        "LASTWORD_LLM__API_KEY": "sk-bench",
        "LASTWORD_LLM__MODEL": "gpt-4o-mini",
    }


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def busy_s() -> float:
    """CPU seconds the whole machine has spent busy so far, over all its cores."""
    fields = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / TICKS_PER_S


@dataclass
class Machine:
    """CPU seconds used by the bot, by the rest of the benchmark and by the whole machine."""

    bot_s: float = 0.0
    bench_s: float = 0.0
    all_s: float = 0.0

    @staticmethod
    def now(bot: int, others: Sequence[int]) -> Machine:
        return Machine(
            cpu_s(bot), sum(cpu_s(pid) for pid in others) + time.process_time(), busy_s()
        )

    def __sub__(self, before: Machine) -> Machine:
        return Machine(
            self.bot_s - before.bot_s, self.bench_s - before.bench_s, self.all_s - before.all_s
        )


async def ready(url: str, timeout_s: float) -> None:
    """Wait until the webhook answers (a wrong secret: 401)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(url, json={}) as response:
                    if response.status == 401:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the bot's webhook did not answer within {timeout_s:g} s")
            await asyncio.sleep(0.1)


LAG = "lastword_event_loop_lag_seconds"
LAG_RECENT = "lastword_event_loop_lag_recent_seconds"
# How often the decaying recent lag is read during the load.
LAG_POLL_S = 0.25


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The bot's metrics by name with labels, as exposed (`name{le="0.1"}`)."""
    async with session.get(url) as response:
        text = await response.text()
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            out[name] = float(value)
    return out


@dataclass
class LagWatch:
    """The bot's event-loop lag over the load: its histogram before and after, and the
    recent lag polled in between; with the bot's `pid`, also how long it waited for a core
    meanwhile (a loop that lags because the machine gave it no core is not the bot's stall)."""

    url: str
    pid: int | None = None
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    recent_s: list[float] = field(default_factory=list)
    # How long the bot waited for a core over the load, ms; None if not known.
    waited_ms: float | None = None

    async def run(self, load: Awaitable[T]) -> T:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self.before = await self._first(session, 30.0)
            waited_before = self._waited_s()
            poll = asyncio.create_task(self._poll(session))
            try:
                result = await load
            finally:
                await cancel_and_wait(poll)
            waited_after = self._waited_s()
            if waited_before is not None and waited_after is not None:
                self.waited_ms = (waited_after - waited_before) * 1000
            self.after = await scrape(session, self.url)
        return result

    def _waited_s(self) -> float | None:
        return None if self.pid is None else waited_s(self.pid)

    async def _first(self, session: aiohttp.ClientSession, timeout_s: float) -> dict[str, float]:
        """The metrics once the bot serves them (it may start after the webhook)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                return await scrape(session, self.url)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the bot's /metrics did not answer within {timeout_s:g} s")
            await asyncio.sleep(0.1)

    async def _poll(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(LAG_POLL_S)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError):
                self.recent_s.append((await scrape(session, self.url))[LAG_RECENT])

    def quantile_ms(self, q: float) -> str:
        """The bucket bound (ms) the q-quantile of the load's lag samples is under; "-" if
        the bot exported none."""
        total = self.after.get(LAG + "_count", 0.0) - self.before.get(LAG + "_count", 0.0)
        if not total:
            return "-"
        bounds = sorted(
            (float(key.split('"')[1]), key)
            for key in self.after
            if key.startswith(LAG + "_bucket") and "+Inf" not in key
        )
        for bound, key in bounds:
            if self.after[key] - self.before.get(key, 0.0) >= q * total:
                return f"<= {bound * 1000:g}"
        return f"> {bounds[-1][0] * 1000:g}"


# -- the load -------------------------------------------------------------------------------


@dataclass
class Sent:
    seq: int
    user: int
    due: float
    acked: float | None = None
    status: int | None = None


def plan(args: argparse.Namespace) -> list[tuple[float, int]]:
    """(seconds from the start, user) for every message, seeded."""
    rng = random.Random(args.seed)
    at, out = 0.0, list[tuple[float, int]]()
    while True:
        at += rng.expovariate(args.rate)
        if at >= args.load_s:
            return out
        out.append((at, rng.randrange(args.users)))


def update(seq: int, user: int, message_id: int) -> dict[str, Any]:
    chat = 10_000 + user
    person = {"id": chat, "is_bot": False, "first_name": f"U{user}"}
    return {
        "update_id": seq,
        "message": {
            "message_id": message_id,
            "from": person,
            "chat": {"id": chat, "type": "private", "first_name": f"U{user}"},
            "date": int(time.time()),
            "text": f"#{seq} hello, it is user {user} with a question",
        },
    }


async def post(session: aiohttp.ClientSession, url: str, sent: Sent, body: dict[str, Any]) -> None:
    delay = sent.due - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    try:
        async with session.post(url, json=body, headers={SECRET_HEADER: SECRET}) as response:
            await response.read()
            sent.status = response.status
    except (aiohttp.ClientError, TimeoutError):
        sent.status = -1  # no answer: Telegram would deliver it again
    sent.acked = time.monotonic()


async def flood(url: str, args: argparse.Namespace) -> list[Sent]:
    connector = aiohttp.TCPConnector(limit=args.senders)
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    message_ids: Counter[int] = Counter()
    start = time.monotonic() + 0.5
    sent: list[Sent] = []
    tasks = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for seq, (offset, user) in enumerate(plan(args), 1):
            message_ids[user] += 1
            one = Sent(seq, user, start + offset)
            sent.append(one)
            tasks.append(post(session, url, one, update(seq, user, message_ids[user])))
        await asyncio.gather(*tasks)
    return sent


async def settle(server: EmbeddedRedis, users: set[int], timeout_s: float) -> int:
    """Wait until every conversation is answered (V == W); how many are not, at the end."""
    settings = InstalledSettings(platform="console", redis_url=server.url, data_dir=server.data_dir)
    redis = make_client(server.url)
    store = make_store(settings, redis)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            open_ = 0
            for user in users:
                v, w = await store.counters(f"telegram:{10_000 + user}")
                open_ += v != w
            if not open_ or time.monotonic() > deadline:
                return open_
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()


# -- one run --------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: list[Sent]
    calls: list[Call]
    requests: int
    cancelled: int
    cpu_s: float
    # Seconds the CPU time was measured over: from the first message to the last answer.
    wall_s: float
    unsettled: int
    lag: LagWatch
    machine: Machine = field(default_factory=Machine)
    profile: list[tuple[str, float]] = field(default_factory=list)
    # Traced (`--traces`): the receiver's export requests and the spans they carried.
    exports: tuple[int, int] = (0, 0)


async def run_once(args: argparse.Namespace, variant: str | None = None) -> Outcome:
    """One run; `variant` is a budget's name (`--budgets`), "traces off" or "traces on"
    (`--traces`), or None: the shipped settings."""
    telegram = Child("fake-telegram", fake_main, "telegram", args.seed, tuple(args.model_s))
    provider = Child("fake-openai", fake_main, "openai", args.seed, tuple(args.model_s))
    traced = variant == "traces on"
    receiver = Child("fake-otlp", fake_main, "otlp", args.seed, tuple(args.model_s))
    budget = None if variant is None or variant.startswith("traces") else variant
    folder = Path(tempfile.mkdtemp(prefix="lw-flood-", dir="/tmp"))
    try:
        api_url, llm_url = cast(str, await telegram.start()), cast(str, await provider.start())
        endpoint = cast(str, await receiver.start()) if traced else None
        async with temporary_server() as server:
            port, metrics = free_port(), free_port()
            lag = LagWatch(f"http://127.0.0.1:{metrics}/metrics")
            log_path = folder / "bot.log"
            with log_path.open("w") as log:
                bot = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bot",
                    "run",
                    env=bot_env(server, folder / "data", api_url, llm_url, port, metrics)
                    | outbound_env(budget, args.bot_rate)
                    | traces_env(variant, endpoint),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                url = f"http://127.0.0.1:{port}/telegram"
                await ready(url, 30.0)
                spy = None
                if args.py_spy:
                    spy = await asyncio.create_subprocess_exec(
                        *start_spy_command(bot.pid, args),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                assert server.process is not None, "the embedded server is not running"
                others = [telegram.pid, provider.pid, server.process.pid]
                before, began = Machine.now(bot.pid, others), time.monotonic()
                sent = await lag.run(flood(url, args))
                machine = Machine.now(bot.pid, others) - before
                used, wall = machine.bot_s, time.monotonic() - began
                if spy is not None:
                    await asyncio.wait_for(spy.wait(), 60)
                unsettled = await settle(server, {s.user for s in sent}, SETTLE_S)
            finally:
                bot.terminate()
                await asyncio.wait_for(bot.wait(), 30)
        problems = [line for line in log_path.read_text().splitlines() if "ERROR" in line]
        for line in problems[:5]:
            print(f"  ! bot: {line}")
        calls = cast(list[Call], await telegram.finish())
        requests, cancelled = cast(tuple[int, int], await provider.finish())
        exports = cast(tuple[int, int], await receiver.finish()) if traced else (0, 0)
    finally:
        await telegram.close()
        await provider.close()
        if traced:
            await receiver.close()
    outcome = Outcome(sent, calls, requests, cancelled, used, wall, unsettled, lag, machine)
    outcome.exports = exports
    if args.py_spy:
        outcome.profile = top_frames(Path(args.py_spy))
    shutil.rmtree(folder, ignore_errors=True)
    return outcome


# What a frame is reported as: the function and its file, without the line.
FRAME = re.compile(r"^(.*?) \((.*?)(?::\d+)?\)$")
# Frames on nearly every stack (the loop itself) say nothing about where its time goes.
SCAFFOLD_SHARE = 0.9


def top_frames(path: Path, count: int = 30) -> list[tuple[str, float]]:
    """The frames found in the most samples (each counted once per sample), by share of all
    samples, leaving out those on nearly every stack."""
    total = 0
    inclusive: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit():
            continue
        total += int(samples)
        for name in {frame_name(frame) for frame in stack.split(";")}:
            inclusive[name] += int(samples)
    if not total:
        return []
    shares = ((name, n / total) for name, n in inclusive.most_common())
    return [(name, share) for name, share in shares if share < SCAFFOLD_SHARE][:count]


def frame_name(frame: str) -> str:
    match = FRAME.match(frame)
    # The file with its folder: httpx and httpx2 (the OpenAI client's) share file names.
    return f"{match[1]} ({'/'.join(match[2].split('/')[-2:])})" if match else frame


def start_spy_command(pid: int, args: argparse.Namespace) -> list[str]:
    """py-spy on the bot for the load's middle (its first and last seconds left out); it
    pauses the bot for each sample, so a profiled run's figures are not the unprofiled ones."""
    duration = max(int(args.load_s) - 4, 1)
    command = [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))]
    command += ["record", "-p", str(pid), "-d", str(duration), "-r", "100"]
    return [*command, "--format", "raw", "-o", args.py_spy]


# -- figures --------------------------------------------------------------------------------


def late_replies(sent: list[Sent], calls: list[Call]) -> tuple[int, int]:
    """(replies, late replies): a reply is late when its user had a message newer than the
    one it names acknowledged more than LATE_S before the reply reached the fake."""
    acked: dict[int, list[tuple[int, float]]] = {}
    for s in sent:
        if s.status == 200 and s.acked is not None:
            acked.setdefault(10_000 + s.user, []).append((s.seq, s.acked))
    replies = late = 0
    for call in calls:
        found = TAG.match(call.text.removeprefix("re "))
        if call.method != "sendMessage" or not found:
            continue
        replies += 1
        newest = int(found[1])
        newer = [at for seq, at in acked.get(call.chat_id, []) if seq > newest]
        late += bool(newer) and call.at - min(newer) > LATE_S
    return replies, late


def acked(o: Outcome) -> list[Sent]:
    """The messages acknowledged with a 200."""
    return [s for s in o.sent if s.status == 200 and s.acked is not None]


def ack_ms(o: Outcome) -> list[int]:
    """The acknowledgement latencies (ms, from each message's due time), sorted."""
    return sorted(int(((s.acked or 0) - s.due) * 1000) for s in acked(o))


def other_cores(o: Outcome) -> float:
    """The cores other work on the machine kept busy over the load, on average."""
    return (o.machine.all_s - o.machine.bot_s - o.machine.bench_s) / o.wall_s


def rows(o: Outcome) -> list[list[str]]:
    ok = acked(o)
    latencies = ack_ms(o)
    span = max((s.acked or 0) for s in o.sent) - min(s.due for s in o.sent)
    other = Counter(s.status for s in o.sent if s.status != 200)
    replies, late = late_replies(o.sent, o.calls)
    methods = Counter(c.method for c in o.calls)
    per = len(ok) or 1
    return [
        ["messages sent / acknowledged (200)", f"{len(o.sent)} / {len(ok)}"],
        ["  answered otherwise", ", ".join(f"{k}: {v}" for k, v in other.items()) or "-"],
        ["messages/s acknowledged", f"{len(ok) / span:.1f}" if span > 0 else "-"],
        [
            "ack latency p50 / p99 / max ms",
            f"{percentile(latencies, 50)} / {percentile(latencies, 99)} / {latencies[-1]}"
            if latencies
            else "-",
        ],
        ["replies / late (> 1 s after a newer ack)", f"{replies} / {late}"],
        ["conversations not settled after the load", str(o.unsettled)],
        [
            "Bot API calls per message: send / draft / typing",
            f"{methods['sendMessage'] / per:.2f} / {methods['sendMessageDraft'] / per:.2f}"
            f" / {methods['sendChatAction'] / per:.2f}",
        ],
        ["LLM requests / cancelled", f"{o.requests} / {o.cancelled}"],
        ["bot CPU s per message (load only)", f"{o.cpu_s / per * 1000:.2f} ms"],
        ["bot CPU share of one core (load only)", f"{o.cpu_s / o.wall_s:.0%}"],
        [
            f"cores busy: bot / benchmark / other work (of {os.cpu_count()})",
            f"{o.machine.bot_s / o.wall_s:.2f} / {o.machine.bench_s / o.wall_s:.2f}"
            f" / {other_cores(o):.2f}",
        ],
        [
            "bot loop lag p50 / p99 / recent max ms",
            f"{o.lag.quantile_ms(0.5)} / {o.lag.quantile_ms(0.99)}"
            f" / {max(o.lag.recent_s, default=0) * 1000:.0f}",
        ],
    ]


def compared(runs: list[tuple[str | None, Outcome]]) -> list[list[str]]:
    """Each budget's acknowledgement p50 and p99 (ms), run by run and their medians; then
    each budget's against the first one's: run by run (in the order they were made) and the
    ratio of the medians. With each run, the bot's CPU a message acknowledged (what the
    budget costs it) and the cores other work kept busy meanwhile: a run starved by the
    machine shows it."""
    by_budget: dict[str | None, list[tuple[int, int]]] = {}
    others_by_budget: dict[str | None, list[float]] = {}
    cpu_by_budget: dict[str | None, list[float]] = {}
    for budget, outcome in runs:
        latencies = ack_ms(outcome) or [0]
        by_budget.setdefault(budget, []).append(
            (percentile(latencies, 50), percentile(latencies, 99))
        )
        others_by_budget.setdefault(budget, []).append(other_cores(outcome))
        cpu_by_budget.setdefault(budget, []).append(outcome.cpu_s / max(len(latencies), 1) * 1000)
    out = []
    medians = {}
    for budget, figures in by_budget.items():
        p50s, p99s = [f[0] for f in figures], [f[1] for f in figures]
        medians[budget] = (statistics.median(p50s), statistics.median(p99s))
        out.append(
            [
                str(budget),
                ", ".join(map(str, p50s)),
                ", ".join(map(str, p99s)),
                f"{medians[budget][0]:g}",
                f"{medians[budget][1]:g}",
                ", ".join(f"{ms:.2f}" for ms in cpu_by_budget[budget]),
                ", ".join(f"{cores:.2f}" for cores in others_by_budget[budget]),
            ]
        )
    [base, *others] = by_budget
    for budget in others:
        pairs = list(zip(by_budget[budget], by_budget[base], strict=True))
        out.append(
            [
                f"{budget} / {base}",
                ", ".join(f"{a[0] / max(b[0], 1):.2f}x" for a, b in pairs),
                ", ".join(f"{a[1] / max(b[1], 1):.2f}x" for a, b in pairs),
                f"{medians[budget][0] / max(medians[base][0], 1):.2f}x",
                f"{medians[budget][1] / max(medians[base][1], 1):.2f}x",
                ", ".join(
                    f"{a / max(b, 0.001):.2f}x"
                    for a, b in zip(cpu_by_budget[budget], cpu_by_budget[base], strict=True)
                ),
                "-",
            ]
        )
    return out


async def run(args: argparse.Namespace) -> None:
    # Taking turns: a machine busier for a while slows every budget alike.
    variants = args.budgets or [f"traces {name}" for name in args.traces or ()] or [None]
    schedule = [variant for _ in range(args.runs) for variant in variants]
    runs = [(budget, await run_once(args, budget)) for budget in schedule]
    outcomes = [outcome for _, outcome in runs]
    print(
        f"cpus: {os.cpu_count()}; one `lastword run` (telegram webhook), fakes in 2 processes;"
        f" seed {args.seed}"
    )
    print(
        f"load: {args.rate:g} DMs/s (Poisson) for {args.load_s:g} s from {args.users} users,"
        f" at most {args.senders} connections; model {args.model_s[0]:g}-{args.model_s[1]:g} s;"
        f" debounce quiet {DebounceSettings().quiet_ms} ms (shipped)"
    )
    if args.bot_rate is not None:
        print(f"bot-wide limit {args.bot_rate}/s")
    for n, (budget, outcome) in enumerate(runs, 1):
        print(f"\n== run {n}" + ("" if budget is None else f", {budget}"))
        print_table(["figure", "value"], rows(outcome))
        if outcome.exports != (0, 0):
            print(f"  spans received: {outcome.exports[1]} in {outcome.exports[0]} exports")
        if outcome.profile:
            print("\n  py-spy, frames by share of samples (inclusive):")
            for name, share in outcome.profile:
                print(f"  {share:6.1%}  {name}")
    if len(outcomes) > 1:
        rates = [float(rows(o)[2][1]) for o in outcomes if rows(o)[2][1] != "-"]
        print(
            f"\nmedian messages/s acknowledged over {len(outcomes)} runs: "
            f"{statistics.median(rates):.1f}"
        )
    if args.budgets or args.traces:
        print("\nacknowledgement latency by " + ("budget" if args.budgets else "tracing") + " (ms)")
        headers = [
            "variant",
            "p50 by run",
            "p99 by run",
            "p50 median",
            "p99 median",
            "bot CPU ms a message by run",
            "other work (cores) by run",
        ]
        print_table(headers, compared(runs))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.flood",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--rate", type=float, default=150.0, help="DMs per second offered")
    parser.add_argument("--load-s", type=float, default=20.0)
    parser.add_argument("--senders", type=int, default=100, help="connections at most")
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--model-s", type=float, nargs=2, default=[0.2, 1.0], metavar=("LOW", "HIGH")
    )
    parser.add_argument(
        "--budgets",
        nargs="+",
        choices=["off", "replica", "shared"],
        help="run each with each of these outbound budgets, and compare",
    )
    parser.add_argument("--bot-rate", type=int, help="the bot-wide limit, calls a second")
    parser.add_argument(
        "--traces",
        nargs="+",
        choices=["off", "on"],
        help="run each with tracing off and on (every burst sampled), and compare",
    )
    parser.add_argument("--py-spy", help="write the bot's collapsed stacks here (py-spy)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
