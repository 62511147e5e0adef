"""The model behind the bot: a small interface, an OpenAI-compatible client and an offline echo.

A cycle asks `generate` for exactly one answer to one `Prompt`. `generate` owns the failure
policy: transient failures (timeouts, connection errors, 5xx, 429) are retried with jittered
exponential backoff that honours `Retry-After`; a context-length refusal shrinks the history
and tries once more, and a refusal of images drops them and tries once more; anything else
fails at once. A total deadline bounds all of it. What is left is raised as `LLMError`, and
the cycle apologises.

Completions are streamed by default, so that cancelling a generation (a newer message made it
stale) closes the connection and the provider stops generating, and paying, at once. The user
still gets one final message. Reasoning (`<think>` blocks, `reasoning_content`, thinking
parts) is never part of the answer.

An answer is text, tool calls, or both (`Answer`). Calls stream as pieces (`ToolCallPieces`):
arguments a few characters at a time, several calls in one step told apart by their index,
possibly interleaved; they are assembled here, bounded (`MAX_CALLS`, `MAX_ARGUMENT_BYTES`, a
name as Chat Completions allows one), and handed to the cycle whole.

"OpenAI-compatible" servers differ: content as a list of parts (Mistral), usage of any type,
junk between events, a proxy's HTML page with a 200. Replies are read raw, whatever their
shape: what is text is the answer, what is unusable is the transient `LLMError`, never a
TypeError that the cycle could not tell from a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import re
import ssl
import time
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import aiohttp
import httpx2

from bot.backoff import Backoff
from bot.blame import MODEL, blames
from bot.config.credentials import Credential
from bot.config.settings import LLMSettings, given_as
from bot.llm.prompt import Prompt
from bot.llm.tool_refusals import Refusal, Refusals, refusal
from bot.tokens import estimate
from bot.tools import ToolCall

if TYPE_CHECKING:
    import openai
    from openai import AsyncOpenAI

log = logging.getLogger(__name__)

T = TypeVar("T")

# A whole reasoning block, or one cut off by the token limit before it closed.
THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
# Some servers strip the opening tag and leave the closing one after the reasoning.
THINK_TAIL = re.compile(r"\A.*?</think>", re.DOTALL | re.IGNORECASE)
# Words providers use when a prompt does not fit the model's context.
CONTEXT_WORDS = ("context length", "context_length", "context window", "maximum context")
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
# most (`_until_finished`); after those, the rest of the body is read this long and this much
# at most (`_drain`). A provider ends the body at once; one that holds it open delays the reply
# by no more than these.
TAIL_S = 0.25
DRAIN_S = 0.05
DRAIN_CHARS = 64 << 10
# Above this a reported count is a glitch: no context window holds that many tokens, and it
# would overflow the usage counters in the store.
MAX_REPORTED_TOKENS = 100_000_000
# Connections to the provider at most, as the OpenAI client's own pool allows: one per
# generation in flight.
MAX_CONNECTIONS = 1000
# Where the OpenAI client sends requests when no base URL is set.
OPENAI_BASE_URL = "https://api.openai.com/v1"
KEY_SETTING = "LASTWORD_LLM__API_KEY"
# Tool calls in one step, and the arguments of one, at most: a provider that sends more is
# looping, and every call is recorded in the store before it runs.
MAX_CALLS = 64
MAX_ARGUMENT_BYTES = 64 << 10
# A tool's name as the model wrote it is kept up to this long: a name the model mangled
# ("functions.get_time") or invented is an error result the model reads, not a failed reply.
MAX_TOOL_NAME_CHARS = 256
# A call's id is echoed back to the provider and stored with its result: a sane length only.
MAX_CALL_ID_CHARS = 256
# Refusals of a request's tools one completion takes (each leaves a tool, or all, out); past
# them it is asked without tools, so a provider that names one bad tool after another costs
# a bounded number of requests.
MAX_TOOL_REFUSALS = 3


def strip_reasoning(text: str) -> str:
    """The answer without the model's reasoning, fit for the user and the history."""
    text = THINK_BLOCK.sub("", text)
    if "</think>" in text.lower():
        text = THINK_TAIL.sub("", text)
    return text.strip()


