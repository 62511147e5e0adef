"""Chat Completions through the official client (`OpenAILLM`): any OpenAI-compatible server.

The request is built by the client; the reply is read here from the raw stream
(`bot.llm.wire`), over lastword's own transport (`bot.llm.transport`). Streaming by default,
so that cancelling a generation (a newer message made it stale) closes the connection and the
provider stops generating, and paying, at once. A provider's refusal of a field it does not
take, or of the tools, is asked again without them (`bot.llm.tool_refusals`). Whether the
provider takes a key is asked once (`probe_key`), for `/healthz` and `doctor`.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import httpx2
from pydantic import SecretStr

from bot.blame import MODEL, blames
from bot.config.credentials import Credential
from bot.config.settings import LLMSettings, given_as
from bot.llm.prompt import Prompt
from bot.llm.tool_refusals import Refusal, Refusals, refusal

if TYPE_CHECKING:
    import openai
    from openai import AsyncOpenAI
from bot.llm.base import Answer, Attempt, LLMError, Usage
from bot.llm.transport import http_client
from bot.llm.wire import (
    ToolCallPieces,
    content_text,
    drain,
    entries_of,
    glimpse,
    is_reasoning,
    parse_json,
    read_body,
    read_usage,
    sse_events,
    until_finished,
    well_formed,
)

log = logging.getLogger(__name__)

# Words providers use when a prompt does not fit the model's context.
CONTEXT_WORDS = ("context length", "context_length", "context window", "maximum context")


# Where the OpenAI client sends requests when no base URL is set.
OPENAI_BASE_URL = "https://api.openai.com/v1"


KEY_SETTING = "LASTWORD_LLM__API_KEY"


# Refusals of a request's tools one completion takes (each leaves a tool, or all, out); past
# them it is asked without tools, so a provider that names one bad tool after another costs
# a bounded number of requests.
MAX_TOOL_REFUSALS = 3


# The key the client sends where none is configured: it will not start without one, and a
# server that wants none ignores it.
NO_KEY = "unset"


# What a provider's error means, read one way for the bot's replies and for doctor alike:
# "key" (401), "access" (403), "missing" (404: the model or the endpoint), "context" (the
# prompt is too long), "images" (the model takes none), "busy" (worth another try: 5xx, 408,
# 409, 429), "rejected" (any other refusal), "timeout", "unreachable", "other".
Failure = Literal[
    "key",
    "access",
    "missing",
    "context",
    "images",
    "busy",
    "rejected",
    "timeout",
    "unreachable",
    "other",
]


def failure_of(exc: Exception) -> Failure:
    """What the provider's error `exc` means (see `Failure`)."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "unreachable"
    if not isinstance(exc, openai.APIStatusError):
        return "other"
    status, code, message = exc.status_code, _error_code(exc), exc.message.lower()
    if status == 401:
        return "key"
    if status == 403:
        return "access"
    if status == 404 or code == "model_not_found":
        return "missing"
    if status == 400 and (
        code == "context_length_exceeded" or any(w in message for w in CONTEXT_WORDS)
    ):
        return "context"
    if status == 400 and "image" in message:
        return "images"
    # 408, 409 and 429 are worth another try, as the client library itself treats them.
    if status >= 500 or status in (408, 409, 429):
        return "busy"
    return "rejected"


def openai_client(
    base_url: str | None,
    key: SecretStr | None,
    timeout_s: float,
    *,
    retries: int = 0,
    headers: dict[str, str] | None = None,
) -> AsyncOpenAI:
    """An OpenAI-compatible client, as the bot, transcription and doctor all make it: over
    lastword's transport (`bot.llm.transport`), with `retries` of the client's own (the bot's
    model has none: its retries are `generate`'s) and `headers` on every request."""
    # Imported here: the client library costs half a second of start-up, wasted with echo.
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=base_url,
        api_key=key.get_secret_value() if key else NO_KEY,
        timeout=timeout_s,
        max_retries=retries,
        default_headers=headers or None,
        http_client=http_client(timeout_s),
    )


