"""Running `lastword doctor`'s checks and reading their results, for the doctor tests."""

from __future__ import annotations

import socket
from functools import partial
from typing import Any

import adapters
from bot.ops import doctor
from bot.ops.check import Check
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI

# As `lastword doctor` runs them: the composition root hands in the platform's check.
run_checks = partial(doctor.run_checks, platform_check=adapters.check)


NAMES = ["settings", "store", "scripts", "memory", "durability", "platform", "llm"]


# Distinctive, so that a leak anywhere in the output is found by a plain substring search.
TG_TOKEN = "555000111:SECRET-tg-token-Zq8xv1"


TG_WEBHOOK_SECRET = "SECRET-webhook-Kd93mz"


DISCORD_TOKEN = "SECRET.discord-token.Ab12Cd34"


API_KEY = "sk-SECRET-llm-key-Hq72pw"


SECRETS = (TG_TOKEN, TG_TOKEN.split(":", 1)[1], TG_WEBHOOK_SECRET, DISCORD_TOKEN, API_KEY)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def assert_no_secret(text: str, *secrets: str) -> None:
    for secret in (*SECRETS, *secrets):
        assert secret not in text


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def llm_settings(fake: FakeOpenAI, **overrides: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "base_url": fake.base_url,
        "api_key": API_KEY,
        "model": FAKE_MODEL_ID,
        **overrides,
    }
