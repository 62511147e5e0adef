"""Failover: the time from a primary's kill -9 to the first reply served after it.

    python -m benchmarks.failover [--repeat 3] [--deployments cluster sentinel] [--seed 7]

Two deployments, each started afresh for every repetition by the test suite's harness
(`tests.support.clusters`, imported as `benchmarks/interrupt.py` imports the fake LLM), with its
timings:

- cluster: three primaries, each with a replica, node timeout `CLUSTER_NODE_TIMEOUT_MS`; the
  primary killed is a different one each repetition;
- sentinel: a primary, its replica and three Sentinels, down-after `SENTINEL_DOWN_AFTER_MS`.

Two replica processes (`tests/support/replica.py` through the suite's runner,
`tests.e2e.test_replicas`, with its short timings: quiet 200 ms, max wait 600 ms, lease TTL
1500 ms, sweep 200 ms) are given the deployment's URL (one node's for the cluster, `redis+sentinel://`
for Sentinel) and the suite's fake LLM, answering after `--llm-ms` (200 ms) with the ids of the
messages it covers. A steady trickle (`--rate` messages/s, seeded) from `--users` users goes to
either process at random; after `--warm-s`, once replies flow on the conversations the victim holds,
the primary is killed with SIGKILL. Measured from the kill, per repetition:

- promoted: the replica reported as primary (the cluster: its INFO role; Sentinel: a majority
  of the Sentinels name it), polled every 20 ms;
- first reply: the first reply handed to the platform in a conversation the killed primary
  held (every conversation, with Sentinel). A reply's last step before it is sent is a store
  round trip, so this is the store serving the bots again (up to the one reply whose check
  passed in the instant before the kill);
- new message answered: the first reply covering a message sent after the kill, in one of
  those conversations; it includes that message's own quiet time and LLM time (400 ms).

The table shows the median and the maximum over `--repeat` repetitions. A repetition that
sees no reply within `--within-s` of the kill counts as that long and is marked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.command_line import timed_run
from benchmarks.wakeup import print_table
from tests.support.clusters import (
    CLUSTER_NODE_TIMEOUT_MS,
    SENTINEL_DOWN_AFTER_MS,
    Cluster,
    SentinelSetup,
    Server,
    primary_of,
    start_cluster,
    start_sentinel,
    wait_until,
)
from tests.support.failover import bots, first_reply_after
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.replica_fleet import (
    MAX_WAIT_MS,
    QUIET_MS,
    conversation_of,
    covering_reply,
    message,
    tokens,
)
from tests.support.replica_fleet import Cluster as Bots

DEPLOYMENTS = ("cluster", "sentinel")
REPLICAS = 2
# How long the replicas may take to be ready, and replies to flow before the kill.
READY_S = 30.0


@dataclass(frozen=True)
class Repetition:
    deployment: str
    promoted_s: float | None
    first_reply_s: float | None
    new_message_s: float | None
    messages: int


class Trickle:
    """`rate` messages a second from `users` users, each to either replica at random, each
    delivery in a task of its own (a delivery waits while the store is down)."""

    def __init__(self, replicas: Bots, users: int, rate: float, rng: random.Random) -> None:
        self.replicas = replicas
        self.users = users
        self.rate = rate
        self.rng = rng
        self.counts = [0] * users
        self.sent_at: dict[str, float] = {}  # message id -> when it was handed over
        self.deliveries: set[asyncio.Task[None]] = set()

    async def deliver(self, name: str, user: int) -> None:
        n = self.counts[user]
        self.counts[user] += 1
        msg = message(user, n)
        self.sent_at[msg.message_id] = time.time()
        # Not acknowledged within the runner's bound (10 s): left as it is, still counted.
        with contextlib.suppress(AssertionError):
            await self.replicas.deliver(name, msg)

    async def run(self) -> None:
        while True:
            name = self.rng.choice(self.replicas.names)
            task = asyncio.create_task(self.deliver(name, self.rng.randrange(self.users)))
            self.deliveries.add(task)
            task.add_done_callback(self.deliveries.discard)
            await asyncio.sleep(self.rng.expovariate(self.rate))


def replies_in(replicas: Bots, conversations: set[str]) -> list[tuple[float, list[str]]]:
    return [
        (float(e["t"]), tokens(str(e["text"])))
        for e in replicas.sent()
        if e["conversation"] in conversations
    ]


async def repetition(
    deployment: str, index: int, folder: Path, args: argparse.Namespace, rng: random.Random
) -> Repetition:
    running: Cluster | SentinelSetup
    if deployment == "cluster":
        running = await asyncio.to_thread(start_cluster, folder / "cluster")
        victim_index = index % 3
        victim, heir = running.primaries[victim_index], running.replicas[victim_index]
        cluster = running

        def promoted() -> bool:
            return heir.port in cluster.primary_ports()

        def held(conversation: str) -> bool:
            return primary_of(conversation) == victim_index
    else:
        running = await asyncio.to_thread(start_sentinel, folder / "sentinel")
        victim, heir = running.primary, running.replica
        setup = running

        def promoted() -> bool:
            return setup.master_port() == heir.port

        def held(conversation: str) -> bool:
            return True

    try:
        return await measure(deployment, running.url, victim, promoted, held, folder, args, rng)
    finally:
        running.stop()


async def measure(
    deployment: str,
    url: str,
    victim: Server,
    promoted: Callable[[], bool],
    held: Callable[[str], bool],
    folder: Path,
    args: argparse.Namespace,
    rng: random.Random,
) -> Repetition:
    conversations = {
        conversation_of(f"c{u}m0") for u in range(args.users) if held(conversation_of(f"c{u}m0"))
    }
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        bots(url, fake, folder, size=REPLICAS) as replicas,
    ):
        fake.delay_s = args.llm_ms / 1000
        trickle = Trickle(replicas, args.users, args.rate, rng)
        feeding = asyncio.create_task(trickle.run())
        try:
            await asyncio.sleep(args.warm_s)
            await replicas.wait_for(
                lambda: bool(replies_in(replicas, conversations)),
                READY_S,
                "replies on the victim's conversations",
            )
            killed = time.time()
            victim.kill()

            def promoted_at() -> float | None:
                return time.time() if promoted() else None

            promotion = asyncio.create_task(
                asyncio.to_thread(wait_until, promoted_at, args.within_s, "the promotion")
            )

            def answered_new() -> float | None:
                late = [
                    t
                    for t, covered in replies_in(replicas, conversations)
                    if any(trickle.sent_at.get(m, 0.0) > killed for m in covered)
                ]
                return min(late) - killed if late else None

            with contextlib.suppress(AssertionError):
                await replicas.wait_for(
                    lambda: answered_new() is not None, args.within_s, "a new message answered"
                )
            seen: float | None = None
            with contextlib.suppress(AssertionError):
                seen = float(await promotion)
            return Repetition(
                deployment,
                # When the poll (every 20 ms) first saw it.
                None if seen is None else seen - killed,
                first_reply_after(replicas, killed, conversations),
                answered_new(),
                len(trickle.sent_at),
            )
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, *trickle.deliveries, return_exceptions=True)


async def run(args: argparse.Namespace) -> list[Repetition]:
    rng = random.Random(args.seed)
    results: list[Repetition] = []
    for index in range(args.repeat):
        for deployment in args.deployments:
            folder = Path(tempfile.mkdtemp(prefix="lwf-", dir="/tmp"))
            try:
                results.append(await repetition(deployment, index, folder, args, rng))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    return results


def figure(values: list[float | None], within_s: float) -> list[str]:
    """Median and max, a missing value counted as `within_s` and marked '>'."""
    filled = [within_s if v is None else v for v in values]
    mark = ">" if any(v is None for v in values) else ""
    return [f"{statistics.median(filled):.2f} s", f"{mark}{max(filled):.2f} s"]


def report(results: list[Repetition], args: argparse.Namespace) -> None:
    print(
        f"{REPLICAS} replica processes (tests/support/replica.py), quiet {QUIET_MS} ms, max wait "
        f"{MAX_WAIT_MS} ms, fake LLM {args.llm_ms} ms; a trickle of {args.rate:g} messages/s "
        f"from {args.users} users (seed {args.seed}); the kill after {args.warm_s:g} s"
    )
    print(
        f"cluster: 3 primaries + 3 replicas, node timeout {CLUSTER_NODE_TIMEOUT_MS} ms; "
        f"sentinel: primary + replica + 3 Sentinels, down-after {SENTINEL_DOWN_AFTER_MS} ms"
    )
    print()
    rows = []
    for deployment in args.deployments:
        mine = [r for r in results if r.deployment == deployment]
        if not mine:
            continue
        rows.append(
            [
                deployment,
                str(len(mine)),
                *figure([r.promoted_s for r in mine], args.within_s),
                *figure([r.first_reply_s for r in mine], args.within_s),
                *figure([r.new_message_s for r in mine], args.within_s),
            ]
        )
    print_table(
        [
            "deployment",
            "runs",
            "kill -> promoted, median",
            "max",
            "kill -> first reply, median",
            "max",
            "kill -> new message answered, median",
            "max",
        ],
        rows,
    )
    print("\nper run (s): promoted / first reply / new message answered")
    for r in results:
        cells = [r.promoted_s, r.first_reply_s, r.new_message_s]
        shown = " / ".join("-" if v is None else f"{v:.2f}" for v in cells)
        print(f"  {r.deployment}: {shown} ({r.messages} messages)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--deployments", nargs="+", choices=DEPLOYMENTS, default=list(DEPLOYMENTS))
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--rate", type=float, default=10.0, help="messages per second")
    parser.add_argument("--llm-ms", type=int, default=200)
    parser.add_argument("--warm-s", type=float, default=2.0, help="before the kill")
    parser.add_argument("--within-s", type=float, default=15.0, help="give up after this")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        report(asyncio.run(run(args)), args)


if __name__ == "__main__":
    main()
