"""Ingest throughput: messages per second through `Store.ingest`, next to a raw EVALSHA loop.

    python -m benchmarks.ingest [--messages 10000] [--users 2000] [--concurrency 32] [--repeat 3]

One real server (the embedded one, unix socket, no append-only file). Each row runs 1 or 2
separate OS processes (this module with ``--worker``), each with the client the bot builds
(`bot.store.connect.make_client`: a blocking pool of up to 100 connections) and `--concurrency`
ingests in flight, sharing `--messages` messages between them, round-robin over `--users`
conversations (so both processes write to the same conversations, as replicas behind a load balancer
do):

- lastword: the real `Store.ingest`, the call the runtime makes for every platform message
  (dedupe, rate limit, V, pending, window, due-index, in one script);
- raw: the same number of EVALSHA calls through the same client, settings and concurrency,
  against the same server in the same run, of a trivial script (``INCR`` of one key per
  conversation) that gets the same message JSON as its argument. The JSON is built before the
  clock starts for raw, while `Store.ingest` builds it inside, as the runtime does: raw is
  the floor of one round trip carrying the message with this client.

lastword/raw is the ratio of their throughputs (the goal: at least 0.5). Commands per
message come from the server's `INFO commandstats` before and after each run: client
commands (each one round trip here, none is pipelined) and the commands the scripts ran.

Every run starts from an empty server (FLUSHALL), with fresh message ids; the processes are
started once, warmed up (connections open, scripts loaded) and then told to go together.
Throughput is the messages of all processes over the span from the first process's start to
the last one's end. Rows are interleaved per repetition, so the machine's noise spreads over
all of them; the table shows medians over `--repeat` repetitions, and the range.

Durability: when `StoreSettings` has a `durability` field (levels in `bot.store.durability`),
a lastword row is added per level (`--durability` picks them); without it there is no such
column, and the report says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from redis import Redis as SyncRedis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from benchmarks.command_line import reap, timed_run
from benchmarks.roundtrips import CLIENT_COMMANDS
from benchmarks.wakeup import print_table
from bot.config.settings import InstalledSettings
from bot.message import InboundMessage
from bot.store import Store, StoreSettings
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis, server_binary

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "telegram"
# Telegram-like ids: a chat id of ten digits.
FIRST_CHAT = 5_000_000_000
TEXT = "hey, quick question about the trip on the {n}th, are we still taking the train?"
RAW_SCRIPT = "return redis.call('INCR', KEYS[1])"
# Warm-up ingests per in-flight slot, before the clock: every connection of the pool opened.
WARM_PER_SLOT = 4
# Commands a client sends itself: those of the round trips benchmark, and the durability waits
# a durable step pipelines after its script. Every other command ran inside a script.
SENT_COMMANDS = CLIENT_COMMANDS | {"wait", "waitaof"}
# Commands of ours (the measurement) left out of the counts.
IGNORED = {"info", "flushall"}
# The levels of `LASTWORD_DURABILITY`, if the store has them but does not list them.
ASSUMED_LEVELS = ("fast", "local", "replicated")
# A worker that says nothing for this long is stuck: the run fails rather than hangs.
WORKER_TIMEOUT_S = 60.0


# --- the durability hook -------------------------------------------------------------------


def durability_levels() -> list[str]:
    """The store's durability levels, if `StoreSettings` has a `durability` field; else none."""
    if "durability" not in {f.name for f in dataclasses.fields(StoreSettings)}:
        return []
    try:
        module: Any = importlib.import_module("bot.store.durability")
    except ImportError:
        return list(ASSUMED_LEVELS)
    return [str(level) for level in getattr(module, "LEVELS", ASSUMED_LEVELS)]


def with_durability(settings: StoreSettings, level: str | None) -> StoreSettings:
    """`settings` at durability `level` (None: as they are)."""
    if level is None:
        return settings
    # By name: the field's type (a Literal of the levels) is the store's business.
    changes: dict[str, Any] = {"durability": level}
    return dataclasses.replace(settings, **changes)


# --- a worker process ----------------------------------------------------------------------


def emit(out: IO[str], **fields: Any) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()