class OpenAILLM:
    """Chat Completions through the official client; any OpenAI-compatible server works."""

    name = "openai"
    sees_images = True
    calls_tools = True
    picks_models = True

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings
        # Ask for the usage at the end of a stream until the provider says it cannot.
        self._stream_usage = True
        # What each model refused of the tools: left out of its requests for a while.
        self.refusals = Refusals()
        # Retries are ours (see `generate`), so that every attempt counts against one policy.
        self.client = openai_client(settings.base_url, settings.api_key, settings.timeout_s)
        where = settings.base_url or OPENAI_BASE_URL
        # Named as the operator gave it: a refused OPENAI_API_KEY from ./.env is reported so.
        configured = settings.api_key is not None
        named = given_as(("llm", "api_key")) if configured else KEY_SETTING
        self.key = Credential(named, f"the LLM provider at {where}", configured=configured)

    def configure(self, settings: LLMSettings) -> None:
        self.settings = settings

    async def close(self) -> None:
        await self.client.close()

    @property
    def base_url(self) -> str:
        return str(self.client.base_url)

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
            return self._completion(await read_body(response.aiter_bytes()), attempt)

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
                answer = self._completion(await read_body(response.aiter_bytes()), attempt)
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
                async for chunk in until_finished(events, self._stream_usage):
                    piece = self._chunk_text(chunk, attempt, calls)
                    if piece:
                        text += piece
                        if on_text is not None:
                            on_text(text)
            await drain(lines)
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
        read_usage(chunk.get("usage"), attempt)
        piece = ""
        for delta in entries_of(chunk.get("choices"), "delta"):
            content = delta.get("content")
            pieces = delta.get("tool_calls")
            # Reasoning streams as its own field (or as thinking parts): billed, not shown.
            if not attempt.reported and (content or pieces or is_reasoning(delta)):
                attempt.completion_tokens += 1  # about one token per chunk
            piece += content_text(content)
            if pieces:
                calls.add(pieces)
        return piece

    def _completion(self, body: bytes, attempt: Attempt) -> Answer:
        """The answer in a whole (not streamed) completion body, whatever its shape; its
        usage is noted in `attempt`. A body that is no completion is a transient `LLMError`."""
        payload = parse_json(body.decode("utf-8", "replace"))
        if not isinstance(payload, dict):
            raise LLMError(
                f"the provider's reply is not a completion: {self._scrub(glimpse(body))}",
                kind="transient",
            )
        if error := payload.get("error"):
            raise LLMError(
                f"the provider failed: {self._scrub(_error_message(error))}", kind="transient"
            )
        read_usage(payload.get("usage"), attempt)
        messages = entries_of(payload.get("choices"), "message")
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
        message = self._scrub(exc.message)
        match failure_of(exc):
            case "key" | "access":
                self.key.refused(f"{status} to a completion", key_fix(self.key))
                return LLMError(f"{self.key.reason} ({status})", kind="key")
            case "missing":
                return LLMError(
                    f"model or endpoint not found (check LASTWORD_LLM__MODEL="
                    f"{self.settings.model!r} and {given_as(('llm', 'base_url'))})",
                    kind="permanent",
                )
            case "context":
                return LLMError(f"the prompt is too long for the model: {message}", kind="context")
            case "images":
                return LLMError(f"the model refused the images: {message}", kind="images")
            case "busy":
                return LLMError(
                    f"provider answered {status}", kind="transient", retry_after=_retry_after(exc)
                )
            case _:
                return LLMError(
                    f"the provider rejected the request (check LASTWORD_LLM__MODEL="
                    f"{self.settings.model!r}): {status} {message}",
                    kind="permanent",
                )

    def _scrub(self, text: str) -> str:
        """A provider's own words, fit for logs: some echo the key they were given."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return text.replace(key, "***") if key else text


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
