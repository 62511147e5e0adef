"""The byte limit on an MCP server's messages over streamable HTTP, as over stdio
(`bot.tools.http_limits`), against a real server process (tests/support/fakes/mcp_append_server.py
with `--http`) through the real `mcp` client:

- a 100 MB answer, as a JSON body or as one server-sent event, is an error result with a known
  outcome, read no further than the limit: the loop's worst lag under 50 ms and the memory it
  takes under 50 MB; the session stays up for the next call; one that declares its size is
  refused unread, and a compressed one is refused;
- an answer within the limit is whole (an event too, past the SDK's own 1 MiB), an event
  stream is handed on unchanged however its chunks and lines are cut, and a limit is the
  source's own;
- through a replica, another user's reply is on time while one user's tool answers 100 MB,
  and that user hears of the error.
"""

from __future__ import annotations

import json
import logging
import re
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from bot.config.settings import McpServer, ToolsSettings
from bot.tools.http_limits import Events
from bot.tools.load import load_toolbox
from bot.tools.mcp import McpSource, TooLong
from bot.tools.stdio import MAX_MESSAGE_BYTES, TOO_LONG
from tests.support.builders import message
from tests.support.chatting import fake, replica
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest, ToolCalls, ToolPolicy
from tests.support.loop_watch import watched
from tests.support.mcp import TOKEN, Boxes, run
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # fixtures, imported for pytest

pytestmark = pytest.mark.timeout(60)

HUNDRED_MB = 100_000_000
# The bounds: the longest the loop may be held, and what reading the answer may take
# in memory.
WORST_LAG_S = 0.05
MEMORY_BYTES = 50 * 2**20
# How long the other user's reply may take from their message: the debounce's quiet spell
# (150 ms in the tests' settings) and a cycle, with room for a loaded machine.
ON_TIME_S = 2.0
TOO_LONG_TEXT = (
    "error: the tool failed: TooLong: the answer of the MCP server web was over "
    f"{MAX_MESSAGE_BYTES} bytes"
)


