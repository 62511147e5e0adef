"""The model behind the bot: a small interface, an OpenAI-compatible client and an offline echo.

A cycle builds one `Prompt` (system prompt, history, and every unanswered message folded into
one user turn) and asks for exactly one completion. Transient failures are retried here with
jittered exponential backoff; what is left is raised as `LLMError` for the cycle to apologise.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from bot.settings import LLMSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

log = logging.getLogger(__name__)

FOLD_HEADER = "Here is everything I sent that you have not answered yet, in order:"


@dataclass(frozen=True)
class Turn:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class Prompt:
    system: str
    history: tuple[Turn, ...]
    unanswered: tuple[str, ...]

    def messages(self) -> list[dict[str, str]]:
        """Chat Completions messages: history with adjacent turns of one role merged, then ONE
        user turn that folds every unanswered message, so the model answers them together."""
        out: list[dict[str, str]] = [{"role": "system", "content": self.system}]
        for turn in self.history:
            if len(out) > 1 and out[-1]["role"] == turn.role:
                out[-1]["content"] += "\n" + turn.text
            else:
                out.append({"role": turn.role, "content": turn.text})
        if len(self.unanswered) == 1:
            folded = self.unanswered[0]
        else:
            numbered = (f"{i}. {text}" for i, text in enumerate(self.unanswered, 1))
            folded = FOLD_HEADER + "\n" + "\n".join(numbered)
        if out[-1]["role"] == "user":
            # The last answered turn cannot be a user turn, but a trimmed history might be.
            out.append({"role": "assistant", "content": "(no reply)"})
        out.append({"role": "user", "content": folded})
        return out


class LLMError(Exception):
    """The model could not answer. `permanent` failures are not worth retrying."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class LLM(Protocol):
    name: str

    async def complete(self, prompt: Prompt) -> str: ...


class EchoLLM:
    """Offline and deterministic: answers with what it was asked. For demos and tests."""

    name = "echo"

    def __init__(self, delay_ms: int = 0) -> None:
        self.delay_s = delay_ms / 1000

    async def complete(self, prompt: Prompt) -> str:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return "You said: " + " / ".join(prompt.unanswered)


class OpenAILLM:
    """Chat Completions through the official client; any OpenAI-compatible server works."""

    name = "openai"

    def __init__(self, settings: LLMSettings) -> None:
        # Imported here: the client library costs half a second of start-up, wasted with echo.
        from openai import AsyncOpenAI

        self.settings = settings
        api_key = settings.api_key.get_secret_value() if settings.api_key else "unset"
        # Retries are ours (below), so that every attempt counts against one policy.
        self.client: AsyncOpenAI = AsyncOpenAI(
            base_url=settings.base_url,
            api_key=api_key,
            timeout=settings.timeout_s,
            max_retries=0,
        )

    async def complete(self, prompt: Prompt) -> str:
        import openai

        try:
            response = await self.client.chat.completions.create(
                model=self.settings.model,
                messages=prompt.messages(),  # type: ignore[arg-type]
            )
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise LLMError(
                f"the provider refused the key (check LASTWORD_LLM__API_KEY): {exc.status_code}",
                permanent=True,
            ) from None
        except openai.NotFoundError:
            raise LLMError(
                f"model or endpoint not found (check LASTWORD_LLM__MODEL={self.settings.model!r}"
                " and LASTWORD_LLM__BASE_URL)",
                permanent=True,
            ) from None
        except openai.BadRequestError as exc:
            raise LLMError(
                f"the provider rejected the request (check LASTWORD_LLM__MODEL="
                f"{self.settings.model!r}): {self._scrub(exc.message)}",
                permanent=True,
            ) from None
        except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as e:
            raise LLMError(
                f"transient provider failure: {type(e).__name__}", permanent=False
            ) from None
        except openai.APIStatusError as exc:
            # 408 and 409 are worth another try, as the client library itself treats them.
            transient = exc.status_code >= 500 or exc.status_code in (408, 409)
            raise LLMError(
                f"provider answered {exc.status_code}", permanent=not transient
            ) from None
        if not response.choices or not response.choices[0].message.content:
            raise LLMError("the provider returned an empty reply", permanent=False) from None
        return response.choices[0].message.content

    def _scrub(self, text: str) -> str:
        """A provider's own words, fit for logs: some echo the key they were given."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return text.replace(key, "***") if key else text


async def complete_with_retries(llm: LLM, prompt: Prompt, retries: int, base_s: float) -> str:
    """One answer for the prompt, retrying transient failures with jittered backoff."""
    attempt = 0
    while True:
        try:
            return await llm.complete(prompt)
        except LLMError as exc:
            if exc.permanent or attempt >= retries:
                raise
            delay = base_s * (2**attempt) * random.uniform(0.5, 1.5)
            log.warning("LLM attempt %d failed (%s); retrying in %.2fs", attempt + 1, exc, delay)
            await asyncio.sleep(delay)
            attempt += 1


def make_llm(settings: LLMSettings, provider: Literal["openai", "echo"]) -> LLM:
    if provider == "openai":
        return OpenAILLM(settings)
    return EchoLLM(settings.echo_delay_ms)
