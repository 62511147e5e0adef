"""A loopback fake of an OpenAI-compatible Chat Completions and audio transcription server,
for tests.

The bot talks to its language model through the real ``openai`` client library. Tests drive
that same client against this fake instead of mocking it, so the wire format (JSON bodies,
SSE streaming with the ``[DONE]`` terminator, error bodies, ``Retry-After`` headers) and the
client's own behaviour (exception classes, retries, timeouts, cancellation) are exercised for
real, while the test keeps full control: it scripts replies and errors, adds latency, holds
requests in flight, and sees every request, including whether the caller gave up on it.

Usage::

    async with FakeOpenAI() as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        ...
        assert fake.requests[0].last_user_text == "hi"

Images arrive as content parts of user messages (`RecordedRequest.user_parts()`,
`image_urls()`), validated as OpenAI does; voice notes go to ``base_url + "/audio/transcriptions"``
and are recorded in `FakeOpenAI.transcriptions`.

Providers that are only nearly compatible are played with `RawReply`: a chat request answered
byte for byte as scripted (events of any shape, junk between them, an HTML page with a 200, a
connection cut after so many bytes)::

    fake.answer_next(RawReply.events(RawReply.chunk({"content": [{"type": "text", "text": "hi"}]})))

Tools: a request's `tools`, `tool_choice` and tool messages are validated as OpenAI validates
them and recorded (`RecordedRequest.tools`, `tool_calls()`, `tool_results()`). An answer that
calls tools is a `ToolCalls`, queued or returned by the reply function, and streamed as OpenAI
streams one (a first piece with the call's id, type and name, then its arguments in pieces,
finish_reason "tool_calls")::

    fake.answer_next(ToolCalls([("get_current_time", '{"timezone": "UTC"}')]))

Servers that apply a strict chat template (vLLM, llama.cpp) are played with `strict_roles`: a
request whose turns do not start with the user's and alternate is refused with their 400.
Models that take no tools are played with `refuse_tools` (400 "does not support tools", as
Ollama's small models answer), providers that take a subset of JSON schema with
`refuse_format` (a tool whose parameters use that `format` refused, by name or not); what they
refuse is kept in `rejected`, not in `requests`.

`ToolPolicy` is a reply function that plays a model using a tool on its own, call -> result ->
text, for tests whose bot runs unattended. The fake always lives in the test's process; bots in
other processes (`lastword run` replicas) only talk to it over HTTP, so a policy set on it, as
its `reply` or through the constructor, governs their requests too::

    async with FakeOpenAI(reply=ToolPolicy("get_current_time", '{"timezone": "UTC"}')) as fake:
        ...
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from aiohttp import BodyPartReader, hdrs, web

from tests.support.fakes.loopback import LoopbackServer

__all__ = [
    "FAKE_MODEL_ID",
    "IMAGE_TOKENS",
    "FakeOpenAI",
    "RawReply",
    "RecordedRequest",
    "ScriptedError",
    "SeenCall",
    "SeenResult",
    "ToolCalls",
    "ToolPolicy",
    "TranscriptionRequest",
]

FAKE_MODEL_ID = "fake-model"

# A stream held open after `[DONE]` (`FakeOpenAI.after_done`): how often it sends a comment,
# and how long it is held at most, so that a client that never hangs up cannot keep a test's
# server from stopping.
KEEPALIVE_EVERY_S = 1.0
HOLD_AFTER_DONE_S = 60.0
AfterDone = Literal["end", "keep-alive", "silent"]

# Leading whitespace, then each word with the whitespace after it: the pieces concatenate back to
# the exact reply, so a client that joins deltas must reproduce it byte for byte.
_PIECE_RE = re.compile(r"^\s+|\S+\s*")

# What one image adds to prompt_tokens, by its `detail`. Fixed, because the fake does not decode
# images: OpenAI's published rule for a 1024 px square at detail "high" (or "auto", which picks
# high for such a size) is 85 base + 170 per 512 px tile x 4 tiles = 765; "low" is a flat 85.
IMAGE_TOKENS: dict[str, int] = {"low": 85, "high": 765, "auto": 765}

# The content part types the Chat Completions API knows; others are refused like it refuses them.
_PART_TYPES = ("text", "image_url", "input_audio", "file", "refusal")
_DATA_URL_RE = re.compile(r"data:(?P<mime>[^;,]*)(?P<b64>;base64)?,(?P<data>.*)", re.DOTALL)
_RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
# What Chat Completions takes as a function's name, and as `tool_choice` besides a named one.
_TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]+")
_TOOL_NAME_CHARS = 64
_TOOL_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class SeenCall:
    """A tool call in a request's assistant messages: what the bot says the model asked."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class SeenResult:
    """A `tool` message of a request: the call it answers, that call's tool, and its text."""

    call_id: str
    name: str
    text: str


