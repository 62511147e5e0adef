"""Which model a replica runs: the OpenAI-compatible client, or the offline echo.

Apart from the package's face so that importing any of `bot.llm` (a file reader's worker
process runs `python -m bot.llm.heavy`) costs none of the client library's start-up.
"""

from __future__ import annotations

from typing import Literal

from bot.config.settings import LLMSettings
from bot.llm.base import LLM
from bot.llm.echo import EchoLLM
from bot.llm.openai import OpenAILLM


def make_llm(settings: LLMSettings, provider: Literal["openai", "echo"]) -> LLM:
    if provider == "openai":
        return OpenAILLM(settings)
    return EchoLLM(settings.echo_delay_ms, settings.echo_word_ms)
