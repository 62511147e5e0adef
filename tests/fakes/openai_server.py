"""A loopback fake of an OpenAI-compatible Chat Completions server, for tests.

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
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from tests.fakes.loopback import LoopbackServer

__all__ = ["FAKE_MODEL_ID", "FakeOpenAI", "RecordedRequest", "ScriptedError"]

FAKE_MODEL_ID = "fake-model"

# Leading whitespace, then each word with the whitespace after it: the pieces concatenate back to
# the exact reply, so a client that joins deltas must reproduce it byte for byte.
_PIECE_RE = re.compile(r"^\s+|\S+\s*")


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
    # The fake cut the connection itself (break_next_stream("drop")).
    dropped: bool = False
    # Content pieces written to a stream so far (about one token each): what the provider
    # generated, and billed, before the client finished or hung up.
    pieces_streamed: int = 0

    @property
    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _content_text(message.get("content"))
        return ""


@dataclass
class ScriptedError:
    """An HTTP error the fake answers with instead of a completion."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _content_text(content: Any) -> str:
    # Content may be a plain string or a list of typed parts (text, image_url, ...).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


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


class FakeOpenAI(LoopbackServer):
    """Fake OpenAI Chat Completions server on 127.0.0.1 with an OS-chosen port."""

    def __init__(self, reply: Callable[[RecordedRequest], str] | None = None) -> None:
        super().__init__()
        self.reply: Callable[[RecordedRequest], str] = reply or _default_reply
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
        self._breaks: list[Literal["error", "drop"]] = []
        # Answer a request carrying `stream_options` with a 400, as servers that predate it do
        # (older Azure OpenAI API versions, vLLM and Ollama).
        self.refuse_stream_options = False
        # Bodies of the requests answered 400 before they were recorded as requests.
        self.rejected: list[Any] = []
        self._gate = asyncio.Event()
        self._gate.set()
        # Replaced on every state change so waiters can sleep on "something changed" without
        # polling and without needing a lock from synchronous code paths.
        self._changed = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)

    def _before_stop(self) -> None:
        # Held requests would otherwise keep cleanup waiting until its timeout.
        self._gate.set()

    @property
    def base_url(self) -> str:
        return self.origin + "/v1"

    # -- scripting ---------------------------------------------------------------------------

    def hold(self) -> None:
        """From now on, requests wait (after being recorded) until release()."""
        self._gate.clear()

    def release(self) -> None:
        """Let held requests, and future ones, proceed."""
        self._gate.set()

    def fail_next(self, *errors: ScriptedError) -> None:
        """Queue errors; each following request answers with the next one instead of a reply."""
        self._errors.extend(errors)

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
        async with asyncio.timeout(timeout):
            while True:
                for request in self.requests:
                    if predicate(request):
                        return request
                await self._changed.wait()

    def _notify(self) -> None:
        changed = self._changed
        self._changed = asyncio.Event()
        changed.set()

    # -- handlers ----------------------------------------------------------------------------

    async def _handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": FAKE_MODEL_ID, "object": "model", "created": 0, "owned_by": "fake"}
                ],
            }
        )

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
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
            problem = "Unrecognized request argument supplied: stream_options"
        if problem is not None:
            self.rejected.append(body)
            return web.json_response(
                _error_body(problem, "invalid_request_error", None), status=400
            )

        auth = request.headers.get("Authorization", "")
        recorded = RecordedRequest(
            api_key=auth[len("Bearer ") :] if auth.startswith("Bearer ") else "",
            model=body["model"],
            messages=body["messages"],
            stream=bool(body.get("stream", False)),
            body=body,
            headers={key.lower(): value for key, value in request.headers.items()},
            started_at=time.monotonic(),
            connection=_client_port(request),
        )
        self.requests.append(recorded)
        self._notify()

        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)
        try:
            return await self._answer(request, recorded)
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

        text = self.reply(recorded)
        if recorded.stream:
            return await self._stream(request, recorded, text, delay)

        if delay > 0:
            await asyncio.sleep(delay)
        completion_tokens = _estimate_tokens(text)
        prompt_tokens = _prompt_tokens(recorded.messages)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
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
                    "finish_reason": "stop",
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
        self, request: web.Request, recorded: RecordedRequest, response: web.Response
    ) -> web.Response:
        # Written here rather than by aiohttp after the handler returns, so that `finished`
        # really means the bytes went out.
        await response.prepare(request)
        await response.write_eof()
        recorded.finished = True
        self._notify()
        return response

    async def _stream(
        self, request: web.Request, recorded: RecordedRequest, text: str, delay: float
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
        chunks += [chunk({"content": piece}) for piece in _PIECE_RE.findall(text)]
        chunks.append(chunk({}, "stop"))
        if include_usage:
            prompt_tokens = _prompt_tokens(recorded.messages)
            completion_tokens = _estimate_tokens(text)
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
            if any(c["delta"].get("content") for c in data["choices"]):
                recorded.pieces_streamed += 1
                self._notify()
        try:
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            # The client hung up as the stream ended (a replica killed on purpose).
            return response
        recorded.finished = True
        self._notify()
        return response


def _validate(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "The request body must be a JSON object."
    if not isinstance(body.get("model"), str):
        return "You must provide a model parameter."
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "'messages' must be a list of message objects."
    return None


def _prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(_estimate_tokens(_content_text(m.get("content"))) for m in messages)


def _completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]