@dataclass
class RecordedRequest:
    """One chat completion request as the fake received it, and what became of it."""

    api_key: str
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    body: dict[str, Any]
    # Keys are lower-cased: HTTP header names are case-insensitive, and tests should not depend
    # on how the client library happens to spell them.
    headers: dict[str, str]
    started_at: float
    # The client's port, which names the TCP connection that carried it: requests that share
    # one came over a pooled, reused connection.
    connection: int = 0
    finished: bool = False
    cancelled: bool = False
    # When the answer's last byte went out (`time.monotonic()`), once finished: a stream's
    # `[DONE]`, whether or not the stream ended there (`FakeOpenAI.after_done`).
    ended_at: float | None = None
    # The client hung up on a body held open after its answer (`FakeOpenAI.after_done`).
    hung_up: bool = False
    # The fake cut the connection itself (break_next_stream("drop"), RawReply.cut_after).
    dropped: bool = False
    # The prompt tokens the provider bills for this request (the same estimate as its usage
    # answer): paid once the request lands, so a request cancelled and made again pays twice.
    prompt_tokens: int = 0
    # Content pieces written to a stream so far (about one token each): what the provider
    # generated, and billed, before the client finished or hung up. For a `RawReply`, the
    # pieces of its body written so far.
    pieces_streamed: int = 0

    @property
    def last_user_text(self) -> str:
        """The last user message's text (its text parts joined, images left out)."""
        return "".join(text for kind, text in self.user_parts() if kind == "text")

    def user_parts(self) -> list[tuple[str, str]]:
        """The last user message's content in order: ("text", text) and ("image", url) pairs.

        A plain string content is one text part; parts of other types (audio, files) are left
        out. Empty when the request has no user message.
        """
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _parts(message.get("content"))
        return []

    def image_urls(self) -> list[str]:
        """Every image URL of the request, in message and part order, whatever the role."""
        return [
            url
            for message in self.messages
            for kind, url in _parts(message.get("content"))
            if kind == "image"
        ]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools offered, as sent (validated); empty when none were."""
        return list(self.body.get("tools") or [])

    @property
    def tool_names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]

    @property
    def tool_choice(self) -> Any:
        """The request's `tool_choice` as sent; None when it had none."""
        return self.body.get("tool_choice")

    def tool_steps(self, *, this_turn: bool = False) -> list[list[SeenCall]]:
        """The calls of each assistant message that made some, in order; `this_turn`: only
        those after the last user message (the steps of the reply being generated)."""
        return [
            [
                SeenCall(call["id"], call["function"]["name"], call["function"]["arguments"])
                for call in message["tool_calls"]
            ]
            for message in self._messages(this_turn)
            if message.get("role") == "assistant" and message.get("tool_calls")
        ]

    def tool_calls(self, *, this_turn: bool = False) -> list[SeenCall]:
        """The calls of `tool_steps`, one list."""
        return [call for step in self.tool_steps(this_turn=this_turn) for call in step]

    def tool_results(self, *, this_turn: bool = False) -> list[SeenResult]:
        """The request's `tool` messages, in order, each named by the call it answers."""
        names = {call.id: call.name for call in self.tool_calls()}
        return [
            SeenResult(
                m["tool_call_id"], names.get(m["tool_call_id"], ""), _content_text(m.get("content"))
            )
            for m in self._messages(this_turn)
            if m.get("role") == "tool"
        ]

    def _messages(self, this_turn: bool) -> list[dict[str, Any]]:
        if not this_turn:
            return self.messages
        users = [i for i, m in enumerate(self.messages) if m.get("role") == "user"]
        return self.messages[users[-1] + 1 :] if users else self.messages


@dataclass
class TranscriptionRequest:
    """One `/audio/transcriptions` request as the fake received it, and what became of it."""

    api_key: str
    model: str
    # The file part as sent: its name and Content-Type (empty when the part carried none).
    filename: str
    content_type: str
    size: int
    sha256: str
    # Every other form field (language, prompt, response_format, temperature, ...), as text.
    fields: dict[str, str]
    headers: dict[str, str]
    started_at: float
    # Kept whole so a test can compare the audio, but out of repr: it can be megabytes.
    data: bytes = field(default=b"", repr=False)
    finished: bool = False
    cancelled: bool = False
    ended_at: float | None = None

    @property
    def response_format(self) -> str:
        return self.fields.get("response_format", "json")

    @property
    def language(self) -> str | None:
        return self.fields.get("language")

    @property
    def prompt(self) -> str | None:
        return self.fields.get("prompt")


@dataclass
class ScriptedError:
    """An HTTP error the fake answers with instead of a completion."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RawReply:
    """A chat answer written as it is, whatever the request asked for: its body's pieces in
    order, each written (and flushed) on its own, as a provider or a proxy in front of it might
    send them. Nothing in it is checked: it is how tests meet the shapes real servers send."""

    pieces: list[bytes]
    content_type: str = "text/event-stream"
    status: int = 200
    # Close the connection once this many bytes of the body are out, the rest unsent: the
    # client sees a body that stops there (None: the body goes out whole).
    cut_after: int | None = None
    # Before each piece, so that a test can act while the body is being written.
    pause_s: float = 0.0
    # Once the pieces are out: end the body, or hold it open (`FakeOpenAI.after_done`).
    after: AfterDone = "end"

    @property
    def body(self) -> bytes:
        """What goes out, the cut left out."""
        whole = b"".join(self.pieces)
        return whole if self.cut_after is None else whole[: self.cut_after]

    @classmethod
    def events(
        cls,
        *events: object,
        done: bool = True,
        cut_after: int | None = None,
        pause_s: float = 0.0,
        after: AfterDone = "end",
    ) -> RawReply:
        """A server-sent event stream: each event that is bytes goes out as it is (junk lines,
        comments, a half event), any other is JSON in one `data:` event; `[DONE]` ends it
        unless `done` is False."""
        pieces = [e if isinstance(e, bytes) else _data(json.dumps(e)) for e in events]
        if done:
            pieces.append(_data("[DONE]"))
        return cls(pieces, cut_after=cut_after, pause_s=pause_s, after=after)

    @classmethod
    def json(cls, payload: object, *, cut_after: int | None = None) -> RawReply:
        """A whole JSON body of any shape, as a plain (not streamed) completion comes."""
        return cls([json.dumps(payload).encode()], "application/json", cut_after=cut_after)

    @classmethod
    def html(cls, status: int = 200) -> RawReply:
        """A proxy's error page, served with `status` (a 200 by some proxies)."""
        page = (
            "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
            "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
            "</body>\r\n</html>\r\n"
        )
        return cls([page.encode()], "text/html", status=status)

    @staticmethod
    def chunk(delta: object, **fields: object) -> dict[str, object]:
        """A stream chunk with one choice whose delta is `delta`, as it is; `fields` add to
        the chunk or replace its own (`usage=...`, `choices=...`)."""
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return {
            "id": _completion_id(),
            "object": "chat.completion.chunk",
            "created": 0,
            "model": FAKE_MODEL_ID,
            "choices": [choice],
        } | fields

    @staticmethod
    def completion(message: object, **fields: object) -> dict[str, object]:
        """A whole completion with one choice whose message is `message`, as it is; `fields`
        add to it or replace its own."""
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        return {
            "id": _completion_id(),
            "object": "chat.completion",
            "created": 0,
            "model": FAKE_MODEL_ID,
            "choices": [choice],
        } | fields


