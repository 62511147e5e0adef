"""One replica of the bot as its own OS process, for the multi-process invariant tests.

Run as ``python -m tests.support.replica``. It builds the real runtime (store, LLM client, timers,
cycles) from the environment, exactly as `lastword run` would, but talks to a tiny "pipe"
platform instead of a chat service, so a test can drive several replicas and see everything
they deliver:

- stdin: one normalized `InboundMessage` JSON per line; each is ingested (retried while the
  store is unavailable) and answered with ``{"event": "ingested", ...}``;
- stdout: one JSON line per event: ``ready`` once it accepts messages, ``sent`` for every
  reply part the core delivers, ``send_failed`` for every send the platform refused,
  ``stats`` whenever the cycle counters change, ``stopped``.

A test scripts the platform's failures through the file named by ``REPLICA_SEND_CONTROL``, read
at every send, so all replicas see the same script: absent or empty, sends succeed;
``transient`` or ``permanent``, each send fails so (`SendFailed`); ``hold <ms>``, each send is
delivered (``sent``) and then takes that long to return, as a slow platform would.

SIGTERM (or the end of stdin, so an orphaned replica never outlives its test) stops it
cleanly and it exits 0. The replica's name is its LLM API key, so the fake LLM server can
tell which replica made each request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bot.cancel import cancel_and_wait
from bot.config.settings import Settings, load_settings
from bot.core.runtime import Runtime
from bot.llm.factory import make_llm
from bot.message import InboundMessage, NoFiles, SendFailed, Unavailable
from bot.service.app import make_store
from bot.store.connect import make_client

log = logging.getLogger("tests.support.replica")

# How often the replica looks at its cycle counters to report changes.
STATS_POLL_S = 0.05


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once: the test synchronises on these lines."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class PipeOutbound(NoFiles):
    """The chat platform of this harness: every reply part becomes a ``sent`` line."""

    max_message_chars = 4096
    typing_interval_s = 1.0

    def __init__(self, replica: str, control: Path | None) -> None:
        self.replica = replica
        self.control = control

    def _script(self) -> list[str]:
        if self.control is None:
            return []
        try:
            return self.control.read_text().split()
        except FileNotFoundError:
            return []

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        script = self._script()
        if script and script[0] in ("transient", "permanent"):
            emit("send_failed", conversation=conversation, key=idempotency_key, t=time.time())
            raise SendFailed(f"scripted {script[0]} failure", permanent=script[0] == "permanent")
        emit(
            "sent",
            conversation=conversation,
            text=text,
            key=idempotency_key,
            replica=self.replica,
            t=time.time(),
        )
        if script and script[0] == "hold":
            await asyncio.sleep(int(script[1]) / 1000)

    async def typing(self, conversation: str) -> None:
        # The typing indicator is not under test here; keep stdout to what tests assert on.
        return None


async def ingest_lines(runtime: Runtime, replica: str) -> None:
    """Ingest each stdin line in order, until end of input. Ordering per replica matters:
    the test sends a conversation's messages one after the other."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if not line.strip():
            continue
        message = InboundMessage.from_json(line)
        while True:
            try:
                accepted = await runtime.ingest(message)
                break
            except Unavailable as exc:
                # A real adapter would not acknowledge; the platform would redeliver.
                log.warning("ingest of %s unavailable: %s", message.message_id, exc)
                await asyncio.sleep(0.05)
        emit(
            "ingested",
            message_id=message.message_id,
            conversation=message.conversation,
            accepted=accepted,
            replica=replica,
            t=time.time(),
        )


def counters(runtime: Runtime) -> dict[str, Any]:
    """The cycle counters, without the samples and histograms."""
    stats = runtime.stats
    values = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    return {name: value for name, value in values.items() if isinstance(value, int)}


async def report_stats(runtime: Runtime, replica: str) -> None:
    """Report the cycle counters whenever they change, so a test can tell, for example, that
    a resumed replica's cycle has ended with a lost lease."""
    last: dict[str, Any] = {}
    while True:
        stats = counters(runtime)
        if stats != last:
            emit("stats", replica=replica, **stats)
            last = stats
        await asyncio.sleep(STATS_POLL_S)


def dump_tasks() -> None:
    """Where every task is waiting: what a test asks for (SIGUSR2) when a replica is stuck
    with its event loop still running."""
    for task in asyncio.all_tasks():
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


def replica_name(settings: Settings) -> str:
    key = settings.llm.api_key
    return key.get_secret_value() if key is not None else "replica"


async def main() -> int:
    # A test that finds a replica stuck asks where it is stuck: SIGUSR1 dumps the threads
    # (for a blocked event loop), SIGUSR2 the asyncio tasks (for a loop waiting forever).
    faulthandler.register(signal.SIGUSR1)
    settings = load_settings()
    name = replica_name(settings)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s",
    )
    if not settings.redis_url:
        log.error("LASTWORD_REDIS_URL must point at the test server")
        return 2
    store = make_store(settings, make_client(settings.redis_url))
    control_path = os.environ.get("REPLICA_SEND_CONTROL")
    control = Path(control_path) if control_path else None
    runtime = Runtime(
        settings, store, make_llm(settings.llm, settings.llm_provider), PipeOutbound(name, control)
    )
    runtime.start()

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR2, dump_tasks)
    tasks = {
        asyncio.create_task(ingest_lines(runtime, name), name="stdin"),
        asyncio.create_task(stop.wait(), name="stop"),
    }
    reporter = asyncio.create_task(report_stats(runtime, name), name="stats")
    emit("ready", replica=name, pid=os.getpid())
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        log.info("stopping")
        for task in (*tasks, reporter):
            # The stdin task may be inside a store call, where one cancel can be lost.
            await cancel_and_wait(task)
        await runtime.stop()
        log.info("runtime stopped")
        await store.close()
        log.info("store closed")
    # The last word on what this replica did, changed or not since the last report.
    emit("stats", replica=name, **counters(runtime))
    emit("stopped", replica=name)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