def web(url: str) -> dict[str, Any]:
    """The fake server's entry in `mcpServers`."""
    return {"url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}}


@dataclass
class Measured:
    """The longest the loop was held, how late its timers ran, and the most memory allocated
    above where it started."""

    held_s: float = 0.0
    late_s: float = 0.0
    grew: int = 0

    def __str__(self) -> str:
        return (
            f"loop held {self.held_s * 1e3:.1f} ms at most (its timers up to "
            f"{self.late_s * 1e3:.1f} ms late), memory {self.grew / 2**20:.1f} MiB above the start"
        )


@contextmanager
def measured(memory: bool = True) -> Iterator[Measured]:
    """How long the loop was held (`tests.support.loop_watch`: a timer ticking every 5 ms) and, if
    `memory`, the memory Python allocates (its peak above what was allocated at the start),
    while the block runs. Tracing allocations slows every allocation, the loop's other work
    too."""
    seen = Measured()
    with watched() as watch:
        if memory:
            tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        try:
            yield seen
        finally:
            seen.grew = tracemalloc.get_traced_memory()[1] - start
            tracemalloc.stop()
            seen.held_s, seen.late_s = watch.held_s, watch.late_s


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_a_100_mb_answer_is_an_error_within_the_bounds(
    boxes: Boxes, http_server: str, sse: bool, caplog: pytest.LogCaptureFixture
) -> None:
    box = await boxes(mcp_servers={"web": web(http_server)})
    with caplog.at_level(logging.WARNING, logger="bot.tools.mcp"), measured() as seen:
        result = await run(box, "flood", timeout_s=20, n=HUNDRED_MB, sse=sse)
    print(f"100 MB answer ({'sse' if sse else 'json'}): {seen}")
    # It answered, too much: an error whose outcome is known.
    assert (result.text, result.error, result.unknown) == (TOO_LONG_TEXT, True, False)
    assert seen.held_s < WORST_LAG_S
    assert seen.grew < MEMORY_BYTES
    said = [r.getMessage() for r in caplog.records if r.name == "bot.tools.mcp"]
    assert len(said) == 1 and f"over {MAX_MESSAGE_BYTES} bytes" in said[0], said
    # Only that answer was dropped: the session is up for the next call, no restart between.
    echoed = await run(box, "read_only_echo", text="still here")
    assert (echoed.text, echoed.error) == ("still here", False)
    assert not any("is not running" in r.getMessage() for r in caplog.records)


async def test_an_answer_declared_over_the_limit_is_refused_unread(
    boxes: Boxes, http_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    box = await boxes(mcp_servers={"web": web(http_server)})
    with caplog.at_level(logging.WARNING, logger="bot.tools.mcp"), measured() as seen:
        result = await run(box, "flood", timeout_s=20, n=HUNDRED_MB, declared=True)
    assert (result.text, result.error, result.unknown) == (TOO_LONG_TEXT, True, False)
    [said] = [r.getMessage() for r in caplog.records if r.name == "bot.tools.mcp"]
    declared = re.search(r"MAX_MESSAGE_BYTES; it declared (\d+)\)", said)
    assert declared is not None and int(declared.group(1)) > HUNDRED_MB, said
    # Not a chunk of it read: less than the limit, let alone the answer.
    assert seen.grew < MAX_MESSAGE_BYTES


async def test_a_compressed_answer_is_refused(boxes: Boxes, http_server: str) -> None:
    box = await boxes(mcp_servers={"web": web(http_server)})
    result = await run(box, "flood", n=10, gzip=True)
    assert (result.error, result.unknown) == (True, False)
    assert result.text == (
        "error: the tool failed: MCPError: the answer was compressed (gzip), though lastword "
        "asked for none"
    )
    echoed = await run(box, "read_only_echo", text="plain")
    assert (echoed.text, echoed.error) == ("plain", False)


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_an_answer_within_the_limit_is_whole(
    boxes: Boxes, http_server: str, sse: bool
) -> None:
    box = await boxes(mcp_servers={"web": web(http_server)})
    # 2 MB: within the limit, and over the SDK's own 1 MiB for a server-sent event.
    result = await run(box, "flood", timeout_s=20, cap=3_000_000, n=2_000_000, sse=sse)
    assert (result.text, result.error) == ("x" * 2_000_000, False)


async def test_a_sources_limit_is_its_own_over_http(http_server: str) -> None:
    config = McpServer.model_validate(web(http_server))
    source = McpSource("web", config, 10, lambda source, tools: None, max_message_bytes=65_536)
    source.start()
    try:
        await eventually(source.tried.wait, 10, what="the server listed")
        assert await source.call("read_only_echo", {"text": "small"}, "k") == "small"
        for sse in (False, True):
            with pytest.raises(TooLong, match=r"^the answer of the MCP server web was over 65536"):
                await source.call("flood", {"n": 65_536, "sse": sse}, "k")
        assert source.starts == 1
    finally:
        await source.close()


@pytest.mark.slow
@pytest.mark.parametrize("memory", [False, True], ids=["lag", "memory"])
@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_another_users_reply_is_on_time_while_a_tool_answers_100_mb(
    runtime_factory: RuntimeFactory,
    fake: FakeOpenAI,
    http_server: str,
    sse: bool,
    memory: bool,
) -> None:
    arguments = json.dumps({"n": HUNDRED_MB, "sse": sse})
    flood = ToolPolicy("flood", arguments, answer="Flood: {result}")

    def reply(request: RecordedRequest) -> str | ToolCalls:
        return flood(request) if "flood" in request.last_user_text else "quick answer"

    fake.reply = reply
    settings = ToolsSettings.model_validate({"mcp_servers": {"web": web(http_server)}})
    box = await load_toolbox(settings)
    try:
        runtime, outbound = await replica(runtime_factory, fake, toolbox=box)
        with measured(memory) as seen:
            assert await runtime.ingest(message("flood me", n=1, user="u1"))

            async def asked() -> bool:
                return len(fake.requests) >= 1

            # The model has asked for the tool: the answer streams from now on.
            await eventually(asked, 10, what="the model asking for the flood")
            posted = time.monotonic()
            assert await runtime.ingest(message("hello", n=2, user="u2", conversation="test:2"))
            await settled(runtime, "test:2")
            waited = time.monotonic() - posted
            await settled(runtime, "test:1", within_s=20)
    finally:
        await box.close()
    print(f"other user's reply after {waited:.2f} s; {seen}")
    assert outbound.texts("test:2") == ["quick answer"]
    assert waited < ON_TIME_S
    assert outbound.texts("test:1") == [f"Flood: {TOO_LONG_TEXT}"]
    # Each where it is measured alone: tracing allocations lags the loop's other work too.
    if memory:
        assert seen.grew < MEMORY_BYTES
    else:
        assert seen.held_s < WORST_LAG_S


class Chunks(httpx2.AsyncByteStream):
    """A server's body as its chunks came off the wire."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def handed_on(body: bytes, every: int, limit: int) -> list[bytes]:
    """What `Events` hands the SDK of `body`, cut into chunks of `every` bytes."""
    chunks = [body[i : i + every] for i in range(0, len(body), every)]
    return [piece async for piece in Events(Chunks(chunks), limit, "web", 7)]


# Three events, each with a line's end of its own kind (LF, CRLF, CR), and a comment.
EVENTS = (
    b"event: message\ndata: one\n\n"
    b": keep-alive\r\n\r\n"
    b"event: message\r\ndata: two\r\n\r\n"
    b"event: message\rdata: three\r\r"
)
# Where the first event ends.
FIRST = EVENTS.index(b"\n\n") + 2


@pytest.mark.parametrize("every", [1, 2, 3, 5, 7, 64])
async def test_an_event_stream_is_handed_on_whole_events_unchanged(every: int) -> None:
    pieces = await handed_on(EVENTS, every, limit=40)
    assert b"".join(pieces) == EVENTS
    # Never part of an event: each piece ends where an event does (a CRLF's last LF may open
    # the next piece).
    for piece in pieces[:-1]:
        assert piece.endswith((b"\n\n", b"\r\n\r", b"\r\r")), pieces


@pytest.mark.parametrize("every", [1, 5, 64, 4096])
async def test_an_event_over_the_limit_ends_the_stream_with_its_error(every: int) -> None:
    big = b"event: message\ndata: " + b"y" * 100 + b"\n\n"
    pieces = await handed_on(EVENTS[:FIRST] + big + EVENTS[FIRST:], every, limit=64)
    shown = b"".join(pieces)
    # What came before it, whole; none of it; then its request's error, and nothing after.
    assert shown.startswith(EVENTS[:FIRST])
    assert b"yyy" not in shown
    error = json.loads(shown[FIRST:].removeprefix(b"event: message\ndata: "))
    assert error == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": TOO_LONG, "message": "the answer was over 64 bytes"},
    }
