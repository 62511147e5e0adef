"""Reading Chat Completions off the wire, whatever a server sends.

Completions are streamed (server-sent events, `sse_events`); an answer is text, tool calls, or
both. Calls stream as pieces (`ToolCallPieces`): arguments a few characters at a time, several
calls in one step told apart by their index, possibly interleaved; they are assembled here,
bounded (`MAX_CALLS`, `MAX_ARGUMENT_BYTES`, a name as Chat Completions allows one).

"OpenAI-compatible" servers differ: content as a list of parts (Mistral), usage of any type,
junk between events, a proxy's HTML page with a 200. Replies are read raw, whatever their
shape: what is text is the answer, what is unusable is the transient `LLMError`, never a
TypeError that the cycle could not tell from a bug. Reasoning (`reasoning_content`, thinking
parts) is never part of the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bot.llm.base import Attempt, LLMError, T
from bot.tools import ToolCall

# Content parts that are the answer; every other type (thinking, reference, image) is not.
TEXT_PARTS = ("text", "output_text")


# Where servers put a reasoning model's thoughts when not in `<think>` blocks.
REASONING_FIELDS = ("reasoning_content", "reasoning")


# Non-JSON events (keep-alives, a proxy's noise) skipped in one stream before giving up on it.
JUNK_LIMIT = 32


# One event, and one whole reply, can be no longer than this: a provider that sends more
# sends something else (a loop, a file), and it would all sit in memory.
MAX_EVENT_CHARS = 1 << 20


MAX_BODY_BYTES = 8 << 20


# After the chunk that finishes an answer, its usage and `[DONE]` are waited for this long at
# most (`until_finished`); after those, the rest of the body is read this long and this much
# at most (`drain`). A provider ends the body at once; one that holds it open delays the reply
# by no more than these.
TAIL_S = 0.25


DRAIN_S = 0.05


DRAIN_CHARS = 64 << 10


# Above this a reported count is a glitch: no context window holds that many tokens, and it
# would overflow the usage counters in the store.
MAX_REPORTED_TOKENS = 100_000_000


# Tool calls in one step, and the arguments of one, at most: a provider that sends more is
# looping, and every call is recorded in the store before it runs.
MAX_CALLS = 64


MAX_ARGUMENT_BYTES = 64 << 10


# A tool's name as the model wrote it is kept up to this long: a name the model mangled
# ("functions.get_time") or invented is an error result the model reads, not a failed reply.
MAX_TOOL_NAME_CHARS = 256


# A call's id is echoed back to the provider and stored with its result: a sane length only.
MAX_CALL_ID_CHARS = 256


async def sse_events(lines: AsyncIterator[str]) -> AsyncGenerator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to `[DONE]`. Event names, ids and
    comments carry nothing for chat completions; a payload may span several `data:` lines.

    A payload that is no JSON object at all (`data: ping`, a proxy's noise, a bare number)
    is skipped, up to `JUNK_LIMIT` of them: it carries no part of the answer, so failing
    over it would throw a good reply away. An object cut short, or one past
    `MAX_EVENT_CHARS`, is a transient `LLMError`: a piece of the answer is in it, and a
    reply with a hole in it is worse than another attempt.
    """
    data: list[str] = []
    size = 0
    junk = 0
    async for line in _unbroken(lines):
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            size += len(line)
            if size > MAX_EVENT_CHARS:
                raise LLMError("the provider sent an event too long to be one", kind="transient")
        elif not line and data:
            payload, data, size = "\n".join(data), [], 0
            if payload == "[DONE]":
                return
            event = parse_json(payload)
            if isinstance(event, dict):
                yield event
            elif payload.lstrip().startswith("{"):
                raise LLMError("the provider sent a malformed event", kind="transient")
            else:
                junk += 1
                if junk > JUNK_LIMIT:
                    raise LLMError(
                        f"the provider sent over {JUNK_LIMIT} events that are not JSON objects",
                        kind="transient",
                    )


