"""Which model a replica runs: the OpenAI-compatible client, or the offline echo.

Apart from the package's face so that importing any of `bot.llm` (a file reader's worker
process runs `python -m bot.llm.heavy`) costs none of the client library's start-up; and the
client is imported only when it is the model, so the offline echo starts without its HTTP
stack (a sixth of a replica's start).
"""

from __future__ import annotations

from typing import Literal

from bot.config.settings import LLMSettings
from bot.llm.base import LLM
from bot.llm.echo import EchoLLM


def make_llm(settings: LLMSettings, provider: Literal["openai", "echo"]) -> LLM:
    if provider == "openai":
        from bot.llm.openai import OpenAILLM

        return OpenAILLM(settings)
    return EchoLLM(settings.echo_delay_ms, settings.echo_word_ms)
