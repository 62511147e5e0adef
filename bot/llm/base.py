"""The model behind the bot: what a model is (`LLM`), what it answers (`Answer`), what it costs
(`Usage`), how it fails (`LLMError`), and the failure policy every model is asked under
(`generate`).

A cycle asks `generate` for exactly one answer to one `Prompt`. `generate` owns the failure
policy: transient failures (timeouts, connection errors, 5xx, 429) are retried with jittered
exponential backoff that honours `Retry-After`; a context-length refusal shrinks the history
and tries once more, and a refusal of images drops them and tries once more; anything else
fails at once. A total deadline bounds all of it. What is left is raised as `LLMError`, and
the cycle apologises. Reasoning (`<think>` blocks) is never part of the answer.

The models themselves: `bot.llm.openai` (any OpenAI-compatible server) and `bot.llm.echo`
(offline).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, runtime_checkable

from bot.backoff import Backoff
from bot.config.credentials import Credential
from bot.config.settings import LLMSettings
from bot.llm.prompt import Prompt
from bot.tools import ToolCall

log = logging.getLogger(__name__)

T = TypeVar("T")


# A whole reasoning block, or one cut off by the token limit before it closed.
THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)


# Some servers strip the opening tag and leave the closing one after the reasoning.
THINK_TAIL = re.compile(r"\A.*?</think>", re.DOTALL | re.IGNORECASE)


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


@runtime_checkable
class Keyed(Protocol):
    """A client of a service that takes a key (the model's provider, the transcription
    service): the key as configured, with why the service refuses it now (`key`), where it is
    sent (`base_url`), and a check that the service takes it (`probe`), which the replica runs
    at start and while a key is refused, so `/healthz` can say so."""

    key: Credential

    @property
    def base_url(self) -> str: ...

    async def probe(self, timeout_s: float, *, level: int = logging.ERROR) -> None: ...


class LLM(Protocol):
    """A model the core asks for replies. What it can do it declares (the core never tells
    models apart by name): `sees_images`, whether photos reach it as images (or are only
    described in words); `picks_models`, whether a person may pick one of the configured
    models with /model (the offline echo has no model to pick); `calls_tools`, whether it may
    call tools at all (the echo never does, so it is offered none of lastword's own)."""

    name: str
    sees_images: bool
    picks_models: bool
    calls_tools: bool

    async def complete(self, prompt: Prompt, usage: Usage) -> Answer:
        """One completion for `prompt`, recording its tokens in `usage` as it goes."""
        ...

    def configure(self, settings: LLMSettings) -> None:
        """Take on reloaded settings (model, temperature...); the connection stays as it is."""
        ...

    async def close(self) -> None:
        """Close the connections to the provider, once the replica stops using the model."""
        ...


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