async def until_finished(
    events: AsyncIterator[dict[str, Any]], usage_asked: bool
) -> AsyncIterator[dict[str, Any]]:
    """The events of a stream until its answer is whole: `[DONE]`, or the chunk that
    finishes the choice (with its usage, when usage was asked for).

    Past the finishing chunk only the usage and `[DONE]` are still to come, and they are
    waited for `TAIL_S` at most: a proxy or a self-hosted server may hold the stream open
    after the answer (keep-alive comments, or silence), and a complete answer must not wait
    for a read timeout, or be thrown away by one."""
    tail_until: float | None = None
    got_usage = False
    while True:
        if tail_until is None:
            # No deadline before the finishing chunk: a timeout context per chunk (one object
            # and two calls into the loop) would bound nothing.
            chunk = await anext(events, None)
        else:
            try:
                async with asyncio.timeout_at(tail_until):
                    chunk = await anext(events, None)
            except TimeoutError:
                return
        if chunk is None:
            return
        yield chunk
        got_usage = got_usage or isinstance(chunk.get("usage"), dict)
        if tail_until is None and _finishes(chunk):
            tail_until = asyncio.get_running_loop().time() + TAIL_S
        if tail_until is not None and (got_usage or not usage_asked):
            return


def _finishes(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and choice.get("finish_reason") for choice in choices
    )


async def drain(lines: AsyncIterator[str]) -> None:
    """Read what follows the answer, `DRAIN_S` and `DRAIN_CHARS` at most. A body read to its
    end lets the connection serve the next generation (a new one to a provider costs a TLS
    handshake); one still open after that is closed, the answer is not held for it."""
    read = 0
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_S):
            async for line in lines:
                read += len(line) + 1
                if read > DRAIN_CHARS:
                    return