@dataclass(frozen=True)
class ToolCalls:
    """A chat answer that calls tools: each call as (name, arguments as JSON text), in order,
    after `text` if any. Streamed as OpenAI streams one: per call a first piece with its index,
    id, type and name and empty arguments, then the arguments `piece_chars` characters a
    piece; call after call, or `interleave`d (round robin), as some servers send them. Not
    streamed: one message with `tool_calls`. `ids`: one per call; none given, each is made up
    as OpenAI makes them."""

    calls: Sequence[tuple[str, str]]
    text: str = ""
    ids: Sequence[str] = ()
    interleave: bool = False
    # "tool_calls" as OpenAI says; some servers say "stop" with calls all the same.
    finish_reason: str = "tool_calls"
    piece_chars: int = 4

    def entries(self) -> list[dict[str, Any]]:
        """The calls as a message's `tool_calls`."""
        ids = list(self.ids) or ["call_" + uuid.uuid4().hex[:24] for _ in self.calls]
        return [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, (name, args) in zip(ids, self.calls, strict=True)
        ]

    def deltas(self) -> list[dict[str, Any]]:
        """The deltas that stream the calls, one piece of one call each."""
        per_call: list[list[dict[str, Any]]] = []
        for index, entry in enumerate(self.entries()):
            arguments = entry["function"]["arguments"]
            first = entry | {"index": index, "function": entry["function"] | {"arguments": ""}}
            step = max(self.piece_chars, 1)
            rest = [
                {"index": index, "function": {"arguments": arguments[at : at + step]}}
                for at in range(0, len(arguments), step)
            ]
            per_call.append([first, *rest])
        if self.interleave:
            pieces = [p for row in itertools.zip_longest(*per_call) for p in row if p is not None]
        else:
            pieces = [piece for call in per_call for piece in call]
        return [{"tool_calls": [piece]} for piece in pieces]

    def tokens(self) -> int:
        """What the provider bills for generating it (text and calls)."""
        return _estimate_tokens(self.text) + sum(
            _estimate_tokens(name + arguments) for name, arguments in self.calls
        )


