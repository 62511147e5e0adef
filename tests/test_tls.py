"""A process's HTTPS clients share one TLS context (`bot/tls.py`): making a context loads the
whole certificate store, about 30 ms of CPU, and a replica makes several clients (the model's,
the platform's long poll and downloads, one per MCP server over HTTP)."""

from __future__ import annotations

import ssl
from typing import Any

import httpx2
import pytest

from adapters.telegram import TelegramAdapter, TelegramSettings
from bot.config.settings import LLMSettings
from bot.llm.openai import OpenAILLM
from bot.tls import client_context
from bot.tools.http_limits import BoundedTransport


async def test_the_clients_of_a_replica_load_the_certificates_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = client_context()
    loads: list[tuple[Any, ...]] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(context: ssl.SSLContext, *args: Any, **options: Any) -> None:
        loads.append(args)
        load(context, *args, **options)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    llm = OpenAILLM(
        LLMSettings.model_validate({"base_url": "https://models.example/v1", "api_key": "sk-test"})
    )
    telegram = TelegramAdapter(
        TelegramSettings.model_validate(
            {"token": "123456:ABC-def", "api_url": "https://bots.example"}
        )
    )
    mcp = BoundedTransport("tools", "https://tools.example/mcp", 1_000_000)
    assert loads == [], "a client made a TLS context of its own"
    assert client_context() is shared
    # What each would have cost: a context of its own loads the store again.
    httpx2.create_ssl_context()
    assert len(loads) == 1
    await llm.client.close()
    await telegram.downloads.shutdown()
    await mcp.aclose()
