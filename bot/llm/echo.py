"""The offline echo model: answers with what it was asked, for demos, tests and a first run
with no provider configured."""

from __future__ import annotations

import asyncio
import math
import re

from bot.config.settings import LLMSettings
from bot.llm.base import Answer, Usage
from bot.llm.prompt import Prompt
from bot.tokens import estimate

# The most pauses the echo model's streamed answer takes, whatever its length.
ECHO_STEPS = 25


class EchoLLM:
    """Offline and deterministic: answers with what it was asked. For demos and tests.

    It streams its answer a word at a time, `word_ms` apart, so that a live draft can be
    seen without a real endpoint."""

    name = "echo"
    sees_images = False
    calls_tools = False
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