def _data(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


class _Outcome(Protocol):
    """What becomes of a recorded request: the flags tests wait on, and when it ended."""

    finished: bool
    cancelled: bool
    ended_at: float | None


_T = TypeVar("_T")


@dataclass(frozen=True)
class _Invalid:
    """Why a request is answered 400, as the fields of OpenAI's error body."""

    message: str
    param: str | None = None
    code: str | None = None

    def response(self) -> web.Response:
        body = _error_body(self.message, "invalid_request_error", self.code, param=self.param)
        return web.json_response(body, status=400)


def _parts(content: Any) -> list[tuple[str, str]]:
    # Content may be a plain string or a list of typed parts (text, image_url, ...); requests
    # that reach here were validated, but a scripted reply may look at any message.
    if isinstance(content, str):
        return [("text", content)]
    parts: list[tuple[str, str]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append(("text", str(part.get("text", ""))))
        elif part.get("type") == "image_url" and isinstance(part.get("image_url"), dict):
            parts.append(("image", str(part["image_url"].get("url", ""))))
    return parts


def _content_text(content: Any) -> str:
    return "".join(text for kind, text in _parts(content) if kind == "text")


def _client_port(request: web.Request) -> int:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return int(peer[1]) if peer else 0


def _estimate_tokens(text: str) -> int:
    return len(text) // 4 + 1


def _error_body(
    message: str, type_: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _default_reply(request: RecordedRequest) -> str:
    return "You said: " + request.last_user_text


@dataclass
class ToolPolicy:
    """A reply function that plays a model using one tool, so that a whole call -> result ->
    text loop runs unattended (bots in other processes included: see the module's docstring).

    While a request offers `tool`, allows calls (its tool_choice is not "none") and has had
    fewer than `steps` steps calling it since its user turn, it calls `tool` once per entry of
    `arguments` in one step. Then it answers in text: `answer` with `{result}` (the tool's last
    result in this turn), `{results}` (all of them, one a line) and `{user}` (the user turn)
    filled in; or, if the tool gave no result in this turn, `otherwise`'s reply (the fake's
    echo by default). `arguments` may be a function of the request, for calls that depend on
    what was asked; a model asked again with the same request calls the same way.
    """

    tool: str
    arguments: str | Sequence[str] | Callable[[RecordedRequest], Sequence[str]] = "{}"
    steps: int = 1
    answer: str = "The tool said: {result}"
    otherwise: Callable[[RecordedRequest], str] = _default_reply
    interleave: bool = False

    def __call__(self, request: RecordedRequest) -> str | ToolCalls:
        if self._calls_now(request):
            return ToolCalls(
                [(self.tool, a) for a in self._arguments(request)], interleave=self.interleave
            )
        results = [r.text for r in request.tool_results(this_turn=True) if r.name == self.tool]
        if not results:
            return self.otherwise(request)
        return (
            self.answer.replace("{results}", "\n".join(results))
            .replace("{result}", results[-1])
            .replace("{user}", request.last_user_text)
        )

    def _calls_now(self, request: RecordedRequest) -> bool:
        if self.tool not in request.tool_names or request.tool_choice == "none":
            return False
        steps = request.tool_steps(this_turn=True)
        return sum(any(c.name == self.tool for c in step) for step in steps) < self.steps

    def _arguments(self, request: RecordedRequest) -> Sequence[str]:
        if isinstance(self.arguments, str):
            return [self.arguments]
        return self.arguments(request) if callable(self.arguments) else self.arguments


def _default_transcript(request: TranscriptionRequest) -> str:
    return f"transcript of {request.filename}"


def _bearer_key(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    return auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""


class FakeOpenAI(LoopbackServer):
    """Fake OpenAI Chat Completions and transcription server on 127.0.0.1, OS-chosen port."""

    def __init__(self, reply: Callable[[RecordedRequest], str | ToolCalls] | None = None) -> None:
        super().__init__()
        # What each chat request is answered: text, or tool calls (`ToolPolicy` decides
        # from the request).
        self.reply: Callable[[RecordedRequest], str | ToolCalls] = reply or _default_reply
        self.requests: list[RecordedRequest] = []
        # Applies to every answer, scripted errors included, because a slow upstream is slow
        # whatever it ends up saying.
        self.delay_s: float = 0.0
        # Per request instead of delay_s when set: a provider whose latency varies.
        self.delay_for: Callable[[RecordedRequest], float] | None = None
        # Of that latency, how long a stream waits before its first piece (time to first
        # token: queueing and prefill); the rest is spread over the pieces. None: no wait.
        self.first_token_for: Callable[[RecordedRequest], float] | None = None
        # Reasoning streamed as `reasoning_content` ahead of the answer (or sent alongside
        # it when not streaming), as reasoning models on some servers do.
        self.reasoning: Callable[[RecordedRequest], str] | None = None
        self._errors: list[ScriptedError] = []
        # Chat requests answered as scripted, in order, once scripted errors are used up: raw
        # bytes, or tool calls sent as the provider sends them.
        self.raw_replies: list[RawReply | ToolCalls] = []
        self._breaks: list[Literal["error", "drop"]] = []
        # Answer a request carrying `stream_options` with a 400, as servers that predate it do
        # (older Azure OpenAI API versions, vLLM and Ollama).
        self.refuse_stream_options = False
        # Refuse (400) any request that offers tools, as a model without tool support does
        # (Ollama's small models: "<model> does not support tools").
        self.refuse_tools = False
        # Refuse (400) a request offering a tool whose parameters use this `format` anywhere
        # (e.g. "date-time"), as providers that take a subset of JSON schema do; the message
        # names the function and its place in `tools` when `schema_refusal_names_tool`.
        self.refuse_format: str | None = None
        self.schema_refusal_names_tool = True
        # Refuse (400) a request whose turns a strict chat template would refuse, as vLLM and
        # llama.cpp do with such templates (`strict_turns`): off, as OpenAI takes any order.
        self.strict_roles = False
        # What a stream does after its `[DONE]`: end, as the real API does, or stay open, as
        # some proxies and self-hosted servers do: with a `: keep-alive` comment every
        # `KEEPALIVE_EVERY_S`, or silent, until the client hangs up (`hung_up`) or
        # `HOLD_AFTER_DONE_S` passes. The request is `finished` at its `[DONE]` either way.
        self.after_done: AfterDone = "end"
        # Bodies of the requests answered 400 before they were recorded as requests.
        self.rejected: list[Any] = []
        # The model's context in tokens, when set: a request whose prompt (by the fake's own
        # estimate) and `max_tokens` together exceed it is refused as a real server refuses
        # it (400, context_length_exceeded), and kept in `rejected`.
        self.context_tokens: int | None = None
        # The key every request must carry as its bearer token; None accepts any key. A request
        # without one is answered 401 either way, as the real API does.
        self.expected_api_key: str | None = None
        # -- /audio/transcriptions: what each file says, and the same knobs as chat's.
        self.transcribe: Callable[[TranscriptionRequest], str] = _default_transcript
        self.transcriptions: list[TranscriptionRequest] = []
        # Before every transcription answer, scripted errors included: long enough, a test can
        # interrupt the bot while it waits for the words.
        self.transcription_delay_s: float = 0.0
        self._transcription_errors: list[ScriptedError] = []
        # Form fields (the file as its name) of transcription requests answered 400.
        self.rejected_transcriptions: list[dict[str, str]] = []
        self._gate = asyncio.Event()
        self._gate.set()
        self._transcriptions_gate = asyncio.Event()
        self._transcriptions_gate.set()
        self._stopping = False
        # Replaced on every state change so waiters can sleep on "something changed" without
        # polling and without needing a lock from synchronous code paths.
        self._changed = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_post("/v1/audio/transcriptions", self._handle_transcription)

    def _before_stop(self) -> None:
        # Held requests would otherwise keep cleanup waiting until its timeout.
        self._gate.set()
        self._transcriptions_gate.set()
        self._stopping = True

    @property
    def base_url(self) -> str:
        return self.origin + "/v1"

    # -- scripting ---------------------------------------------------------------------------

    def hold(self) -> None:
        """From now on, chat requests wait (after being recorded) until release().

        Transcriptions are not held (`hold_transcriptions` holds them)."""
        self._gate.clear()

    def release(self) -> None:
        """Let held requests, and future ones, proceed."""
        self._gate.set()

    def hold_transcriptions(self) -> None:
        """From now on, transcriptions wait (after being recorded) until
        `release_transcriptions()`: in flight for as long as a test needs, however slowly the
        machine runs it."""
        self._transcriptions_gate.clear()

    def release_transcriptions(self) -> None:
        self._transcriptions_gate.set()

    def fail_next(self, *errors: ScriptedError) -> None:
        """Queue errors; each following request answers with the next one instead of a reply."""
        self._errors.extend(errors)

    def answer_next(self, *replies: RawReply | ToolCalls) -> None:
        """Queue answers; each following chat request (scripted errors first) is answered with
        the next one instead of a reply: a `RawReply` byte for byte, `ToolCalls` streamed or
        not as the request asked."""
        self.raw_replies.extend(replies)

    def fail_next_transcription(self, *errors: ScriptedError) -> None:
        """Queue errors for transcriptions, apart from chat's: each following transcription
        request answers with the next one instead of a transcript."""
        self._transcription_errors.extend(errors)

    def break_next_stream(self, how: Literal["error", "drop"]) -> None:
        """The next streamed answer stops halfway: with an error event, as providers send
        when they fail mid-generation (`error`), or by dropping the connection (`drop`)."""
        self._breaks.append(how)

    @staticmethod
    def rate_limited(retry_after_s: float) -> ScriptedError:
        return ScriptedError(
            status=429,
            body=_error_body(
                "Rate limit reached for requests. Please try again later.",
                "requests",
                "rate_limit_exceeded",
            ),
            headers={"Retry-After": f"{retry_after_s:g}"},
        )

    @staticmethod
    def server_error() -> ScriptedError:
        return ScriptedError(
            status=500,
            body=_error_body(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
            ),
        )

    @staticmethod
    def context_length() -> ScriptedError:
        return ScriptedError(
            status=400,
            body=_error_body(
                "This model's maximum context length is 8192 tokens. "
                "Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
                param="messages",
            ),
        )

    @staticmethod
    def unauthorized() -> ScriptedError:
        return ScriptedError(
            status=401,
            body=_error_body(
                "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            ),
        )

    @staticmethod
    def no_api_key() -> ScriptedError:
        return ScriptedError(
            status=401,
            body=_error_body(
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                "invalid_request_error",
                None,
            ),
        )

    @staticmethod
    def model_not_found() -> ScriptedError:
        return ScriptedError(
            status=404,
            body=_error_body(
                "The model does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
                param="model",
            ),
        )

    # -- observation -------------------------------------------------------------------------

    async def wait_for_request(
        self,
        predicate: Callable[[RecordedRequest], bool] = lambda r: True,
        # A plain parameter rather than asyncio.timeout() at the call site: the spec'd API, and
        # a hung test should fail fast with a default even when the caller forgot one.
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> RecordedRequest:
        """Return the first request, present or future, matching predicate.

        The predicate is re-checked whenever a request arrives, finishes or is cancelled, so it
        may also wait on those flags. Raises TimeoutError after ``timeout`` seconds.
        """
        return await self._wait_for(self.requests, predicate, timeout)

    async def wait_for_transcription(
        self,
        predicate: Callable[[TranscriptionRequest], bool] = lambda t: True,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> TranscriptionRequest:
        """wait_for_request() for transcription requests."""
        return await self._wait_for(self.transcriptions, predicate, timeout)

    async def _wait_for(
        self,
        items: list[_T],
        predicate: Callable[[_T], bool],
        timeout: float,  # noqa: ASYNC109
    ) -> _T:
        async with asyncio.timeout(timeout):
            while True:
                for item in items:
                    if predicate(item):
                        return item
                await self._changed.wait()

    def _notify(self) -> None:
        changed = self._changed
        self._changed = asyncio.Event()
        changed.set()

    # -- handlers ----------------------------------------------------------------------------

    async def _handle_models(self, request: web.Request) -> web.Response:
        # The key is checked here too, as the real API does: a bot checks it with this call.
        refused = self._refuse_key(request)
        if refused is not None:
            return refused
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": FAKE_MODEL_ID, "object": "model", "created": 0, "owned_by": "fake"}
                ],
            }
        )

    def _refuse_key(self, request: web.Request) -> web.Response | None:
        """The 401 the request gets for its bearer key, if any."""
        key = _bearer_key(request)
        if not key:
            error = self.no_api_key()
        elif self.expected_api_key is not None and key != self.expected_api_key:
            error = self.unauthorized()
        else:
            return None
        return web.json_response(error.body, status=error.status, headers=error.headers)

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse_key(request)
        if refused is not None:
            return refused
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response(
                _error_body(
                    "We could not parse the JSON body of your request.",
                    "invalid_request_error",
                    None,
                ),
                status=400,
            )
        problem = _validate(body)
        if problem is None and self.refuse_stream_options and "stream_options" in body:
            problem = _Invalid("Unrecognized request argument supplied: stream_options")
        if problem is None and body.get("tools"):
            problem = self._refused_tools(body)
        if problem is None and self.strict_roles:
            problem = strict_turns(body["messages"])
        if problem is not None:
            self.rejected.append(body)
            return problem.response()
        if self.context_tokens is not None:
            asked = _prompt_tokens(body["messages"], body.get("tools"))
            if asked + int(body.get("max_tokens") or 0) > self.context_tokens:
                self.rejected.append(body)
                too_long = self.context_length()
                return web.json_response(too_long.body, status=too_long.status)

        recorded = RecordedRequest(
            api_key=_bearer_key(request),
            model=body["model"],
            messages=body["messages"],
            stream=bool(body.get("stream", False)),
            body=body,
            headers={key.lower(): value for key, value in request.headers.items()},
            started_at=time.monotonic(),
            connection=_client_port(request),
            prompt_tokens=_prompt_tokens(body["messages"], body.get("tools")),
        )
        self.requests.append(recorded)
        self._notify()
        return await self._tracked(recorded, self._answer(request, recorded))

    def _refused_tools(self, body: dict[str, Any]) -> _Invalid | None:
        """The 400 a request's tools get from a provider that takes none
        (`refuse_tools`), or not one of their schemas (`refuse_format`)."""
        if self.refuse_tools:
            return _Invalid(f"registry.ollama.ai/library/{body['model']} does not support tools")
        if self.refuse_format is None:
            return None
        for index, tool in enumerate(body["tools"]):
            function = tool["function"]
            if self.refuse_format not in _formats(function.get("parameters")):
                continue
            if not self.schema_refusal_names_tool:
                return _Invalid(
                    f"Invalid schema: 'format' {self.refuse_format!r} is not supported in "
                    "function parameters."
                )
            return _Invalid(
                f"Invalid schema for function '{function['name']}': 'format' "
                f"{self.refuse_format!r} is not supported.",
                param=f"tools[{index}].function.parameters",
            )
        return None

    async def _tracked(
        self, recorded: _Outcome, answer: Coroutine[Any, Any, web.StreamResponse]
    ) -> web.StreamResponse:
        """Run a handler's answer where stop() can cancel it, and record a client that gave
        up before it was finished."""
        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)
        try:
            return await answer
        except (asyncio.CancelledError, ConnectionError):
            # Cancellation means aiohttp saw the client disconnect (or stop() gave up on the
            # request); a ConnectionError means a write hit the closed socket first.
            if not recorded.finished:
                recorded.cancelled = True
                self._notify()
            raise
        finally:
            if task is not None:
                self._handler_tasks.discard(task)

    async def _answer(self, request: web.Request, recorded: RecordedRequest) -> web.StreamResponse:
        await self._gate.wait()
        delay = self.delay_for(recorded) if self.delay_for else self.delay_s

        if self._errors:
            error = self._errors.pop(0)
            if delay > 0:
                await asyncio.sleep(delay)
            response = web.json_response(error.body, status=error.status, headers=error.headers)
            return await self._send_whole(request, recorded, response)
        reply = self.raw_replies.pop(0) if self.raw_replies else self.reply(recorded)
        if isinstance(reply, RawReply):
            if delay > 0:
                await asyncio.sleep(delay)
            return await self._send_raw(request, recorded, reply)
        calls = (
            reply if isinstance(reply, ToolCalls) else ToolCalls((), reply, finish_reason="stop")
        )
        if recorded.stream:
            return await self._stream(request, recorded, calls, delay)

        if delay > 0:
            await asyncio.sleep(delay)
        completion_tokens = calls.tokens()
        prompt_tokens = recorded.prompt_tokens
        # Content null beside calls and no text, as OpenAI sends it.
        message: dict[str, Any] = {
            "role": "assistant",
            "content": calls.text if calls.text or not calls.calls else None,
            "refusal": None,
        }
        if calls.calls:
            message["tool_calls"] = calls.entries()
        if self.reasoning:
            message["reasoning_content"] = self.reasoning(recorded)
        payload = {
            "id": _completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": recorded.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": calls.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return await self._send_whole(request, recorded, web.json_response(payload))

    async def _send_whole(
        self, request: web.Request, recorded: _Outcome, response: web.Response
    ) -> web.Response:
        # Written here rather than by aiohttp after the handler returns, so that `finished`
        # really means the bytes went out.
        await response.prepare(request)
        await response.write_eof()
        recorded.finished = True
        recorded.ended_at = time.monotonic()
        self._notify()
        return response

    async def _send_raw(
        self, request: web.Request, recorded: RecordedRequest, raw: RawReply
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=raw.status,
            headers={"Content-Type": raw.content_type, "Cache-Control": "no-cache"},
        )
        await response.prepare(request)
        left = raw.cut_after
        for piece in raw.pieces:
            if raw.pause_s > 0:
                await asyncio.sleep(raw.pause_s)
            if left is not None:
                piece, left = piece[:left], left - len(piece)
            if piece:
                await response.write(piece)
                recorded.pieces_streamed += 1
                self._notify()
            if left is not None and left <= 0:
                # Closed rather than aborted, so the bytes written so far reach the client
                # first: a cut after N bytes is a cut after exactly N bytes.
                recorded.dropped = True
                self._notify()
                assert request.transport is not None
                request.transport.close()
                return response
        recorded.finished = True
        recorded.ended_at = time.monotonic()
        self._notify()
        await self._hold_open(response, recorded, raw.after)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def _stream(
        self, request: web.Request, recorded: RecordedRequest, reply: ToolCalls, delay: float
    ) -> web.StreamResponse:
        completion_id = _completion_id()
        created = int(time.time())
        stream_options = recorded.body.get("stream_options")
        include_usage = isinstance(stream_options, dict) and bool(
            stream_options.get("include_usage")
        )

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            data: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": recorded.model,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
            }
            # The real API marks every chunk but the last with usage null when asked for usage.
            if include_usage:
                data["usage"] = None
            return data

        chunks = [chunk({"role": "assistant", "content": ""})]
        if self.reasoning:
            thought = self.reasoning(recorded)
            chunks += [chunk({"reasoning_content": p}) for p in _PIECE_RE.findall(thought)]
        chunks += [chunk({"content": piece}) for piece in _PIECE_RE.findall(reply.text)]
        chunks += [chunk(delta) for delta in reply.deltas()]
        chunks.append(chunk({}, reply.finish_reason))
        if include_usage:
            prompt_tokens = recorded.prompt_tokens
            completion_tokens = reply.tokens()
            chunks.append(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": recorded.model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                }
            )

        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        first = min(self.first_token_for(recorded), delay) if self.first_token_for else 0.0
        if first > 0:
            await asyncio.sleep(first)
        pause = (delay - first) / len(chunks)
        broken = self._breaks.pop(0) if self._breaks else None
        for index, data in enumerate(chunks):
            if broken and index == len(chunks) // 2:
                if broken == "error":
                    error = _error_body("The server is overloaded.", "server_error", None)
                    await response.write(f"data: {json.dumps(error)}\n\n".encode())
                    await response.write_eof()
                    recorded.finished = True
                    recorded.ended_at = time.monotonic()
                    self._notify()
                    return response
                # Cut the connection under the response: the client sees a body that stops
                # mid-stream, as when a provider's server or a proxy goes away.
                recorded.dropped = True
                assert request.transport is not None
                request.transport.abort()
                return response
            if pause > 0:
                await asyncio.sleep(pause)
            await response.write(f"data: {json.dumps(data)}\n\n".encode())
            if any(
                c["delta"].get("content") or c["delta"].get("tool_calls") for c in data["choices"]
            ):
                recorded.pieces_streamed += 1
                self._notify()
        try:
            await response.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            # The client hung up as the stream ended (a replica killed on purpose, or a
            # generation cut just as its last piece came): it gave up before the end.
            recorded.cancelled = True
            self._notify()
            return response
        recorded.finished = True
        recorded.ended_at = time.monotonic()
        self._notify()
        await self._hold_open(response, recorded, self.after_done)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def _hold_open(
        self, response: web.StreamResponse, recorded: RecordedRequest, after: AfterDone
    ) -> None:
        """Keep a body whose answer is out (and `finished`) open as `after` says, until the
        client hangs up (aiohttp then cancels this handler), the fake stops, or
        `HOLD_AFTER_DONE_S` passes; then it ends."""
        if after == "end":
            return
        deadline = time.monotonic() + HOLD_AFTER_DONE_S
        try:
            while not self._stopping and time.monotonic() < deadline:
                if after == "keep-alive":
                    await response.write(b": keep-alive\n\n")
                await asyncio.sleep(KEEPALIVE_EVERY_S)
        except (asyncio.CancelledError, ConnectionError):
            recorded.hung_up = True
            self._notify()
            raise

    # -- transcriptions ----------------------------------------------------------------------

    async def _handle_transcription(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse_key(request)
        if refused is not None:
            return refused
        try:
            form = await _read_form(request)
            problem = _validate_form(form)
        except ValueError as exc:
            form, problem = _Form(), _Invalid(f"Could not parse multipart form: {exc}")
        if problem is not None:
            self.rejected_transcriptions.append(form.summary())
            return problem.response()

        recorded = TranscriptionRequest(
            api_key=_bearer_key(request),
            model=form.fields["model"],
            filename=form.filename or "",
            content_type=form.content_type,
            size=len(form.data),
            sha256=hashlib.sha256(form.data).hexdigest(),
            fields={k: v for k, v in form.fields.items() if k != "model"},
            headers={key.lower(): value for key, value in request.headers.items()},
            started_at=time.monotonic(),
            data=form.data,
        )
        self.transcriptions.append(recorded)
        self._notify()
        return await self._tracked(recorded, self._answer_transcription(request, recorded))

    async def _answer_transcription(
        self, request: web.Request, recorded: TranscriptionRequest
    ) -> web.StreamResponse:
        if self._transcription_errors:
            error = self._transcription_errors.pop(0)
            response = web.json_response(error.body, status=error.status, headers=error.headers)
        else:
            response = _transcript_response(recorded, self.transcribe(recorded))
        if self.transcription_delay_s > 0:
            await asyncio.sleep(self.transcription_delay_s)
        await self._transcriptions_gate.wait()
        return await self._send_whole(request, recorded, response)


@dataclass
class _Form:
    """A transcription request's multipart form: its text fields and its one file part."""

    fields: dict[str, str] = field(default_factory=dict)
    # None when no part named "file" carried a filename (a file part always does).
    filename: str | None = None
    content_type: str = ""
    data: bytes = b""

    def summary(self) -> dict[str, str]:
        """The fields, the file as its name: what a test needs to see of a refused request."""
        if self.filename is None:
            return dict(self.fields)
        return self.fields | {"file": self.filename}


async def _read_form(request: web.Request) -> _Form:
    """The form of a multipart/form-data body; ValueError if it is none."""
    if request.content_type != "multipart/form-data":
        raise ValueError(f"expected multipart/form-data, got {request.content_type}")
    # Read chunk by chunk: request.post() and part.read() cap a body at aiohttp's 1 MiB
    # client_max_size (answering 413), while the real endpoint takes files up to 25 MB.
    reader = await request.multipart()
    form = _Form()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ValueError("nested multipart bodies are not supported")
        if part.name == "file" and part.filename is not None:
            form.filename = part.filename
            form.content_type = part.headers.get(hdrs.CONTENT_TYPE, "")
            form.data = await _read_part(part)
        elif part.name:
            form.fields[part.name] = await part.text()
    return form


async def _read_part(part: BodyPartReader) -> bytes:
    data = bytearray()
    while chunk := await part.read_chunk():
        data += chunk
    return bytes(data)


def _validate_form(form: _Form) -> _Invalid | None:
    if form.filename is None:
        return _missing("file")
    if not form.fields.get("model"):
        return _missing("model")
    response_format = form.fields.get("response_format", "json")
    if response_format not in _RESPONSE_FORMATS:
        return _not_one_of(response_format, _RESPONSE_FORMATS, "response_format")
    return None


def _transcript_response(recorded: TranscriptionRequest, text: str) -> web.Response:
    form = recorded.response_format
    if form == "json":
        return web.json_response({"text": text})
    if form == "verbose_json":
        verbose = {
            "task": "transcribe",
            "language": recorded.language or "english",
            "duration": 0.0,
            "text": text,
            "segments": [],
        }
        return web.json_response(verbose)
    # The plain formats end with a newline, as whisper-1's do: clients should strip.
    plain = {
        "text": text,
        "srt": f"1\n00:00:00,000 --> 00:00:01,000\n{text}\n",
        "vtt": f"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\n{text}\n",
    }[form]
    return web.Response(text=plain + "\n", content_type="text/plain")


# -- chat request validation -------------------------------------------------------------------


def _formats(schema: Any) -> set[str]:
    """Every `format` a JSON schema uses, however deep."""
    if isinstance(schema, list):
        return {found for item in schema for found in _formats(item)}
    if not isinstance(schema, dict):
        return set()
    found = {schema["format"]} if isinstance(schema.get("format"), str) else set()
    return found | {f for key, value in schema.items() if key != "format" for f in _formats(value)}


def _validate(body: Any) -> _Invalid | None:
    if not isinstance(body, dict):
        return _Invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str):
        return _Invalid("You must provide a model parameter.", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return _Invalid("'messages' must be a list of message objects.", param="messages")
    for index, message in enumerate(messages):
        problem = _validate_content(f"messages[{index}]", message)
        if problem is not None:
            return problem
    return _validate_tools(body) or _validate_tool_messages(messages)


# What the strict chat templates (Llama 2, Mistral, Gemma...) raise, and vLLM and llama.cpp
# answer with a 400.
NOT_ALTERNATING = (
    "Conversation roles must alternate user/assistant/user/assistant/... "
    "(after the system prompt, the first turn must be the user's)"
)


def strict_turns(messages: list[dict[str, Any]]) -> _Invalid | None:
    """A strict template's refusal of `messages`, None if it takes them: system messages
    first only, then turns that start with the user's and alternate. An assistant message
    with `tool_calls` and the `tool` messages answering it (already checked to follow the
    OpenAI shape) belong to the assistant's turn, which a text message may end; after a
    `tool` message the model may also be asked to go on, so it may end the request."""
    expected = "user"
    for message in itertools.dropwhile(lambda m: m.get("role") == "system", messages):
        role = message.get("role")
        if role == "tool":
            continue  # answers to the calls just made: still the assistant's turn
        if role != expected:
            return _Invalid(NOT_ALTERNATING, param="messages")
        # After calls, the assistant's turn goes on (its results, then more calls or words).
        expected = "assistant" if role == "user" or message.get("tool_calls") else "user"
    return None


def _validate_tools(body: dict[str, Any]) -> _Invalid | None:
    """`tools` as function definitions with names OpenAI takes; `tool_choice` one it knows,
    and only beside tools."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return _wrong_type("tools", "an array", tools)
        for index, tool in enumerate(tools):
            problem = _validate_tool(f"tools[{index}]", tool)
            if problem is not None:
                return problem
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if not tools:
        return _Invalid(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
            "specified.",
            param="tool_choice",
        )
    named = isinstance(choice, dict) and isinstance(choice.get("function"), dict)
    if choice not in _TOOL_CHOICES and not named:
        return _not_one_of(choice, _TOOL_CHOICES, "tool_choice")
    return None


def _validate_tool(param: str, tool: Any) -> _Invalid | None:
    if not isinstance(tool, dict):
        return _wrong_type(param, "an object", tool)
    if tool.get("type") != "function":
        return _not_one_of(tool.get("type"), ("function",), f"{param}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        return _missing(f"{param}.function")
    problem = _validate_name(f"{param}.function.name", function.get("name"))
    if problem is not None:
        return problem
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        return _wrong_type(f"{param}.function.parameters", "an object", parameters)
    return None


def _validate_name(param: str, name: Any) -> _Invalid | None:
    if not isinstance(name, str):
        return _missing(param)
    if len(name) > _TOOL_NAME_CHARS:
        return _Invalid(
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{_TOOL_NAME_CHARS}, but got a string with length {len(name)} instead.",
            param=param,
            code="string_above_max_length",
        )
    if not _TOOL_NAME_RE.fullmatch(name):
        return _Invalid(
            f"Invalid '{param}': string does not match pattern. Expected a string that matches "
            "the pattern '^[a-zA-Z0-9_-]+$'.",
            param=param,
            code="invalid_value",
        )
    return None


def _validate_tool_messages(messages: list[dict[str, Any]]) -> _Invalid | None:
    """As OpenAI insists: an assistant message's calls well formed and each answered by a
    `tool` message right after it; a `tool` message only answering such a call."""
    waiting: set[str] = set()  # the calls of the last assistant message not answered yet
    asker = 0
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                return _missing(f"messages[{index}].tool_call_id")
            if message.get("content") is None:
                return _missing(f"messages[{index}].content")
            if call_id not in waiting:
                return _Invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    param=f"messages.[{index}].role",
                )
            waiting.discard(call_id)
            continue
        if waiting:
            return _unanswered(asker, waiting)
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            problem = _validate_calls(f"messages[{index}].tool_calls", calls)
            if problem is not None:
                return problem
            waiting, asker = {call["id"] for call in calls}, index
    return _unanswered(asker, waiting) if waiting else None


def _validate_calls(param: str, calls: Any) -> _Invalid | None:
    if not isinstance(calls, list):
        return _wrong_type(param, "an array", calls)
    if not calls:
        return _Invalid(
            f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param=param,
            code="empty_array",
        )
    for index, call in enumerate(calls):
        where = f"{param}[{index}]"
        if not isinstance(call, dict):
            return _wrong_type(where, "an object", call)
        if not isinstance(call.get("id"), str):
            return _missing(f"{where}.id")
        if call.get("type") != "function":
            return _not_one_of(call.get("type"), ("function",), f"{where}.type")
        function = call.get("function")
        if not isinstance(function, dict):
            return _missing(f"{where}.function")
        problem = _validate_name(f"{where}.function.name", function.get("name"))
        if problem is not None:
            return problem
        if not isinstance(function.get("arguments"), str):
            return _missing(f"{where}.function.arguments")
    return None


def _unanswered(index: int, ids: set[str]) -> _Invalid:
    return _Invalid(
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(sorted(ids)),
        param=f"messages.[{index}].role",
    )


def _validate_content(where: str, message: dict[str, Any]) -> _Invalid | None:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return _wrong_type(f"{where}.content", "a string or an array of content parts", content)
    for index, part in enumerate(content):
        param = f"{where}.content[{index}]"
        if not isinstance(part, dict):
            return _wrong_type(param, "an object", part)
        kind = part.get("type")
        if kind not in _PART_TYPES:
            return _not_one_of(kind, _PART_TYPES, f"{param}.type")
        if kind == "text" and not isinstance(part.get("text"), str):
            return _missing(f"{param}.text")
        if kind == "image_url":
            problem = _validate_image(where, message.get("role"), param, part)
            if problem is not None:
                return problem
    return None


def _validate_image(where: str, role: Any, param: str, part: dict[str, Any]) -> _Invalid | None:
    if role != "user":
        return _Invalid(
            f"Invalid '{where}'. Image URLs are only allowed for messages with role 'user', "
            f"but this message with role '{role}' contains an image URL.",
            param=where,
            code="invalid_value",
        )
    image = part.get("image_url")
    if not isinstance(image, dict):
        return _missing(f"{param}.image_url")
    url = image.get("url")
    if not isinstance(url, str) or not url:
        return _missing(f"{param}.image_url.url")
    detail = image.get("detail", "auto")
    if detail not in IMAGE_TOKENS:
        return _not_one_of(detail, tuple(IMAGE_TOKENS), f"{param}.image_url.detail")
    return _validate_image_url(f"{param}.image_url.url", url)


def _validate_image_url(param: str, url: str) -> _Invalid | None:
    """The fake fetches no http(s) URL; a data: URL must be an image MIME type with base64
    that decodes (its bytes are not sniffed, so tests may send placeholder images)."""
    if url.startswith(("http://", "https://")):
        return None
    match = _DATA_URL_RE.fullmatch(url)
    if match is None:
        what = "a value that is neither an http(s) URL nor a data URL"
    elif not match["mime"].startswith("image/"):
        what = f"unsupported MIME type {match['mime']!r}"
    elif not match["b64"]:
        what = "a data URL that is not base64-encoded"
    elif not _decodes(match["data"]):
        what = "data that is not valid base64"
    else:
        return None
    return _Invalid(
        f"Invalid '{param}'. Expected a base64-encoded data URL with an image MIME type "
        f"(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got {what}.",
        param=param,
        code="invalid_value",
    )


def _decodes(data: str) -> bool:
    try:
        return len(base64.b64decode(data, validate=True)) > 0
    except (binascii.Error, ValueError):
        return False


def _missing(param: str) -> _Invalid:
    return _Invalid(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _not_one_of(value: Any, allowed: tuple[str, ...], param: str) -> _Invalid:
    return _Invalid(
        f"Invalid value: {value!r}. Supported values are: "
        + ", ".join(repr(a) for a in allowed)
        + ".",
        param=param,
        code="invalid_value",
    )


def _wrong_type(param: str, expected: str, value: Any) -> _Invalid:
    return _Invalid(
        f"Invalid type for '{param}': expected {expected}, but got {type(value).__name__}.",
        param=param,
        code="invalid_type",
    )


def _prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The text estimate (tool messages and the calls they answer included) plus IMAGE_TOKENS
    for each image part, by its detail, plus the tools offered."""
    offered = _estimate_tokens(json.dumps(tools)) if tools else 0
    return offered + sum(
        _estimate_tokens(_content_text(m.get("content")))
        + _image_tokens(m.get("content"))
        + sum(
            _estimate_tokens(call["function"]["name"] + call["function"]["arguments"])
            for call in m.get("tool_calls") or ()
        )
        for m in messages
    )


def _image_tokens(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(
        IMAGE_TOKENS.get(str(part["image_url"].get("detail", "auto")), IMAGE_TOKENS["auto"])
        for part in content
        if isinstance(part, dict)
        and part.get("type") == "image_url"
        and isinstance(part.get("image_url"), dict)
    )


def _completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]
