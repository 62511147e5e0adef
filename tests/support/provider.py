"""Model settings pointed at the fake provider, for the tests of the model client."""

from __future__ import annotations

from typing import Any

from bot.config.settings import LLMSettings
from tests.support.fakes.openai_server import FakeOpenAI


def llm_settings(fake: FakeOpenAI, **overrides: Any) -> LLMSettings:
    values: dict[str, Any] = {
        "provider": "openai",
        "base_url": fake.base_url,
        "api_key": "sk-shapes",
        "model": "test-model",
        "timeout_s": 5.0,
        "retries": 2,
        "retry_base_s": 0.01,
        "deadline_s": 10.0,
    }
    return LLMSettings(**(values | overrides))