@dataclass
class Attempt:
    """Tokens one request used: as the provider reported them, or counted as they streamed."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = False


@dataclass
class Usage:
    """Tokens spent on one reply, over every attempt, including one cancelled midway."""

    attempts: list[Attempt] = field(default_factory=list)
    # Told the answer so far as it streams (live drafts); the reasoning is still in it.
    on_text: Callable[[str], None] | None = None

    def start(self) -> Attempt:
        attempt = Attempt()
        self.attempts.append(attempt)
        return attempt

    def totals(self, estimated_prompt: int) -> tuple[int, int]:
        """(prompt, completion) tokens; `estimated_prompt` stands in where none was reported."""
        prompt = sum(a.prompt_tokens if a.reported else estimated_prompt for a in self.attempts)
        return prompt, sum(a.completion_tokens for a in self.attempts)


@dataclass(frozen=True)
class Answer:
    """What the model answered: text, the tools it asked to call, or both (a line such as
    "Let me look that up." before the calls)."""

    text: str
    calls: tuple[ToolCall, ...] = ()


# "key": the provider refused the API key; permanent, and already logged once a minute by
# the key's `Credential`, so each burst's apology need not say it again at ERROR.
Kind = Literal["transient", "permanent", "key", "context", "images"]


class LLMError(Exception):
    """The model could not answer. Only `transient` failures are worth retrying as they are;
    a `context` failure is worth retrying with a shorter prompt, an `images` one without its
    images."""

    def __init__(self, message: str, *, kind: Kind, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after

    @property
    def permanent(self) -> bool:
        return self.kind != "transient"


class LLM(Protocol):
    """A model the core asks for replies. What it can do it declares (the core never tells
    models apart by name): `sees_images`, whether photos reach it as images (or are only
    described in words); `picks_models`, whether a person may pick one of the configured
    models with /model (the offline echo has no model to pick)."""

    name: str
    sees_images: bool
    picks_models: bool

    async def complete(self, prompt: Prompt, usage: Usage) -> Answer:
        """One completion for `prompt`, recording its tokens in `usage` as it goes."""
        ...

    def configure(self, settings: LLMSettings) -> None:
        """Take on reloaded settings (model, temperature...); the connection stays as it is."""
        ...

    async def close(self) -> None:
        """Close the connections to the provider, once the replica stops using the model."""
        ...


# The most pauses the echo model's streamed answer takes, whatever its length.
ECHO_STEPS = 25


class EchoLLM:
    """Offline and deterministic: answers with what it was asked. For demos and tests.

    It streams its answer a word at a time, `word_ms` apart, so that a live draft can be
    seen without a real endpoint."""

    name = "echo"
    sees_images = False
    picks_models = False

    def __init__(self, delay_ms: int = 0, word_ms: int = 0) -> None:
        self.delay_s = delay_ms / 1000
        self.word_s = word_ms / 1000

    def configure(self, settings: LLMSettings) -> None:
        self.delay_s = settings.echo_delay_ms / 1000
        self.word_s = settings.echo_word_ms / 1000

    async def close(self) -> None:
        return None

    async def complete(self, prompt: Prompt, usage: Usage) -> Answer:
        # Tools offered are ignored: the echo has nothing to ask of them.
        attempt = usage.start()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        answer = "You said: " + " / ".join(prompt.unanswered)
        if usage.on_text is not None:
            if self.word_s:
                # Word by word, each with the spaces before it, as typed text grows; a long
                # answer in at most ECHO_STEPS steps, so it never takes more than a moment.
                ends = [match.end() for match in re.finditer(r"\s*\S+", answer)]
                step = math.ceil(len(ends) / ECHO_STEPS)
                for end in ends[step - 1 :: step]:
                    usage.on_text(answer[:end])
                    await asyncio.sleep(self.word_s)
            usage.on_text(answer)
        attempt.completion_tokens = estimate(answer)
        return Answer(answer)


class OpenAILLM:
    """Chat Completions through the official client; any OpenAI-compatible server works."""

    name = "openai"
    sees_images = True
    picks_models = True

    def __init__(self, settings: LLMSettings) -> None:
        # Imported here: the client library costs half a second of start-up, wasted with echo.
        from openai import AsyncOpenAI

        self.settings = settings
        # Ask for the usage at the end of a stream until the provider says it cannot.
        self._stream_usage = True
        # What each model refused of the tools: left out of its requests for a while.
        self.refusals = Refusals()
        api_key = settings.api_key.get_secret_value() if settings.api_key else "unset"
        # Retries are ours (see `generate`), so that every attempt counts against one policy.
        self.client: AsyncOpenAI = AsyncOpenAI(
            base_url=settings.base_url,
            api_key=api_key,
            timeout=settings.timeout_s,
            max_retries=0,
            http_client=_http_client(settings.timeout_s),
        )
        where = settings.base_url or OPENAI_BASE_URL
        # Named as the operator gave it: a refused OPENAI_API_KEY from ./.env is reported so.
        configured = settings.api_key is not None
        named = given_as(("llm", "api_key")) if configured else KEY_SETTING
        self.key = Credential(named, f"the LLM provider at {where}", configured=configured)

    def configure(self, settings: LLMSettings) -> None:
        self.settings = settings

    async def close(self) -> None:
        await self.client.close()

    async def probe(self, timeout_s: float, *, level: int = logging.ERROR) -> None:
        """Whether the provider takes the key, into `self.key` (`probe_key`)."""
        headers = self.settings.extra_headers
        await probe_key(self.client, self.key, timeout_s, level=level, headers=headers)

    def _body(self, prompt: Prompt) -> dict[str, Any]:
        """The request's JSON body, `extra_body` merged in as the client would."""
        s = self.settings
        request: dict[str, Any] = {
            "model": prompt.model or s.model,
            "messages": prompt.messages(),
            "max_tokens": s.max_tokens,
            "stream": s.stream,
        }
        if s.stream and self._stream_usage:
            # The usage comes in a last chunk of its own, only when asked for.
            request["stream_options"] = {"include_usage": True}
        if s.temperature is not None:
            request["temperature"] = s.temperature
        if prompt.tools:
            request["tools"] = list(prompt.tools)
            if prompt.tool_choice is not None:
                request["tool_choice"] = prompt.tool_choice
        return request | s.extra_body

    @contextlib.asynccontextmanager
    async def _response(self, prompt: Prompt) -> AsyncIterator[httpx2.Response]:
        """The provider's response to the completion request, its body not read yet; closed
        when the block ends (a body not read to its end drops its connection).

        The body is JSON made here and posted as it is, through the client's `post`, which
        still adds the base URL, the key, the headers and the timeout, and raises its status
        errors. `chat.completions.create` would first walk the whole prompt through the
        client's typed transform, which cost about a third of each request's time in the
        client."""
        body = json.dumps(self._body(prompt), separators=(",", ":")).encode()
        response = await self.client.post(
            "/chat/completions",
            cast_to=httpx2.Response,
            content=body,
            options={"headers": self.settings.extra_headers},
            stream=True,
        )
        try:
            yield response
        finally:
            await response.aclose()

    @blames(MODEL)
    async def complete(self, prompt: Prompt, usage: Usage) -> Answer:
        """One completion. A request the provider refuses for a field it does not take
        (`stream_options`) or for its tools (`bot.llm.tool_refusals`) is asked again at once
        without them: nothing was generated, and the reply is still owed. Each such refusal
        takes something out of the request, and the tools are let go of after
        `MAX_TOOL_REFUSALS`, so the requests of one completion are bounded."""
        import openai

        refusals = 0
        while True:
            asked = self._with_tools_taken(prompt, bare=refusals >= MAX_TOOL_REFUSALS)
            attempt = usage.start()
            try:
                if self.settings.stream:
                    answer = await self._streamed(asked, attempt, usage.on_text)
                else:
                    answer = await self._whole(asked, attempt)
            except openai.APIStatusError as exc:
                if self._refuses_stream_options(exc):
                    usage.attempts.remove(attempt)
                    self._stream_usage = False
                    log.warning(
                        "the provider does not take stream_options; tokens are counted by chunk"
                    )
                    continue
                if self._refuses_tools(asked, exc):
                    usage.attempts.remove(attempt)
                    refusals += 1
                    continue
                raise self._status_error(exc) from None
            except openai.APIConnectionError as exc:
                raise LLMError(
                    f"cannot reach the provider: {type(exc).__name__}", kind="transient"
                ) from None
            break
        self.key.accepted()
        if not answer.text and not answer.calls:
            raise LLMError("the provider returned an empty reply", kind="transient")
        return Answer(well_formed(answer.text), answer.calls)

    def _with_tools_taken(self, prompt: Prompt, *, bare: bool) -> Prompt:
        """`prompt` offering only the tools its model takes, as far as this replica knows
        (none when `bare`); no `tool_choice` without tools, as providers insist."""
        if not prompt.tools:
            return prompt
        every, refused = self.refusals.refused(prompt.model or self.settings.model)
        if bare or every:
            return replace(prompt, tools=(), tool_choice=None)
        taken = tuple(tool for tool in prompt.tools if tool_name(tool) not in refused)
        if len(taken) == len(prompt.tools):
            return prompt
        return replace(prompt, tools=taken, tool_choice=prompt.tool_choice if taken else None)

    def _refuses_tools(self, asked: Prompt, exc: openai.APIStatusError) -> bool:
        """Whether the provider refused `asked` for its tools; if so, what it refused is
        remembered for the model (`Refusals.learn`, one WARNING)."""
        sent = [tool_name(tool) for tool in asked.tools]
        found = tools_refused(exc, sent, self._scrub)
        if found is None:
            return False
        self.refusals.learn(asked.model or self.settings.model, found)
        return True

    async def _whole(self, prompt: Prompt, attempt: Attempt) -> Answer:
        # Read raw, as streams are: the client's models take whatever shape came (a proxy's
        # HTML page arrives as a str, a choice as a string) and fail later in our hands.
        async with self._response(prompt) as response:
            return self._completion(await _body(response.aiter_bytes()), attempt)

    async def _streamed(
        self, prompt: Prompt, attempt: Attempt, on_text: Callable[[str], None] | None
    ) -> Answer:
        # The raw event stream rather than the client's chunk objects: building one pydantic
        # model per token cost about 80 us, which at a few hundred streams in flight kept a
        # replica's event loop busy enough to read the stream, and notice a newer message,
        # late. The client still makes the request and maps its status errors.
        text = ""
        calls = ToolCallPieces()
        # Leaving the block (also when this task is cancelled) drops the connection, which is
        # how a provider learns to stop generating.
        async with self._response(prompt) as response:
            kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind.endswith("json"):
                # A server that ignores `stream` answers with the whole completion at once.
                answer = self._completion(await _body(response.aiter_bytes()), attempt)
                if answer.text and on_text is not None:
                    on_text(answer.text)
                return answer
            if kind == "text/html":
                raise LLMError(
                    "the provider answered with a web page, not an event stream "
                    "(a proxy's error page?)",
                    kind="transient",
                )
            lines = response.aiter_lines()
            async with contextlib.aclosing(sse_events(lines)) as events:
                async for chunk in _until_finished(events, self._stream_usage):
                    piece = self._chunk_text(chunk, attempt, calls)
                    if piece:
                        text += piece
                        if on_text is not None:
                            on_text(text)
            await _drain(lines)
        return Answer(text, calls.calls())

    def _chunk_text(self, chunk: dict[str, Any], attempt: Attempt, calls: ToolCallPieces) -> str:
        """The answer text one stream chunk adds, whatever its shape; its tool call pieces go
        to `calls`, its tokens are noted in `attempt`. An error event is a transient
        `LLMError`."""
        if error := chunk.get("error"):
            raise LLMError(
                f"the provider failed mid-stream: {self._scrub(_error_message(error))}",
                kind="transient",
            )
        _read_usage(chunk.get("usage"), attempt)
        piece = ""
        for delta in _entries(chunk.get("choices"), "delta"):
            content = delta.get("content")
            pieces = delta.get("tool_calls")
            # Reasoning streams as its own field (or as thinking parts): billed, not shown.
            if not attempt.reported and (content or pieces or _reasoning(delta)):
                attempt.completion_tokens += 1  # about one token per chunk
            piece += content_text(content)
            if pieces:
                calls.add(pieces)
        return piece

    def _completion(self, body: bytes, attempt: Attempt) -> Answer:
        """The answer in a whole (not streamed) completion body, whatever its shape; its
        usage is noted in `attempt`. A body that is no completion is a transient `LLMError`."""
        payload = _json(body.decode("utf-8", "replace"))
        if not isinstance(payload, dict):
            raise LLMError(
                f"the provider's reply is not a completion: {self._scrub(_glimpse(body))}",
                kind="transient",
            )
        if error := payload.get("error"):
            raise LLMError(
                f"the provider failed: {self._scrub(_error_message(error))}", kind="transient"
            )
        _read_usage(payload.get("usage"), attempt)
        messages = _entries(payload.get("choices"), "message")
        if not messages:
            return Answer("")
        calls = ToolCallPieces()
        calls.add(messages[0].get("tool_calls"), whole=True)
        return Answer(content_text(messages[0].get("content")), calls.calls())

    def _refuses_stream_options(self, exc: openai.APIStatusError) -> bool:
        # Servers that predate it (older Azure OpenAI API versions, vLLM and Ollama) refuse
        # the whole request rather than ignore the field.
        return (
            self.settings.stream
            and self._stream_usage
            and exc.status_code in (400, 422)
            and "stream_options" in exc.message
        )

    def _status_error(self, exc: openai.APIStatusError) -> LLMError:
        status = exc.status_code
        code = _error_code(exc)
        message = self._scrub(exc.message)
        if status in (401, 403):
            self.key.refused(f"{status} to a completion", key_fix(self.key))
            return LLMError(f"{self.key.reason} ({status})", kind="key")
        if status == 404 or code == "model_not_found":
            return LLMError(
                f"model or endpoint not found (check LASTWORD_LLM__MODEL={self.settings.model!r}"
                f" and {given_as(('llm', 'base_url'))})",
                kind="permanent",
            )
        if status == 400 and (
            code == "context_length_exceeded" or any(w in message.lower() for w in CONTEXT_WORDS)
        ):
            return LLMError(f"the prompt is too long for the model: {message}", kind="context")
        if status == 400 and "image" in message.lower():
            return LLMError(f"the model refused the images: {message}", kind="images")
        # 408, 409 and 429 are worth another try, as the client library itself treats them.
        if status >= 500 or status in (408, 409, 429):
            return LLMError(
                f"provider answered {status}", kind="transient", retry_after=_retry_after(exc)
            )
        return LLMError(
            f"the provider rejected the request (check LASTWORD_LLM__MODEL="
            f"{self.settings.model!r}): {status} {message}",
            kind="permanent",
        )

    def _scrub(self, text: str) -> str:
        """A provider's own words, fit for logs: some echo the key they were given."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return text.replace(key, "***") if key else text


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
            event = _json(payload)
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


async def _until_finished(
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


async def _drain(lines: AsyncIterator[str]) -> None:
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


async def _body(chunks: AsyncIterator[bytes]) -> bytes:
    """A whole response body, at most `MAX_BODY_BYTES` of it."""
    body = bytearray()
    async for chunk in _unbroken(chunks):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise LLMError("the provider's reply is too long to be one", kind="transient")
    return bytes(body)


def _json(text: str) -> object:
    """The JSON value in `text`, or None if it holds none."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None


