"""What a `lastword doctor` check reports, apart from the doctor itself.

A platform's check lives with its adapter (it speaks the platform's library), and the doctor
must not import adapters; both sides meet here, which imports neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bot.config.settings import Settings


@dataclass
class Check:
    """The outcome of one check: `detail` says what was found, `fix` what to do when not ok."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


class PlatformCheck(Protocol):
    """Whether the configured platform accepts the settings (its token, say), answered within
    `timeout_s`, as a check named "platform"."""

    async def __call__(self, settings: Settings, timeout_s: float) -> Check: ...


async def guarded(work: Awaitable[Check], timeout_s: float, on_timeout: Check) -> Check:
    """The check's result within `timeout_s`; `on_timeout` if it takes longer. An unexpected
    error fails the check instead of ending doctor with a traceback."""
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        return on_timeout
    except Exception as exc:  # doctor reports every failure as a ✗ line
        return Check(on_timeout.name, False, f"unexpected error: {type(exc).__name__}: {exc}")