async def _unbroken(items: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        async for item in items:
            yield item
    except Exception as exc:
        # Only the transport runs in here: whatever it raises (httpx or httpx2 by the client's
        # version, ssl, anyio) means the stream broke midway.
        raise LLMError(f"the stream broke: {type(exc).__name__}", kind="transient") from None


async def read_body(chunks: AsyncIterator[bytes]) -> bytes:
    """A whole response body, at most `MAX_BODY_BYTES` of it."""
    body = bytearray()
    async for chunk in _unbroken(chunks):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise LLMError("the provider's reply is too long to be one", kind="transient")
    return bytes(body)


def parse_json(text: str) -> object:
    """The JSON value in `text`, or None if it holds none."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None


def glimpse(body: bytes) -> str:
    """The start of a body that should have been JSON, fit for one log line."""
    return " ".join(body[:80].decode("utf-8", "replace").split()) or "an empty body"


def well_formed(text: str) -> str:
    """`text` fit to be stored and sent (as UTF-8): a surrogate pair that came as two escapes
    (an emoji split across two events) joined, a lone surrogate replaced."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def content_text(content: object) -> str:
    """The text of a message's content, whatever its shape: a string, or parts of which only
    the text ones count (Mistral's thinking and reference parts are no answer), a part alone;
    anything else (null, a number) says nothing."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    return "".join(
        part if isinstance(part, str) else part["text"]
        for part in parts
        if isinstance(part, str)
        or (
            isinstance(part, dict)
            and part.get("type", "text") in TEXT_PARTS
            and isinstance(part.get("text"), str)
        )
    )


@dataclass
class _Pieces:
    """One tool call as it streams in: its id and name once known, its arguments so far."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0


class ToolCallPieces:
    """Tool calls assembled from the pieces a provider sends, whatever their shape.

    Each streamed piece names its call by `index`: the first piece of a call carries its id
    and name, the rest pieces of its arguments, and pieces of several calls may come
    interleaved. A piece without a usable index (servers that send each call whole) starts a
    call when it brings a new id and continues the last one otherwise; a plain completion's
    calls are numbered by their place in the list. Entries of any other shape are skipped, as
    odd deltas are; more calls, or longer arguments, than a step can have are a transient
    `LLMError`.
    """

    def __init__(self) -> None:
        self._calls: dict[int, _Pieces] = {}
        self._last = -1

    def add(self, entries: object, *, whole: bool = False) -> None:
        """Take one delta's `tool_calls`, or (`whole`) a whole message's."""
        if not isinstance(entries, list):
            return
        for position, entry in enumerate(entries):
            if isinstance(entry, dict):
                self._add(position if whole else self._index(entry), entry)

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls in index order. A call without a name (or with an id too long to echo
        back) is a transient `LLMError`: it cannot be answered. A name no tool has, or one
        Chat Completions would not take back, is kept (cut) for the toolbox to refuse."""
        calls: list[ToolCall] = []
        for index in sorted(self._calls):
            pieces = self._calls[index]
            if not pieces.name:
                raise LLMError("the provider sent a tool call without a name", kind="transient")
            if len(pieces.id) > MAX_CALL_ID_CHARS:
                raise LLMError(
                    f"the provider sent a tool call id over {MAX_CALL_ID_CHARS} characters",
                    kind="transient",
                )
            # The id is how the provider matches a result to its call: one that is missing,
            # or taken by an earlier call of the step, gets one of its own that a later
            # generation of the same answer would get too.
            taken = pieces.id in {call.id for call in calls}
            call_id = well_formed(pieces.id) if pieces.id and not taken else f"call_{index}"
            arguments = well_formed("".join(pieces.arguments))
            # No arguments at all is an empty object, which every provider takes back.
            name = pieces.name[:MAX_TOOL_NAME_CHARS]
            calls.append(ToolCall(call_id, name, arguments if arguments.strip() else "{}"))
        return tuple(calls)

    def _index(self, entry: dict[str, Any]) -> int:
        index = entry.get("index")
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return index
        last = self._calls.get(self._last)
        new_id = entry.get("id") and (last is None or entry.get("id") != last.id)
        return max(self._calls, default=-1) + 1 if new_id or last is None else self._last

    def _add(self, index: int, entry: dict[str, Any]) -> None:
        call = self._calls.get(index)
        if call is None:
            if len(self._calls) >= MAX_CALLS:
                raise LLMError(
                    f"the provider sent over {MAX_CALLS} tool calls in one step",
                    kind="transient",
                )
            call = self._calls[index] = _Pieces()
        self._last = index
        if not call.id and isinstance(entry.get("id"), str):
            call.id = entry["id"]
        function = entry.get("function")
        if not isinstance(function, dict):
            return
        if not call.name and isinstance(function.get("name"), str):
            call.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            # Some servers send the arguments as the object itself, not its JSON text.
            arguments = json.dumps(arguments, ensure_ascii=False)
        if isinstance(arguments, str) and arguments:
            call.size += len(arguments.encode("utf-8", "surrogatepass"))
            if call.size > MAX_ARGUMENT_BYTES:
                raise LLMError(
                    f"the provider sent tool call arguments over {MAX_ARGUMENT_BYTES >> 10} KiB",
                    kind="transient",
                )
            call.arguments.append(arguments)


def entries_of(choices: object, field: str) -> list[dict[str, Any]]:
    """Each choice's `field` (its delta, its message) that is an object; choices of another
    shape, or none, give nothing."""
    if not isinstance(choices, list):
        return []
    return [
        choice[field]
        for choice in choices
        if isinstance(choice, dict) and isinstance(choice.get(field), dict)
    ]


def is_reasoning(delta: dict[str, Any]) -> bool:
    return any(delta.get(name) for name in REASONING_FIELDS)


def read_usage(usage: object, attempt: Attempt) -> None:
    """Take the provider's token counts into `attempt` when both are usable numbers; else
    the attempt goes on being counted by chunk."""
    if not isinstance(usage, dict):
        return
    prompt = _token_count(usage.get("prompt_tokens"))
    completion = _token_count(usage.get("completion_tokens"))
    if prompt is not None and completion is not None:
        attempt.prompt_tokens, attempt.completion_tokens = prompt, completion
        attempt.reported = True


def _token_count(value: object) -> int | None:
    """A count of tokens as a provider may spell it (5, 5.0, "5"); None if it is none."""
    if isinstance(value, bool):
        return None
    try:
        count = int(value) if isinstance(value, int | float | str) else None
    except (ValueError, OverflowError):  # "five", NaN, infinity, a string of 5000 digits
        return None
    if count is None or not 0 <= count <= MAX_REPORTED_TOKENS:
        return None
    return count