def _glimpse(body: bytes) -> str:
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


def _entries(choices: object, field: str) -> list[dict[str, Any]]:
    """Each choice's `field` (its delta, its message) that is an object; choices of another
    shape, or none, give nothing."""
    if not isinstance(choices, list):
        return []
    return [
        choice[field]
        for choice in choices
        if isinstance(choice, dict) and isinstance(choice.get(field), dict)
    ]


def _reasoning(delta: dict[str, Any]) -> bool:
    return any(delta.get(name) for name in REASONING_FIELDS)


def _read_usage(usage: object, attempt: Attempt) -> None:
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


def tool_name(tool: dict[str, Any]) -> str:
    """The name of a Chat Completions `tools` entry."""
    function = tool.get("function")
    return str(function.get("name", "")) if isinstance(function, dict) else ""


def tools_refused(
    exc: openai.APIStatusError, sent: Sequence[str], scrub: Callable[[str], str] = str
) -> Refusal | None:
    """What of the tools `sent` (their names, in order) the provider's error refused
    (`bot.llm.tool_refusals.refusal`), its words `scrub`bed; None if it is no refusal of them."""
    param = getattr(exc, "param", None)
    words = scrub(provider_words(exc))
    return refusal(exc.status_code, words, param if isinstance(param, str) else None, sent)