def build_messages(
    prefix: str, index: int, processes: int, total: int, users: int
) -> list[InboundMessage]:
    """This process's share of the run: message n goes to conversation n % users."""
    return [
        InboundMessage(
            PLATFORM,
            str(FIRST_CHAT + n % users),
            str(FIRST_CHAT + n % users),
            f"{prefix}-{n}",
            TEXT.format(n=n % 28 + 1),
            timestamp=1_700_000_000.0 + n,
        )
        for n in range(index, total, processes)
    ]


async def in_flight(
    call: Callable[[InboundMessage], Awaitable[object]],
    messages: list[InboundMessage],
    concurrency: int,
) -> None:
    """`call` on every message, `concurrency` at a time."""
    pending = iter(messages)

    async def lane() -> None:
        for message in pending:
            await call(message)

    await asyncio.gather(*(lane() for _ in range(concurrency)))


async def prepare(
    job: dict[str, Any],
    messages: list[InboundMessage],
    store: Store,
    base: StoreSettings,
    raw_script: AsyncScript,
    concurrency: int,
) -> Callable[[InboundMessage], Awaitable[object]]:
    """The call a job makes per message, warmed up: every connection of the pool open, the
    script loaded, the durability probed."""
    warm = build_messages(
        "warm-" + job["prefix"], job["index"], 1, WARM_PER_SLOT * concurrency, job["users"]
    )
    if job["kind"] == "lastword":
        level = job.get("durability")
        store.configure(with_durability(base, level))
        if level is not None:
            # Probed afresh: the parent configured the server for this level.
            await store.durability.prepare(level)
        await in_flight(store.ingest, warm, concurrency)
        return store.ingest
    # Built before the clock starts, unlike Store.ingest's: see the module's docstring.
    payloads = {m.message_id: m.to_json() for m in [*warm, *messages]}

    async def raw(message: InboundMessage) -> Any:
        key = f"raw:{message.conversation}"
        return await raw_script(keys=[key], args=[payloads[message.message_id]])

    await in_flight(raw, warm, concurrency)
    return raw


async def worker(url: str, concurrency: int) -> None:
    """Runs the jobs its parent sends on stdin, one JSON line each: build the messages, warm
    up, say "ready", wait for "go", run, say "done" with the span and the count."""
    redis = make_client(url)
    settings = InstalledSettings(platform="console", redis_url=url, log_level="WARNING")
    base = StoreSettings.of(settings)
    store = Store(redis, base)
    raw_script = redis.register_script(RAW_SCRIPT)
    out = sys.stdout
    emit(out, event="started", pid=os.getpid())
    try:
        for line in sys.stdin:
            job = json.loads(line)
            if job["kind"] == "stop":
                break
            messages = build_messages(
                job["prefix"], job["index"], job["processes"], job["messages"], job["users"]
            )
            try:
                call = await prepare(job, messages, store, base, raw_script, concurrency)
            except Exception as exc:
                emit(out, event="failed", error=f"{type(exc).__name__}: {exc}")
                continue
            emit(out, event="ready")
            if sys.stdin.readline().strip() != "go":
                continue  # another worker failed: this run is off
            started = time.time()
            await in_flight(call, messages, concurrency)
            emit(out, event="done", start=started, end=time.time(), count=len(messages))
    finally:
        await redis.aclose()


# --- the parent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    processes: int
    kind: str  # "lastword" or "raw"
    durability: str | None = None

    @property
    def label(self) -> str:
        return "raw EVALSHA" if self.kind == "raw" else "lastword"


@dataclass(frozen=True)
class Run:
    case: Case
    rate: float  # messages per second, all processes together
    client_commands: float  # per message
    script_commands: float  # per message
    evalsha: float  # per message
    refused: str = ""  # the run could not be made: why


class Workers:
    """The worker processes, started once and reused for every run."""

    def __init__(self, url: str, count: int, concurrency: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LASTWORD_")}
        env["PYTHONPATH"] = str(ROOT)
        command = [sys.executable, "-m", "benchmarks.ingest", "--worker", "--url", url]
        command += ["--concurrency", str(concurrency)]
        self.processes = [
            subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
            )
            for _ in range(count)
        ]
        for process in self.processes:
            self.expect(process, "started")

    @staticmethod
    def expect(process: subprocess.Popen[str], *events: str) -> dict[str, Any]:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker exited (code {process.wait()}) before {events}")
        reply: dict[str, Any] = json.loads(line)
        if reply.get("event") not in events:
            raise RuntimeError(f"a worker said {reply}, expected one of {events}")
        return reply

    @staticmethod
    def send(process: subprocess.Popen[str], text: str) -> None:
        assert process.stdin is not None
        process.stdin.write(text + "\n")
        process.stdin.flush()

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError):
                self.send(process, json.dumps({"kind": "stop"}))
        for process in self.processes:
            reap(process, 10)


