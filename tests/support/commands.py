"""The in-process commands tests' conversation, and the type of their `bot` fixture
(tests/commands/conftest.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bot.core.runtime import Runtime
from tests.support.fakes.outbound import RecordingOutbound

CONV = "test:1"


Start = Callable[..., Awaitable[tuple[Runtime, RecordingOutbound]]]
