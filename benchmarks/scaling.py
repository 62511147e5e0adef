"""Replies per second end to end with 1, 2 and 4 replica processes, on one server and on a
3-primary Redis Cluster.

    python -m benchmarks.scaling [--users 2000] [--replicas 1 2 4] [--deployments server cluster]

The workload (seeded): `--users` users, each sending one burst of 1 to 3 messages within
`--burst-s` (0.4 s), the bursts' first messages spread over `--spread-s` (1 s): far more than
one replica answers in that time, so the replicas run saturated and the reply rate is their
capacity. Each delivery goes to one of the replica processes at random, as behind a load
balancer; no redelivery.

The replicas are `benchmarks/baseline.py`'s lastword side (that module with
``--worker lastword``), unchanged: the real runtime, the echo model with a `--llm-ms` (200 ms)
delay as the fake LLM, an outbound that records each reply's time, ingests in tasks of their
own at the planned times. The deployments:

- server: one real server (the embedded one, unix socket);
- cluster: three primaries, each with a replica (`tests.support.clusters.start_cluster`, the test
  suite's harness, imported as `benchmarks/interrupt.py` imports the fake LLM); the bots are
  given one node's URL and find the cluster themselves (`bot.store.connect`).

Each run starts from an empty store (FLUSHALL on every primary). Per run the table shows:

- replies/s: the replies sent over the span from the first reply to the last, so the quiet
  time before the first one plays no part; ratio: to the 1-replica row of the same deployment;
- last message -> reply, p50 / p95: from a burst's last message's planned delivery to the
  reply covering it being handed to the platform (the floor is quiet + LLM time);
- unanswered: bursts with no reply covering their last message when the run ended
  (`--settle-s` after the last delivery); a run with any is too short to count.

The two cores are shared by the replicas, the servers and this process: past 2 replicas the
processes compete for CPU, which the ratio shows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis as SyncRedis

from benchmarks.baseline import (
    ROOT,
    TOKEN,
    Delivery,
    read_line,
)
from benchmarks.command_line import timed_run
from benchmarks.wakeup import print_table
from bot.store.embedded import EmbeddedRedis
from tests.support.clusters import start_cluster
from tests.support.running import clean_environ

DEPLOYMENTS = ("server", "cluster")
# Each delivery draws a lane; with n replicas it goes to lane % n, so that every replica count
# dividing it splits the same workload evenly.
LANES = 12
# Between the plan's hand-over and the first delivery: the workers start their runtimes (on a
# cluster they read the slot map first).
START_DELAY_S = 1.0
# How long after the run's end the workers have to stop and report before they are killed.
STOP_GRACE_S = 15.0
CONVERSATION = re.compile(r"\bbench:\d+")


@dataclass(frozen=True)
class Run:
    deployment: str
    replicas: int
    bursts: int
    replies: int
    unanswered: int
    span_s: float
    latencies: list[float]
    crashed: int  # workers that exited, or were killed, without their report
    problems: dict[str, int]  # what the workers logged at WARNING or above, by kind

    @property
    def rate(self) -> float:
        return (self.replies - 1) / self.span_s if self.span_s > 0 else 0.0


def workload(args: argparse.Namespace) -> list[Delivery]:
    rng = random.Random(args.seed)
    deliveries: list[Delivery] = []
    for user in range(args.users):
        start = rng.uniform(0, args.spread_s)
        size = rng.randint(1, 3)
        times = [start, *sorted(start + rng.uniform(0, args.burst_s) for _ in range(size - 1))]
        for n, at in enumerate(times):
            deliveries.append(Delivery(at, user, 0, n, f"u{user}b0m{n}", rng.randrange(LANES)))
    return sorted(deliveries, key=lambda d: d.at)


def start_workers(
    count: int, url: str, args: argparse.Namespace, logs: Path
) -> list[subprocess.Popen[str]]:
    """`count` of baseline.py's lastword workers on `url`, each logging to a file in `logs`."""
    env = clean_environ() | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "benchmarks.baseline", "--worker", "lastword", "--url", url]
    command += ["--quiet-ms", str(args.quiet_ms), "--max-wait-ms", str(args.max_wait_ms)]
    command += ["--llm-ms", str(args.llm_ms)]
    processes = []
    for index in range(count):
        with (logs / f"worker{index}.log").open("w") as log:
            processes.append(
                subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=env,
                    cwd=ROOT,
                )
            )
    return processes