def command_calls(admin: SyncRedis) -> dict[str, int]:
    stats: dict[str, Any] = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


class Servers:
    """The one server every run uses (append-only file on, fsync every second, as the
    embedded store runs), and a replica attached only for the `replicated` runs."""

    def __init__(self, folder: Path) -> None:
        self.primary = EmbeddedRedis(folder / "primary", port=free_port())
        self.replica = EmbeddedRedis(folder / "replica", port=free_port(), appendonly=False)

    def start(self) -> None:
        self.primary.start()
        self.admin = SyncRedis(unix_socket_path=str(self.primary.socket))
        try:
            self.admin.execute_command("WAITAOF", 0, 0, 0)  # type: ignore[no-untyped-call]
            self.waitaof = True
        except ResponseError:
            self.waitaof = False
        self.replica_admin: SyncRedis | None = None

    def stop(self) -> None:
        self.admin.close()
        if self.replica_admin is not None:
            self.replica_admin.close()
            self.replica.stop()
        self.primary.stop()

    @contextlib.contextmanager
    def configured(self, level: str | None) -> Iterator[str]:
        """The server as `level` needs it for one run; says how, for the report."""
        how: list[str] = []
        if level in ("local", "replicated") and not self.waitaof:
            # What the store would ask of its own embedded server (no WAITAOF before 7.2).
            self.admin.config_set("appendfsync", "always")
            how.append("appendfsync always (no WAITAOF on this server)")
        if level == "replicated":
            self.attach_replica()
            how.append("one replica attached")
        try:
            yield ", ".join(how)
        finally:
            if level == "replicated" and self.replica_admin is not None:
                self.replica_admin.replicaof("NO", "ONE")
            self.admin.config_set("appendfsync", "everysec")

    def attach_replica(self) -> None:
        if self.replica_admin is None:
            self.replica.start()
            self.replica_admin = SyncRedis(unix_socket_path=str(self.replica.socket))
        self.replica_admin.replicaof("127.0.0.1", self.primary.port)
        deadline = time.monotonic() + 10
        while self.replica_admin.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync within 10 s")
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def one_run(
    servers: Servers, workers: Workers, case: Case, args: argparse.Namespace, prefix: str
) -> Run:
    admin = servers.admin
    admin.flushall()
    chosen = workers.processes[: case.processes]
    with servers.configured(case.durability):
        for index, process in enumerate(chosen):
            job = {
                "kind": case.kind,
                "durability": case.durability,
                "prefix": prefix,
                "index": index,
                "processes": case.processes,
                "messages": args.messages,
                "users": args.users,
            }
            workers.send(process, json.dumps(job))
        replies = [workers.expect(process, "ready", "failed") for process in chosen]
        refused = [str(r["error"]) for r in replies if r["event"] == "failed"]
        if refused:
            for process, reply in zip(chosen, replies, strict=True):
                if reply["event"] == "ready":
                    workers.send(process, "skip")
            return Run(case, math.nan, math.nan, math.nan, math.nan, refused=refused[0])
        before = command_calls(admin)
        for process in chosen:
            workers.send(process, "go")
        done = [workers.expect(process, "done") for process in chosen]
        after = command_calls(admin)
    delta = {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if name not in IGNORED and calls != before.get(name, 0)
    }
    count = sum(int(d["count"]) for d in done)
    span = max(float(d["end"]) for d in done) - min(float(d["start"]) for d in done)
    client = sum(n for name, n in delta.items() if name in SENT_COMMANDS)
    script = sum(n for name, n in delta.items() if name not in SENT_COMMANDS)
    return Run(case, count / span, client / count, script / count, delta.get("evalsha", 0) / count)


def cases(args: argparse.Namespace) -> list[Case]:
    found: list[Case] = []
    for processes in args.processes:
        levels: list[str | None] = list(args.durability) or [None]
        found.extend(Case(processes, "lastword", level) for level in levels)
        found.append(Case(processes, "raw"))
    return found


