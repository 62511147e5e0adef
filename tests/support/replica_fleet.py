"""Replica processes (tests/support/replica.py) on one store, the workload they are given and
the checks of the invariants on what they answered."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from redis.asyncio import Redis

from bot.message import InboundMessage
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message as build_message
from tests.support.core_waits import CoreWaits
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.forked import Forked, spawn
from tests.support.running import clean_environ
from tests.support.waits import eventually

ROOT = Path(__file__).resolve().parents[2]


SEED = 20240611


# The replicas' timings. Short, so failures and recoveries happen within seconds, but with the
# same proportions as production: quiet < max_wait < lease TTL.
QUIET_MS = 200


MAX_WAIT_MS = 600


TTL_MS = 1500


SWEEP_MS = 200


# The fake LLM's thinking time: long enough that messages sometimes land mid-generation.
LLM_DELAY_S = 0.05


# What one LLM call may take end to end: the fake's delay plus the client's own overhead.
LLM_TIME_MS = 300


# Three replicas, the server and the test share two cores in CI; allow for scheduling delays.
SLACK_MS = 1000


I3_BOUND_S = (MAX_WAIT_MS + LLM_TIME_MS + TTL_MS + SWEEP_MS + SLACK_MS) / 1000


TOKEN = re.compile(r"\bc\d+m\d+\b")


PLATFORM = "pipe"


Event = dict[str, Any]


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def covering_reply(request: RecordedRequest) -> str:
    """The fake LLM's answer: the tokens of the messages it was asked to answer, in order."""
    return "covers " + " ".join(tokens(request.last_user_text))


def conversation_of(token: str) -> str:
    return f"{PLATFORM}:{token[1 : token.index('m')]}"


def message(conv: int, n: int) -> InboundMessage:
    """Message `n` of conversation `conv`, carrying its token (`c<conv>m<n>`), also its id."""
    token = f"c{conv}m{n}"
    return build_message(
        f"about {token}, please",
        conversation=f"{PLATFORM}:{conv}",
        user=f"u{conv}",
        message_id=token,
    )


def replica_env(name: str, redis_url: str, llm_url: str, workdir: Path) -> dict[str, str]:
    return clean_environ() | {
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "LASTWORD_REDIS_URL": redis_url,
        "LASTWORD_DATA_DIR": str(workdir / "data"),
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": llm_url,
        "LASTWORD_LLM__API_KEY": name,
        "LASTWORD_LLM__TIMEOUT_S": "10",
        "LASTWORD_LLM__RETRIES": "2",
        "LASTWORD_LLM__RETRY_BASE_S": "0.05",
        "LASTWORD_DEBOUNCE__QUIET_MS": str(QUIET_MS),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(MAX_WAIT_MS),
        "LASTWORD_LEASE__TTL_MS": str(TTL_MS),
        "LASTWORD_SWEEP_INTERVAL_MS": str(SWEEP_MS),
        # Every entry must stay visible for the history check.
        "LASTWORD_HISTORY_CAP": "1000",
    }


