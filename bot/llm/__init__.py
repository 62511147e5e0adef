"""The model side: the `LLM` interface and the failure policy (`base`), the clients (`openai`
over `wire` and `transport`, and the offline `echo`) made by `make_llm`, what a prompt holds
(`prompt`, `others`), media turned into model input (`media`, `heavy`, `transcribe`), and the
tools a provider refuses (`tool_refusals`). It knows the store and the tools, never the core.
"""

from __future__ import annotations

from typing import Literal

from bot.config.settings import LLMSettings
from bot.llm.base import LLM, Answer, LLMError, Usage, generate
from bot.llm.echo import EchoLLM
from bot.llm.openai import OpenAILLM

__all__ = ["LLM", "Answer", "LLMError", "Usage", "generate", "make_llm"]


def make_llm(settings: LLMSettings, provider: Literal["openai", "echo"]) -> LLM:
    if provider == "openai":
        return OpenAILLM(settings)
    return EchoLLM(settings.echo_delay_ms, settings.echo_word_ms)
