"""The exporter's process (bot/traces/pipe.py, bot/traces/exporter.py), for real: spans go
from a replica's loop through a pipe to `python -m bot.traces.exporter`, which posts them to
a receiver that decodes OTLP. An exporter that dies is started again, one that stalls costs
the replica a bounded queue, and a replica killed leaves what it had sent to be exported."""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from bot.traces import pipe
from bot.traces.otel import OtelTracing
from bot.traces.records import Record
from tests.support.fakes.otlp_receiver import FakeOTLP
from tests.support.waits import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def otlp_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # Batches leave the exporter every 0.1 s, not the SDK's 5 s.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    return monkeypatch


@pytest.fixture
async def exporting(
    otlp_env: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[FakeOTLP, OtelTracing, str]]:
    """A receiver, a replica's tracing exporting to it, and a sampled burst's trace with
    one span, "first", on its way."""
    async with FakeOTLP() as otlp:
        otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        tracing = OtelTracing("replica-p")
        trace = tracing.candidate()
        tracing.noted("first", trace, time.time_ns())
        try:
            yield otlp, tracing, trace
        finally:
            tracing.shutdown()


async def test_an_exporter_that_dies_is_started_again_and_later_spans_arrive(
    exporting: tuple[FakeOTLP, OtelTracing, str],
) -> None:
    otlp, tracing, trace = exporting
    assert tracing.pipe is not None

    async def first() -> bool:
        return bool(otlp.named("first"))

    await eventually(first, within_s=15)
    [span] = otlp.named("first")
    assert span.resource["service.instance.id"] == "replica-p"
    assert span.attributes["lastword.replica"] == "replica-p"
    killed = tracing.pipe.exporter_pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    sent = 0

    async def a_later_span() -> bool:
        nonlocal sent
        sent += 1
        tracing.noted(f"later {sent}", trace, time.time_ns())
        return bool(otlp.named("later"))

    # Noted again and again: those sent to the dead one are dropped, and counted.
    await eventually(a_later_span, within_s=20)
    assert tracing.pipe.exporter_pid not in (None, killed)
    assert tracing.pipe.dropped >= 1
    assert {s.trace_id for s in otlp.spans} == {trace.split("-")[1]}


async def test_a_stalled_exporter_costs_a_bounded_queue_and_a_bounded_stop(
    exporting: tuple[FakeOTLP, OtelTracing, str],
) -> None:
    _, tracing, trace = exporting
    assert tracing.pipe is not None

    async def started() -> int:
        return tracing.pipe.exporter_pid or 0 if tracing.pipe else 0

    stalled = await eventually(started, within_s=10)
    os.kill(stalled, signal.SIGSTOP)
    # Far more than the pipe and the queue hold: the pipe fills, the thread's write blocks,
    # and the queue stops at its bound while the rest are counted as dropped.
    offered = 3 * pipe.MAX_PENDING
    for n in range(offered):
        tracing.noted("flood", trace, time.time_ns(), n=n)
    assert tracing.pipe.pending <= pipe.MAX_PENDING
    # (One batch the thread took before the pipe filled may be in its blocked write.)
    assert tracing.pipe.dropped >= offered - 2 * pipe.MAX_PENDING
    # A stop does not wait on the stalled exporter past its bound: it is killed.
    tracing.shutdown()
    assert tracing.pipe.returncode == -signal.SIGKILL


class Outcome(enum.StrEnum):
    SENT = "sent"


async def test_a_record_marshal_refuses_costs_its_batch_not_the_thread(
    exporting: tuple[FakeOTLP, OtelTracing, str],
) -> None:
    otlp, tracing, trace = exporting
    assert tracing.pipe is not None
    # An enum's member as a value (marshal takes no subclass): made plain as the span ends.
    tracing.noted("an enum", trace, time.time_ns(), outcome=Outcome.SENT)

    async def arrived(name: str) -> bool:
        return bool(otlp.named(name))

    await eventually(functools.partial(arrived, "an enum"), within_s=15)
    [span] = otlp.named("an enum")
    assert span.attributes["outcome"] == "sent"
    # Whatever else marshal would refuse costs its batch, counted, and the thread goes on.
    dropped = tracing.pipe.dropped
    tracing.pipe.put(cast(Record, ("not a record", object())))

    async def counted() -> bool:
        return tracing.pipe is not None and tracing.pipe.dropped == dropped + 1

    await eventually(counted, within_s=15)
    tracing.noted("after it", trace, time.time_ns())
    await eventually(functools.partial(arrived, "after it"), within_s=15)


def ignores_stops(pid: int) -> bool:
    """Whether process `pid` ignores SIGTERM and SIGINT (its handlers are in place)."""
    status = Path(f"/proc/{pid}/status").read_text()
    [ignored] = [line.split()[1] for line in status.splitlines() if line.startswith("SigIgn")]
    wanted = 1 << (signal.SIGTERM - 1) | 1 << (signal.SIGINT - 1)
    return int(ignored, 16) & wanted == wanted


def stdout_of(pid: int) -> str:
    """What process `pid`'s stdout is."""
    return os.readlink(f"/proc/{pid}/fd/1")


def ended(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie its new parent has yet to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_spans_a_killed_replica_had_sent_are_still_exported(
    otlp_env: pytest.MonkeyPatch,
) -> None:
    script = textwrap.dedent(
        """
        import time
        from bot.traces.otel import OtelTracing
        tracing = OtelTracing("replica-k")
        trace = tracing.candidate()
        for n in range(50):
            tracing.noted("before the kill", trace, time.time_ns(), n=n)
        while tracing.pipe.sent < 50:
            time.sleep(0.01)
        print(tracing.pipe.exporter_pid, flush=True)
        time.sleep(60)
        """
    )
    async with FakeOTLP() as otlp:
        otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        replica = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, cwd=ROOT, stdout=asyncio.subprocess.PIPE
        )
        try:
            assert replica.stdout is not None
            exporter = int(await asyncio.wait_for(replica.stdout.readline(), 30))

            async def ignoring_stops() -> bool:
                return ignores_stops(exporter)

            await eventually(ignoring_stops, within_s=15)
            # Not the replica's stdout, where a console's replies go.
            assert stdout_of(exporter) == "/dev/null"
            # As systemd's stop, or a Ctrl-C, reaches the whole group: the exporter stays for
            # what it holds, and ends when its replica does.
            os.kill(exporter, signal.SIGTERM)
            os.kill(exporter, signal.SIGINT)
            replica.kill()
            await replica.wait()

            async def all_of_them() -> bool:
                return len(otlp.named("before the kill")) == 50

            await eventually(all_of_them, within_s=15)

            async def exporter_ended() -> bool:
                return ended(exporter)

            await eventually(exporter_ended, within_s=15)
        finally:
            if replica.returncode is None:
                replica.kill()
                await replica.wait()


def test_a_broken_stream_ends_the_exporter_with_a_clear_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bot.traces.exporter", "replica-b"],
        input=b"\xff\xff\xff\xff",
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        env=os.environ | {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert done.returncode == 0
    assert b"the stream is broken" in done.stderr


def test_a_protocol_not_offered_is_one_warning_in_the_replicas_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for protocol in ("grpc", "http/protobuf"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        with caplog.at_level(logging.WARNING, logger="bot.traces"):
            OtelTracing("replica-g").shutdown()
    warned = [r.getMessage() for r in caplog.records if "not offered" in r.getMessage()]
    assert warned == ["OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not offered; using http/protobuf"]