@dataclass(frozen=True)
class Context:
    version: str
    waitaof: bool


def run(args: argparse.Namespace) -> tuple[list[Run], Context]:
    runs: list[Run] = []
    folder = Path(tempfile.mkdtemp(prefix="lw-bench-", dir="/tmp"))
    servers = Servers(folder)
    servers.start()
    try:
        workers = Workers(servers.primary.url, max(args.processes), args.concurrency)
        try:
            info: dict[str, Any] = servers.admin.info("server")
            context = Context(
                str(info.get("valkey_version") or info.get("redis_version")), servers.waitaof
            )
            for repetition in range(args.repeat):
                for number, case in enumerate(cases(args)):
                    runs.append(one_run(servers, workers, case, args, f"r{repetition}c{number}"))
        finally:
            workers.close()
    finally:
        servers.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return runs, context


def report(runs: list[Run], context: Context, args: argparse.Namespace) -> None:
    print(
        f"server: {Path(server_binary()).name} {context.version} (embedded, unix socket, "
        "append-only file with fsync every second)"
    )
    print(
        f"cpus: {os.cpu_count()}; {args.messages:,} messages per run over {args.users:,} "
        f"conversations; {args.concurrency} in flight per process; "
        f"medians of {args.repeat} repetitions, range in brackets"
    )
    if args.durability:
        how = "WAITAOF" if context.waitaof else "appendfsync always for its run (no WAITAOF)"
        print(
            f"durability: local: {how}; replicated: that, plus a replica attached for its run "
            "and WAIT 1. Their ratio is to the same raw row (server as it is)"
        )
    else:
        print(
            "durability: no column; StoreSettings has no `durability` field, so the lastword "
            "rows run the store as it is"
        )
    print()
    rows: list[list[str]] = []
    for case in cases(args):
        mine = [r for r in runs if r.case == case]
        label = [str(case.processes), case.label]
        if args.durability:
            label.append(case.durability or "-")
        refused = next((r.refused for r in mine if r.refused), "")
        if refused:
            rows.append([*label, "refused", "", "", "", "", ""])
            print(f"{case.label} {case.durability} x{case.processes} refused: {refused}")
            continue
        rates = [r.rate for r in mine]
        if case.kind == "raw":
            ratio = "1"
        else:
            raw = [r.rate for r in runs if r.case == Case(case.processes, "raw")]
            # Per repetition, against the raw run made next to it.
            ratio = f"{statistics.median([m / r for m, r in zip(rates, raw, strict=True)]):.2f}"
        rows.append(
            [
                *label,
                f"{statistics.median(rates):,.0f}",
                f"[{min(rates):,.0f}-{max(rates):,.0f}]",
                ratio,
                f"{statistics.median([r.client_commands for r in mine]):.2f}",
                f"{statistics.median([r.evalsha for r in mine]):.2f}",
                f"{statistics.median([r.script_commands for r in mine]):.2f}",
            ]
        )
    headers = ["processes", "design"]
    if args.durability:
        headers.append("durability")
    headers += ["msg/s", "range", "lastword/raw", "commands sent/msg", "EVALSHA/msg"]
    headers.append("in-script cmds/msg")
    print_table(headers, rows)
    print(
        "\ncommands sent/msg: commands the clients sent, per message (commandstats). Each is one"
        "\nround trip, except that a durable step pipelines WAITAOF/WAIT after its script: then"
        "\none round trip carries them all. In-script commands run inside the script and cost"
        "\nno round trip."
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ingest")
    parser.add_argument("--messages", type=int, default=10_000, help="messages per run")
    parser.add_argument("--users", type=int, default=2000, help="conversations")
    parser.add_argument("--concurrency", type=int, default=32, help="in flight per process")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--durability",
        nargs="*",
        default=None,
        help="levels to add a lastword row for (default: all the store has, if any)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.durability is None:
        args.durability = durability_levels()
    elif args.durability and not durability_levels():
        parser.error("--durability: StoreSettings has no durability field")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        asyncio.run(worker(args.url, args.concurrency))
        return
    with timed_run():
        runs, context = run(args)
        report(runs, context, args)


if __name__ == "__main__":
    main()
