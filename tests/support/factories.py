"""The types of the factories conftest.py's fixtures hand out: `make_settings` builds
Settings, `runtime_factory` starts a Runtime with a recording platform."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from bot.config.settings import Settings
from bot.core.runtime import Runtime
from bot.llm.base import LLM
from bot.tools import Toolbox
from bot.traces import Tracing
from tests.support.fakes.outbound import RecordingOutbound

SettingsFactory = Callable[..., Settings]


class RuntimeFactory(Protocol):
    async def __call__(
        self,
        settings: Settings | None = None,
        /,
        *,
        model: LLM | None = None,
        outbound: RecordingOutbound | None = None,
        toolbox: Toolbox | None = None,
        tracing: Tracing | None = None,
        **overrides: Any,
    ) -> tuple[Runtime, RecordingOutbound]: ...
