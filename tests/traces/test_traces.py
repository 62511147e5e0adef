"""One trace per burst, whichever replicas take part (bot/traces/): two runtimes in process
over one real store, the fake provider behind them, and the SDK's in-memory exporter."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis

from bot.core.runtime import Runtime
from bot.masking import Scrub
from bot.message import Place
from bot.service.logs import LineFormatter
from bot.store import Keys
from bot.traces.otel import OtelTracing
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica, say
from tests.support.counted_tools import Counted
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI, ToolPolicy
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

LLM = {"provider": "openai", "api_key": "sk-secret-key", "model": FAKE_MODEL_ID, "retries": 0}


def spans_of(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(name)]


def trace_ids(spans: Sequence[ReadableSpan]) -> set[int]:
    return {span.context.trace_id for span in spans if span.context is not None}


def recording() -> tuple[InMemorySpanExporter, OtelTracing]:
    exporter = InMemorySpanExporter()
    return exporter, OtelTracing("replica-a", exporter)


def attributes_of(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def test_a_burst_is_one_trace_across_replicas_and_the_next_follows_it(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    exporter = InMemorySpanExporter()
    llm = LLM | {"base_url": fake.base_url}
    first, outbound = await runtime_factory(tracing=OtelTracing("replica-a", exporter), llm=llm)
    second, _ = await runtime_factory(
        tracing=OtelTracing("replica-b", exporter),
        outbound=outbound,
        llm=llm,
    )
    # One burst, its messages taken in by two replicas.
    assert await first.ingest(message("hello there", n=1))
    assert await second.ingest(message("and more", n=2))
    await outbound.wait_for(1, timeout=15)
    await settled(first, CONV, version=2)

    async def a_reply_span() -> bool:
        return bool(spans_of(exporter, "reply"))

    await eventually(a_reply_span, within_s=5)
    burst = exporter.get_finished_spans()
    [trace] = trace_ids(burst)
    ingests = spans_of(exporter, "ingest")
    assert len(ingests) == 2
    # The first message's ingest is the root, every other span below it.
    [root] = [span for span in ingests if span.parent is None]
    assert root.resource.attributes["service.instance.id"] == "replica-a"
    assert root.resource.attributes["service.name"] == "lastword"
    assert root.context is not None
    others = [span for span in burst if span is not root]
    assert {span.resource.attributes["service.instance.id"] for span in ingests} == {
        "replica-a",
        "replica-b",
    }
    assert all(span.parent is not None for span in others)
    # The replica on every span too, for stores that show no resource.
    assert all(
        attributes_of(span)["lastword.replica"] == span.resource.attributes["service.instance.id"]
        for span in burst
    )
    [chat] = spans_of(exporter, "chat ")
    [reply] = spans_of(exporter, "reply")
    # The steps of the reply, each a child of the replica's `reply` span.
    steps = {span.name: span for span in burst if span.name not in ("ingest", "reply")}
    assert set(steps) == {chat.name, "presend", "outbound wait", "send", "send part", "commit"}
    part = steps.pop("send part")
    assert reply.context is not None
    assert {s.parent.span_id for s in steps.values() if s.parent} == {reply.context.span_id}
    # Each part sent, inside the send.
    assert part.parent is not None and steps["send"].context is not None
    assert part.parent.span_id == steps["send"].context.span_id
    assert attributes_of(part)["lastword.part"] == 0
    assert attributes_of(steps["send"])["lastword.outcome"] == "sent"
    assert attributes_of(steps["presend"])["lastword.verdict"] == "ok"
    attributes = dict(chat.attributes or {})
    assert chat.name == f"chat {FAKE_MODEL_ID}"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == FAKE_MODEL_ID
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert int(str(attributes["gen_ai.usage.input_tokens"])) > 0
    assert int(str(attributes["gen_ai.usage.output_tokens"])) > 0
    # An opaque conversation id, no message content, no secret, in any span.
    assert attributes["gen_ai.conversation.id"] != CONV
    said = repr([(span.name, dict(span.attributes or {})) for span in burst])
    for secret_or_content in ("hello there", "and more", "sk-secret-key", CONV):
        assert secret_or_content not in said

    # The next burst is a trace of its own, linked to the one before.
    exporter.clear()
    assert await second.ingest(message("thanks", n=3))
    await outbound.wait_for(2, timeout=15)
    [ingest] = spans_of(exporter, "ingest")
    assert ingest.parent is None and ingest.context is not None
    assert ingest.context.trace_id != trace
    assert [link.context.trace_id for link in ingest.links] == [trace]


def test_tracing_off_imports_no_tracer() -> None:
    # A process of its own: this one has imported the SDK for the tests above. (redis-py
    # imports the SDK's metrics for its own observability when the SDK is installed; the
    # tracing half, and lastword's, stay out.)
    code = (
        "import sys\n"
        "from bot.config.settings import Settings\n"
        "from bot.traces import OFF, tracing_of\n"
        "import bot.service.app\n"
        "assert tracing_of(Settings()) is OFF\n"
        "names = ('opentelemetry.sdk.trace', 'bot.traces.otel')\n"
        "print(sorted(m for m in sys.modules if m.startswith(names)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


async def test_a_tool_call_runs_once_and_a_retry_reuses_it(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    fake.reply = ToolPolicy("note", '{"text": "x"}', answer="Done: {result}")
    exporter, tracing = recording()
    runtime, _ = await replica(runtime_factory, fake, toolbox=counted.toolbox(), tracing=tracing)
    await say(runtime, 1, "note it down")
    [ran] = spans_of(exporter, "execute_tool")
    assert ran.name == "execute_tool note"
    assert attributes_of(ran) | {"gen_ai.tool.call.id": ""} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "note",
        "gen_ai.tool.call.id": "",
        "lastword.tool.outcome": "ran",
        "lastword.replica": "replica-a",
    }
    assert attributes_of(ran)["gen_ai.tool.call.id"]
    # The reply's two requests: the one that asked for the call, and the answer.
    reasons = [
        attributes_of(c)["gen_ai.response.finish_reasons"] for c in spans_of(exporter, "chat")
    ]
    assert reasons == [("tool_calls",), ("stop",)]
    exporter.clear()
    await say(runtime, 2, "/retry")
    [reused] = spans_of(exporter, "execute_tool")
    assert attributes_of(reused)["lastword.tool.outcome"] == "reused"
    assert counted.runs == ["note x"]


async def held_then(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, first: str, then: str
) -> tuple[InMemorySpanExporter, Runtime, RecordingOutbound]:
    """A traced replica whose model holds its answer to `first` while `then` comes in."""
    exporter, tracing = recording()
    runtime, outbound = await replica(runtime_factory, fake, tracing=tracing)
    fake.hold()
    assert await runtime.ingest(message(first, n=1))
    await fake.wait_for_request(lambda r: True, timeout=10)
    assert await runtime.ingest(message(then, n=2))
    return exporter, runtime, outbound


async def test_an_interrupted_generation_and_its_successor_share_the_burst_trace(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    exporter, runtime, outbound = await held_then(runtime_factory, fake, "first", "second")

    async def interrupted() -> bool:
        return runtime.stats.interrupted >= 1

    await eventually(interrupted, within_s=10)
    fake.release()
    [reply] = await outbound.wait_for(1, timeout=15)
    await settled(runtime, CONV, version=2)
    chats = spans_of(exporter, "chat")
    assert [attributes_of(c).get("lastword.ended") for c in chats] == ["interrupted", "done"]
    assert len(trace_ids(exporter.get_finished_spans())) == 1
    assert reply.text is not None and "second" in reply.text


async def test_a_stop_shows_as_the_message_that_cut_the_generation(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    exporter, runtime, outbound = await held_then(
        runtime_factory, fake, "tell me a long story", "/stop"
    )
    [answer] = await outbound.wait_for(1, timeout=15)
    await settled(runtime, CONV, version=2)
    fake.release()
    [chat] = spans_of(exporter, "chat")
    assert attributes_of(chat)["lastword.ended"] == "interrupted"
    first, stop = spans_of(exporter, "ingest")
    assert attributes_of(stop)["lastword.command"] == "stop"
    assert "lastword.command" not in attributes_of(first)
    assert len(trace_ids(exporter.get_finished_spans())) == 1
    assert answer.text is not None and "story" not in answer.text


async def test_a_generation_cut_by_a_stopping_replica_says_so_in_its_reply_span(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    exporter, tracing = recording()
    runtime, _ = await replica(runtime_factory, fake, tracing=tracing)
    fake.hold()
    assert await runtime.ingest(message("hello", n=1))
    await fake.wait_for_request(lambda r: True, timeout=10)
    await runtime.stop()
    fake.release()
    [chat], [reply] = spans_of(exporter, "chat"), spans_of(exporter, "reply")
    assert attributes_of(chat)["lastword.ended"] == "cancelled"
    assert attributes_of(reply)["lastword.ended"] == "stopped"
    assert chat.parent is not None and reply.context is not None
    assert chat.parent.span_id == reply.context.span_id


async def test_a_failing_model_is_an_error_span_its_log_line_names_the_trace(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    exporter, tracing = recording()
    runtime, outbound = await replica(runtime_factory, fake, tracing=tracing)
    # The lines as the service writes them, formatted when they are logged.
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(LineFormatter("logfmt", "replica-a", Scrub(["sk-secret-key"])))
    logging.getLogger("bot.core.cycle").addHandler(handler)
    try:
        fake.fail_next(fake.server_error())
        await say(runtime, 1, "hello")
    finally:
        logging.getLogger("bot.core.cycle").removeHandler(handler)
    [chat] = spans_of(exporter, "chat")
    assert attributes_of(chat)["error.type"] == "transient"
    assert chat.status.status_code.name == "ERROR"
    # Named by its type only: the error's message (the provider's words) is nowhere in it.
    assert not chat.status.description and not chat.events
    assert len(outbound.texts(CONV)) == 1
    [failed] = [line for line in lines.getvalue().splitlines() if "LLM failed" in line]
    assert chat.context is not None
    assert f"trace_id={chat.context.trace_id:032x}" in failed


async def test_content_is_captured_only_when_the_operator_opts_in(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    exporter, tracing = recording()
    runtime, outbound = await replica(runtime_factory, fake, tracing=tracing)
    await say(runtime, 1, "hello there")
    [chat] = spans_of(exporter, "chat")
    said = json.loads(str(attributes_of(chat)["gen_ai.input.messages"]))
    answer = json.loads(str(attributes_of(chat)["gen_ai.output.messages"]))
    assert said[0]["role"] == "system" and said[-1]["role"] == "user"
    assert "hello there" in said[-1]["parts"][0]["content"]
    [reply] = outbound.texts(CONV)
    assert answer == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": reply}],
            "finish_reason": "stop",
        }
    ]


class SeesTypingOutbound(RecordingOutbound):
    """A platform that reports its users' typing (Discord's DMs, a terminal)."""

    def sees_typing(self, place: Place) -> bool:
        return True


async def test_a_typing_hold_joins_the_burst_trace(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    exporter, tracing = recording()
    outbound = SeesTypingOutbound()
    runtime, _ = await runtime_factory(
        outbound=outbound,
        tracing=tracing,
        llm=LLM | {"base_url": fake.base_url},
        debounce={"quiet_ms": 300, "max_wait_ms": 3000, "typing_ms": 600},
    )
    first = message("one", n=1)
    assert await runtime.ingest(first)
    await runtime.user_typing(first.place)
    await outbound.wait_for(1, timeout=15)
    [ingest], [typing] = spans_of(exporter, "ingest"), spans_of(exporter, "typing")
    assert ingest.context is not None and typing.parent is not None
    assert typing.parent.span_id == ingest.context.span_id
    assert typing.context is not None and typing.context.trace_id == ingest.context.trace_id
    assert int(str(attributes_of(typing)["lastword.window.held_ms"])) > 0


async def test_a_trace_context_damaged_in_the_store_costs_the_burst_its_trace_not_its_reply(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    exporter, tracing = recording()
    runtime, outbound = await replica(runtime_factory, fake, tracing=tracing)
    # As a hand edit, or a later version's format, would leave it.
    await redis.hset(Keys(CONV).state, "trace", "01-not-a-trace")
    await say(runtime, 1, "hello")
    assert len(outbound.texts(CONV)) == 1
    assert spans_of(exporter, "reply") == []