def process_state(pid: int) -> str:
    """The kernel's view of a process (running, sleeping, stopped, zombie), for diagnostics."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "gone"
    return next((line for line in status.splitlines() if line.startswith("State")), "?")


@dataclass
class Replica:
    name: str
    process: asyncio.subprocess.Process | Forked
    log_path: Path
    reader: asyncio.Task[None] | None = None


class Cluster:
    """Replica processes and everything they printed, in arrival order."""

    def __init__(
        self,
        server: EmbeddedRedis,
        fake: FakeOpenAI,
        workdir: Path,
        size: int,
        env: dict[str, str] | None = None,
    ) -> None:
        self.server = server
        self.fake = fake
        self.workdir = workdir
        self.size = size
        # Settings on top of the replicas' defaults, for one test's needs.
        self.env = env or {}
        self.replicas: dict[str, Replica] = {}
        self.events: list[Event] = []
        self.ingested: dict[tuple[str, str], Event] = {}
        self._changed = asyncio.Event()
        # What the replicas, their server and this process (the fake provider's) waited for
        # a core: the machine's part of each reply's latency (I3).
        self.core_waits = CoreWaits(self._pids)

    def _pids(self) -> list[int]:
        server = getattr(self.server, "process", None)
        return [r.process.pid for r in self.replicas.values()] + ([server.pid] if server else [])

    @property
    def names(self) -> list[str]:
        return sorted(self.replicas)

    def alive(self) -> list[str]:
        return [n for n in self.names if self.replicas[n].process.returncode is None]

    async def __aenter__(self) -> Cluster:
        self.core_waits.start()
        try:
            for index in range(self.size):
                await self._spawn(f"r{index}")
            await self.wait_for(
                lambda: {e["replica"] for e in self.of("ready")} == set(self.replicas),
                timeout=30,
                what="every replica to be ready",
            )
        except BaseException:
            await self.close()
            print(self.diagnostics())
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
        if exc is not None:
            # Shown by pytest with the failure: what each replica logged.
            print(self.diagnostics())

    async def _spawn(self, name: str) -> None:
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log_file:
            # Forked from the zygote (`tests.support.forked`): a replica's own start, not
            # a second of CPU importing lastword and the OpenAI client again.
            process = await spawn(
                module="tests.support.replica",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                env=replica_env(name, self.server.url, self.fake.base_url, self.workdir) | self.env,
                # Away from the repository, so no .env or lastword.toml there is picked up.
                cwd=self.workdir,
            )
        replica = Replica(name, process, log_path)
        self.replicas[name] = replica
        replica.reader = asyncio.create_task(self._read(replica), name=f"read {name}")

    async def _read(self, replica: Replica) -> None:
        assert replica.process.stdout is not None
        async for line in replica.process.stdout:
            try:
                event: Event = json.loads(line)
            except ValueError:
                # Not ours (a library printing to stdout): keep it for the diagnostics.
                event = {"event": "noise", "line": line.decode(errors="replace")}
            event.setdefault("replica", replica.name)
            self.events.append(event)
            if event["event"] == "ingested":
                self.ingested[(replica.name, event["message_id"])] = event
            self._notify()
        self.events.append({"event": "eof", "replica": replica.name})
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:  # noqa: ASYNC109
        """Wait until `predicate` holds; it is re-checked whenever a replica prints a line."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None

    def of(self, kind: str, replica: str | None = None) -> list[Event]:
        return [e for e in self.events if e["event"] == kind and replica in (None, e["replica"])]

    def sent(self, conversation: str | None = None) -> list[Event]:
        return [e for e in self.of("sent") if conversation in (None, e["conversation"])]

    def covered(self) -> set[str]:
        return {token for e in self.sent() for token in tokens(e["text"])}

    def stats(self, replica: str) -> Event:
        reports = self.of("stats", replica)
        return reports[-1] if reports else {}

    async def deliver(self, name: str, msg: InboundMessage, within_s: float = 10) -> bool:
        """Hand `msg` to replica `name` as its platform would; True if it was accepted. The
        replica retries while the store is unavailable: `within_s` must cover any outage the
        test causes."""
        stdin = self.replicas[name].process.stdin
        assert stdin is not None
        stdin.write(msg.to_json().encode() + b"\n")
        await stdin.drain()
        key = (name, msg.message_id)
        await self.wait_for(
            lambda: key in self.ingested or bool(self.of("eof", name)),
            within_s,
            f"{name} to ingest {key[1]}",
        )
        assert key in self.ingested, f"{name} exited before ingesting {key[1]}"
        return bool(self.ingested[key]["accepted"])

    def signal(self, name: str, signum: int) -> None:
        self.replicas[name].process.send_signal(signum)

    async def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        await self.replicas[name].process.wait()

    async def terminate(self, name: str) -> int:
        """Stop a replica the way systemd would; returns its exit status."""
        replica = self.replicas[name]
        self.signal(name, signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                code = await replica.process.wait()
                if replica.reader is not None:
                    await replica.reader
        except TimeoutError:
            state = process_state(replica.process.pid)
            if replica.process.returncode is None:
                self.signal(name, signal.SIGUSR1)
                self.signal(name, signal.SIGUSR2)
                # Deliberate: give it a moment to write where it is stuck into its log.
                await asyncio.sleep(0.5)
            raise AssertionError(
                f"{name} did not stop within 10s of SIGTERM: {state}, "
                f"returncode {replica.process.returncode}"
            ) from None
        return code

    async def terminate_all(self, names: Iterable[str] | None = None) -> None:
        """Stop every replica (or those named), each of which must exit cleanly."""
        for name in self.names if names is None else names:
            assert await self.terminate(name) == 0, f"{name} did not stop cleanly"

    async def close(self) -> None:
        await self.core_waits.stop()
        for replica in self.replicas.values():
            if replica.process.returncode is None:
                # SIGKILL also ends a process that is stopped with SIGSTOP.
                replica.process.kill()
            if replica.reader is not None:
                replica.reader.cancel()
                await asyncio.gather(replica.reader, return_exceptions=True)
        for replica in self.replicas.values():
            try:
                async with asyncio.timeout(10):
                    await replica.process.wait()
            except TimeoutError:
                print(f"{replica.name}: no exit status 10s after SIGKILL")

    def diagnostics(self) -> str:
        out = []
        for replica in self.replicas.values():
            lines = replica.log_path.read_text(errors="replace").splitlines()
            out.append(f"--- {replica.name} (last lines of its log)\n" + "\n".join(lines[-150:]))
        return "\n".join(out)


async def quiescent(redis: Redis, conversations: Iterable[str]) -> bool:
    """Nothing owed, held, half-sent or scheduled for any of `conversations`."""
    return not await loose_ends(redis, conversations)


async def loose_ends(redis: Redis, conversations: Iterable[str]) -> list[str]:
    """What is still owed, held, half-sent or scheduled for `conversations`, if anything."""
    left: list[str] = []
    for conversation in conversations:
        k = Keys(conversation)
        v, w = await redis.hmget(k.state, ["v", "w"])
        if v != w:
            left.append(f"{conversation}: V={v and int(v)} W={w and int(w)}")
        left += [
            f"{conversation}: {key} exists"
            for key in (k.lease, k.outbox)
            if await redis.exists(key)
        ]
        if (due := await redis.zscore(k.due, conversation)) is not None:
            left.append(f"{conversation}: due at {due:.0f}")
    return left


async def quiet(redis: Redis, conversations: Iterable[str], within_s: float) -> None:
    """Wait until the store is quiet for `conversations`; fails listing what is left."""
    names = sorted(conversations)
    await eventually(
        lambda: quiescent(redis, names),
        within_s,
        what=f"the store going quiet for {names}",
        describe=lambda: loose_ends(redis, names),
    )


def accepted_times(cluster: Cluster) -> dict[str, float]:
    """When each message was taken in. Asserts that, among all deliveries of one message to
    any replicas, exactly one was accepted (the others were dropped as redeliveries)."""
    by_message: dict[str, list[Event]] = {}
    for event in cluster.of("ingested"):
        by_message.setdefault(event["message_id"], []).append(event)
    times = {}
    for message_id, events in by_message.items():
        accepted = [e for e in events if e["accepted"]]
        assert len(accepted) == 1, f"{message_id} accepted {len(accepted)} times: {events}"
        times[message_id] = float(accepted[0]["t"])
    return times


@dataclass(frozen=True)
class Reply:
    replica: str
    text: str
    version: int
    t: float
    fence: int  # of the lease that passed the pre-send check

    @property
    def tokens(self) -> list[str]:
        return tokens(self.text)


async def check_conversation(
    redis: Redis,
    conversation: str,
    accepted: dict[str, float],
    sent: list[Event],
    *,
    since: float = 0.0,
    core_waits: CoreWaits | None = None,
) -> list[Reply]:
    """Assert I1, I3, I4 (from the fences), I5 and I6 for one conversation; returns its
    replies in delivery order.

    `accepted` maps this conversation's message ids to when they were accepted; latency for
    I3 is counted from that moment, or from `since` if later (the end of a deliberate hold),
    and may exceed the bound by what the processes `core_waits` follows waited for a core
    meanwhile (`tests.support.core_waits`).
    """
    replies: list[Reply] = []
    keys = [e["key"] for e in sent]
    assert len(keys) == len(set(keys)), f"{conversation}: a reply part went out twice: {keys}"
    for event in sorted(sent, key=lambda e: float(e["t"])):
        # <conversation>:<version>:<part>:<fence>:<token salt> (bot.core.cycle.idempotency_key)
        conv, version, part, fence, _ = str(event["key"]).rsplit(":", 4)
        assert conv == conversation
        # Replies here are far below the platform limit, so each is exactly one part.
        assert part == "0", f"{conversation}: unexpected split reply {event}"
        replies.append(
            Reply(event["replica"], event["text"], int(version), float(event["t"]), int(fence))
        )

    # I1: versions strictly increase, and no message is covered twice.
    versions = [r.version for r in replies]
    assert versions == sorted(set(versions)), f"{conversation}: versions {versions}"
    covered = [token for r in replies for token in r.tokens]
    assert len(covered) == len(set(covered)), f"{conversation}: covered twice: {covered}"

    await check_fences(redis, conversation, replies)

    # I3: every accepted message covered, nothing else, and in time.
    assert set(covered) == set(accepted), (
        f"{conversation}: covered {sorted(covered)}, accepted {sorted(accepted)}"
    )
    for reply in replies:
        for token in reply.tokens:
            start = max(accepted[token], since)
            latency = reply.t - start
            waited = core_waits.between(start, reply.t) if core_waits is not None else 0.0
            assert latency <= I3_BOUND_S + waited, (
                f"{conversation}: {token} answered after {latency:.2f}s > {I3_BOUND_S}s "
                f"+ {waited:.2f}s waited for a core"
            )

    # I5: V counts distinct messages, however often they were delivered; all answered.
    raw_v, raw_w = await redis.hmget(Keys(conversation).state, ["v", "w"])
    v, w = int(raw_v or 0), int(raw_w or 0)
    assert v == len(accepted), f"{conversation}: V={v} for {len(accepted)} messages"
    assert w == v, f"{conversation}: W={w} but V={v}"

    # I6: the history is every answered message then its reply, in order, as delivered.
    history = [json.loads(raw) for raw in await redis.lrange(Keys(conversation).history, 0, -1)]
    groups: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    users: list[dict[str, Any]] = []
    for entry in history:
        if entry["role"] == "user":
            users.append(entry)
        else:
            groups.append((users, entry))
            users = []
    assert not users, f"{conversation}: answered messages without a reply in history: {users}"
    user_versions = [u["v"] for g, _ in groups for u in g]
    assert user_versions == list(range(1, len(accepted) + 1)), (
        f"{conversation}: history user versions {user_versions}"
    )
    assert len(groups) == len(replies), f"{conversation}: {len(groups)} in history, {replies}"
    for (group, answer), reply in zip(groups, replies, strict=True):
        assert answer["text"] == reply.text
        assert answer["v"] == reply.version == group[-1]["v"]
        # The reply covers exactly the messages it follows, folded in arrival order.
        assert reply.tokens == [u["message"]["message_id"] for u in group]
    return replies


async def check_fences(redis: Redis, conversation: str, replies: list[Reply]) -> None:
    """I4 from the store's fences: in the order they went out, the replies' fences strictly
    increase (one lease per reply; no holder sent after a newer lease was granted, which is
    what the fence is for), and the store granted every one of them."""
    fences = [r.fence for r in replies]
    assert fences == sorted(set(fences)), f"{conversation}: fences in send order {fences}"
    granted = int(await redis.hget(Keys(conversation).state, "fence") or 0)
    assert all(0 < f <= granted for f in fences), f"{conversation}: {fences}, granted {granted}"


async def check_replies(
    cluster: Cluster, redis: Redis, conversation: str, *, since: float = 0.0
) -> list[Reply]:
    """`check_conversation` for one conversation, with every message of it the cluster took
    in and every reply to it the cluster sent."""
    accepted = accepted_times(cluster)
    return await check_conversation(
        redis,
        conversation,
        {m: t for m, t in accepted.items() if conversation_of(m) == conversation},
        cluster.sent(conversation),
        since=since,
        core_waits=cluster.core_waits,
    )


async def settle(
    cluster: Cluster,
    redis: Redis,
    messages: Iterable[str],
    timeout: float,  # noqa: ASYNC109
) -> None:
    """Wait until every message is covered by a delivered reply and the store is quiet: after
    that, no replica has any reason to send anything more."""
    wanted = set(messages)
    try:
        await cluster.wait_for(lambda: wanted <= cluster.covered(), timeout, "replies")
    except AssertionError as exc:
        missing = sorted(wanted - cluster.covered())
        raise AssertionError(f"{exc}: never answered: {missing}") from None
    conversations = {conversation_of(m) for m in wanted}
    # A replica that lost a race for the lease looks again when it would expire.
    await quiet(redis, conversations, within_s=(TTL_MS + SWEEP_MS) / 1000 + 5)


@dataclass(frozen=True)
class Step:
    gap_s: float  # pause before this message, as the user typed
    message: InboundMessage
    targets: tuple[str, ...]  # replicas the platform delivers it to; more than one = redelivery


# The replicas' settings for `plan_workload`: its bursts may follow each other 0.1 s apart, so
# a user may never pause long enough for the reply to go between them, and each burst then
# interrupts the last one's generation. I3's bound holds for such a user only through the
# starvation guard, here at the window's cap plus a generation: at the default (30 s) the
# reply waits for a pause, and a loaded machine, slower to generate, chained the interruptions
# past the bound (CI: 16 messages over 4 s, the first answered after 4.2 s).
WORKLOAD_ENV = {"LASTWORD_STARVATION_AGE_MS": str(MAX_WAIT_MS + LLM_TIME_MS)}


def plan_workload(rng: random.Random, names: list[str], conversations: int) -> list[list[Step]]:
    """Bursts of 1-5 messages per conversation. Gaps inside a burst straddle `quiet` (some
    extend the window, some let it close); gaps between bursts straddle `max_wait`. One
    message in five is redelivered to a second replica."""
    quiet, cap = QUIET_MS / 1000, MAX_WAIT_MS / 1000
    plans = []
    for conv in range(conversations):
        steps = []
        n = 0
        for burst in range(rng.randint(2, 4)):
            gap = rng.uniform(0.1, 1.5 * cap) if burst else rng.uniform(0, 0.3)
            for index in range(rng.randint(1, 5)):
                if index:
                    gap = rng.uniform(0.01, 0.8 * quiet) if rng.random() < 0.7 else quiet * 1.3
                n += 1
                targets = [rng.choice(names)]
                if rng.random() < 0.2:
                    targets.append(rng.choice([name for name in names if name != targets[0]]))
                steps.append(Step(gap, message(conv, n), tuple(targets)))
        plans.append(steps)
    return plans
