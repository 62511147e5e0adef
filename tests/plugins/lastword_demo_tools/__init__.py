"""Third-party tools for the tests, found through the `lastword.tools` entry point group: a
plain function (run in a thread) and a coroutine function (given the call's idempotency key)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from bot.tools.python import PythonTool


def shout(text: str) -> dict[str, Any]:
    """Say the text in capitals."""
    # The thread's name shows the test that a plain function does not run on the event loop.
    return {"text": text.upper(), "thread": threading.current_thread().name}


async def remember(text: str, idempotency_key: str) -> str:
    await asyncio.sleep(0)
    return f"remembered {text} under {idempotency_key}"


SHOUT = PythonTool(
    function=shout,
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
    side_effects=False,
)
REMEMBER = PythonTool(
    function=remember,
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
    side_effects=True,
    name="remember_this",
    description="Remember a text.",
    admin_only=True,
    title="Remembering",
)