def problems(logs: Path) -> dict[str, int]:
    """What the workers logged (warnings and errors: the worker configures no logging, so
    Python prints their bare messages) by kind, conversations' names left out; a traceback
    counts once, by its last line."""
    kinds: dict[str, int] = {}
    for log in logs.glob("worker*.log"):
        in_traceback = False
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("Traceback"):
                in_traceback = True
                continue
            if line.startswith((" ", "Task exception was never retrieved", "future: ")):
                continue
            kind = CONVERSATION.sub("<c>", line)[:80]
            if in_traceback:
                kind, in_traceback = f"raised {kind}", False
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def run_once(
    deployment: str,
    url: str,
    count: int,
    deliveries: list[Delivery],
    args: argparse.Namespace,
    folder: Path,
) -> Run:
    logs = folder / f"{deployment}-{count}"
    logs.mkdir()
    processes = start_workers(count, url, args, logs)
    reports: list[dict[str, Any]] = []
    crashed = 0
    try:
        for process in processes:
            read_line(process)  # ready
        t0 = time.time() + START_DELAY_S
        end = t0 + deliveries[-1].at + args.settle_s
        for index, process in enumerate(processes):
            mine = [[d.at, d.message().to_json()] for d in deliveries if d.process % count == index]
            assert process.stdin is not None
            process.stdin.write(json.dumps({"t0": t0, "end": end, "deliveries": mine}) + "\n")
            process.stdin.flush()
        # A worker that has not reported `STOP_GRACE_S` after the end is killed: its report
        # is lost, and the run says so.
        timer = threading.Timer(end + STOP_GRACE_S - time.time(), kill_all, [processes])
        timer.start()
        try:
            for process in processes:
                try:
                    reports.append(read_line(process))
                except RuntimeError:
                    crashed += 1
        finally:
            timer.cancel()
    finally:
        kill_all(processes)
    # A reply's parts share its key; it is sent when its first part is.
    replies: dict[str, tuple[float, set[str]]] = {}
    for report in reports:
        for key, text, at in report["sent"]:
            first, tokens = replies.get(key, (float(at), set()))
            replies[key] = (min(first, float(at)), tokens | set(TOKEN.findall(text)))
    answered: dict[str, float] = {}
    for at, tokens in replies.values():
        for token in tokens:
            answered[token] = min(at, answered.get(token, at))
    last: dict[int, Delivery] = {}
    for d in deliveries:
        if d.user not in last or d.seq > last[d.user].seq:
            last[d.user] = d
    latencies = [answered[d.token] - (t0 + d.at) for d in last.values() if d.token in answered]
    times = sorted(at for at, _ in replies.values())
    return Run(
        deployment=deployment,
        replicas=count,
        bursts=len(last),
        replies=len(replies),
        unanswered=len(last) - len(latencies),
        span_s=times[-1] - times[0] if times else 0.0,
        latencies=latencies,
        crashed=crashed,
        problems=problems(logs),
    )


def kill_all(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run(args: argparse.Namespace) -> list[Run]:
    deliveries = workload(args)
    runs: list[Run] = []
    folder = Path(tempfile.mkdtemp(prefix="lw-scale-", dir="/tmp"))
    try:
        if "server" in args.deployments:
            server = EmbeddedRedis(folder / "redis")
            url = server.start()
            try:
                admin = SyncRedis(unix_socket_path=str(server.socket))
                try:
                    for count in args.replicas:
                        admin.flushall()
                        runs.append(run_once("server", url, count, deliveries, args, folder))
                finally:
                    admin.close()
            finally:
                server.stop()
        if "cluster" in args.deployments:
            cluster = start_cluster(folder / "cluster")
            try:
                for count in args.replicas:
                    for primary in cluster.primaries:
                        with primary.admin() as client:
                            client.flushall()
                    runs.append(run_once("cluster", cluster.url, count, deliveries, args, folder))
            finally:
                cluster.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return runs


def report(runs: list[Run], deliveries: list[Delivery], args: argparse.Namespace) -> None:
    bursts = len({d.user for d in deliveries})
    print(
        f"workload (seed {args.seed}): {args.users} users, one burst each of 1-3 messages "
        f"within {args.burst_s:g} s ({len(deliveries)} messages), the bursts starting over "
        f"{args.spread_s:g} s (offered: {bursts / args.spread_s:.0f} bursts/s)"
    )
    print(
        f"replicas: benchmarks.baseline's lastword worker, echo model at {args.llm_ms} ms, "
        f"quiet {args.quiet_ms} ms, max wait {args.max_wait_ms} ms; "
        f"latency floor {args.quiet_ms + args.llm_ms} ms; cpus: {os.cpu_count()}"
    )
    print()
    base = {r.deployment: r.rate for r in runs if r.replicas == 1 and r.rate > 0}
    rows = []
    for r in runs:
        ratio = f"{r.rate / base[r.deployment]:.2f}" if r.deployment in base else "-"
        rows.append(
            [
                r.deployment,
                str(r.replicas),
                str(r.replies),
                str(r.unanswered),
                f"{r.rate:.0f}",
                ratio,
                f"{percentile(r.latencies, 50) * 1000:.0f} ms",
                f"{percentile(r.latencies, 95) * 1000:.0f} ms",
                str(sum(r.problems.values())),
                str(r.crashed),
            ]
        )
    print_table(
        [
            "deployment",
            "replicas",
            "replies",
            "unanswered",
            "replies/s",
            "vs 1 replica",
            "last msg -> reply p50",
            "p95",
            "warnings",
            "lost reports",
        ],
        rows,
    )
    print(
        "\nreplies/s: replies over the span from the first reply to the last. unanswered: "
        "bursts whose last message no reply covered by the end of the run (a run with any, or "
        "with a lost report, does not count). warnings: what the workers logged (warnings, "
        "errors, tracebacks), the most frequent listed below. lost reports: workers that "
        f"exited, or were killed {STOP_GRACE_S:g} s after the run's end, without reporting "
        "what they sent."
    )
    for r in runs:
        if r.problems:
            top = sorted(r.problems.items(), key=lambda item: -item[1])[:4]
            listed = "; ".join(f"{n} x {kind!r}" for kind, n in top)
            print(f"  {r.deployment}, {r.replicas} replicas: {listed}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling")
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--deployments", nargs="+", choices=DEPLOYMENTS, default=list(DEPLOYMENTS))
    parser.add_argument("--spread-s", type=float, default=1.0, help="bursts start over this")
    parser.add_argument("--burst-s", type=float, default=0.4, help="a burst's span")
    parser.add_argument("--llm-ms", type=int, default=200)
    parser.add_argument("--quiet-ms", type=int, default=500)
    parser.add_argument("--max-wait-ms", type=int, default=2000)
    parser.add_argument("--settle-s", type=float, default=8.0, help="after the last delivery")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        runs = run(args)
        report(runs, workload(args), args)


if __name__ == "__main__":
    main()