def provider_words(exc: openai.APIStatusError) -> str:
    """What the provider said, without the client's "Error code: 400 - " before it: its
    error's message, or its body when that is text (Ollama's own API answers
    `{"error": "... does not support tools"}`, which the client leaves out of the message)."""
    said = re.sub(r"^Error code: \d+(?: - )?", "", exc.message)
    body = exc.body
    return f"{said} {body}".strip() if isinstance(body, str) and body not in said else said


def _error_message(error: object) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or "no reason given")


def _error_code(exc: openai.APIStatusError) -> str | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else None


def _retry_after(exc: openai.APIStatusError) -> float | None:
    """Seconds the provider asked us to wait, from `retry-after-ms` or `retry-after` (seconds
    or an HTTP date); None if it did not say."""
    headers = exc.response.headers
    try:
        if "retry-after-ms" in headers:
            return max(float(headers["retry-after-ms"]) / 1000, 0.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(float(value), 0.0)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(when.timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


def _http_client(timeout_s: float) -> httpx2.AsyncClient:
    """The OpenAI client's HTTP client, as its default one (redirects followed, the same
    certificates), sending over aiohttp (`AiohttpTransport`)."""
    transport = AiohttpTransport(httpx2.create_ssl_context())
    return httpx2.AsyncClient(transport=transport, timeout=timeout_s, follow_redirects=True)


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport (what the OpenAI client sends through) over an aiohttp session.

    httpx's connection pool looks over every pooled connection on each request, checking
    each for expiry with a system call or two, and parses responses in Python: with a hundred
    generations streaming at once, a flooded replica spent about a sixth of its event loop
    there. aiohttp keeps idle connections per host in a queue and parses HTTP in C. Above it
    the client is unchanged: base URL, key, headers, status errors; each request's timeouts
    are honoured here, and a transport failure is raised as the httpx2 error the client maps.
    Proxies come from the environment, as httpx takes them (`_proxy`).
    """

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        self._ssl = ssl_context
        # Made on the first request, on the loop that sends it.
        self._session: aiohttp.ClientSession | None = None
        # HTTPS_PROXY, NO_PROXY and the like, read once, as httpx reads them for its client.
        self._proxies = urllib.request.getproxies()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        limits = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            connect=limits.get("pool"),
            sock_connect=limits.get("connect"),
            sock_read=limits.get("read"),
        )
        try:
            response = await self._session_now().request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=await request.aread(),
                timeout=timeout,
                allow_redirects=False,
                proxy=self._proxy(request.url),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc
        return httpx2.Response(
            response.status,
            headers=response.raw_headers,
            stream=_AiohttpBody(response),
            extensions={"reason_phrase": (response.reason or "").encode()},
        )

    def _proxy(self, url: httpx2.URL) -> str | None:
        """The proxy the environment names for `url`, if any."""
        if not self._proxies or urllib.request.proxy_bypass(url.host):
            return None
        return self._proxies.get(url.scheme) or self._proxies.get("all")

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=self._ssl)
            # The body as sent: httpx decodes it, by its headers. Cookies are httpx's too (it
            # sets them on the request). No trust_env: it reads ~/.netrc in a thread on every
            # request; the proxies it would take from the environment come from `_proxy`.
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session


class _AiohttpBody(httpx2.AsyncByteStream):
    """A response body as httpx2 reads it: the chunks as they come."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc

    async def aclose(self) -> None:
        # A body read to its end leaves its connection to the next request; one cut short (a
        # cancelled generation) drops it, which is how the provider learns to stop.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _httpx_error(exc: aiohttp.ClientError | TimeoutError) -> Exception:
    """The httpx2 error the OpenAI client expects for an aiohttp failure."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx2.ConnectTimeout(str(exc))
    if isinstance(exc, TimeoutError):
        return httpx2.ReadTimeout(str(exc))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx2.ConnectError(str(exc))
    return httpx2.ReadError(str(exc))


async def generate(llm: LLM, prompt: Prompt, settings: LLMSettings, usage: Usage) -> Answer:
    """One answer for the prompt, reasoning stripped from its text, within
    `settings.deadline_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.deadline_s
    # Uncapped in effect: a wait past the deadline is refused below.
    backoff = Backoff(settings.retry_base_s, settings.deadline_s, jitter=0.5)
    shrunk = False
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                answer = await llm.complete(prompt, usage)
            text = strip_reasoning(answer.text)
            if not text and not answer.calls:
                raise LLMError("the reply was all reasoning and no answer", kind="transient")
            return Answer(text, answer.calls)
        except TimeoutError:
            raise LLMError(
                f"no answer within LASTWORD_LLM__DEADLINE_S={settings.deadline_s:g}s",
                kind="permanent",
            ) from None
        except LLMError as exc:
            if exc.kind == "context" and not shrunk:
                smaller = prompt.shrunk()
                if smaller is not None:
                    log.warning(
                        "%s; retrying once with %d of %d history turns (and no room lines)",
                        exc,
                        len(smaller.history),
                        len(prompt.history),
                    )
                    prompt, shrunk = smaller, True
                    continue
            if exc.kind == "images" and any(prompt.images):
                # LASTWORD_MEDIA__VISION says it can see, the provider says not: the reply is
                # still owed, so it goes without them, the model told what it missed.
                log.warning(
                    "%s; retrying once without them (set LASTWORD_MEDIA__VISION=off, or "
                    "take the model out of LASTWORD_MEDIA__VISION_MODELS)",
                    exc,
                )
                prompt = prompt.without_images()
                continue
            if exc.kind != "transient" or backoff.failures >= settings.retries:
                raise
            delay = max(backoff.next_delay(), exc.retry_after or 0.0)
            if loop.time() + delay >= deadline:
                raise LLMError(
                    f"{exc}; the next attempt would miss LASTWORD_LLM__DEADLINE_S",
                    kind="permanent",
                ) from None
            log.warning(
                "LLM attempt %d failed (%s); retrying in %.2fs", backoff.failures, exc, delay
            )
            await asyncio.sleep(delay)


def key_fix(key: Credential) -> str:
    """What to do about a key the provider refused, or wants and does not have."""
    if key.configured:
        return f"fix {key.setting}, or its permissions at the provider"
    return f"set {key.setting}"


async def probe_key(
    client: AsyncOpenAI,
    key: Credential,
    timeout_s: float,
    *,
    level: int = logging.ERROR,
    headers: dict[str, str] | None = None,
) -> None:
    """Ask the provider whether it takes `key` (GET /models, within `timeout_s`, no
    retries) and tell `key` the answer: a 401 or 403 is a refusal, logged at `level`; a
    model list, an acceptance. Anything else (no /models, the server down) tells nothing."""
    import openai

    try:
        await client.with_options(timeout=timeout_s, max_retries=0).models.list(
            extra_headers=headers or None
        )
    except openai.APIStatusError as exc:
        if exc.status_code in (401, 403):
            key.refused(f"{exc.status_code} to GET /models", key_fix(key), level=level)
        return
    except (openai.APIError, TimeoutError):
        return
    key.accepted()


def make_llm(settings: LLMSettings, provider: Literal["openai", "echo"]) -> LLM:
    if provider == "openai":
        return OpenAILLM(settings)
    return EchoLLM(settings.echo_delay_ms, settings.echo_word_ms)
