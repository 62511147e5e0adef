"""The platforms' rate limits, as the fake Telegram and the fake Discord enforce them.

A limit of N per P seconds means at most N calls in any sliding P seconds: each limit keeps
the times of the calls it let through (at most N of them), and a call that would make N+1 in
the last P seconds is refused with a 429 and a `retry_after`, and counted as a violation. A
bucket refilled at a second's edge would let 2N through across that edge; this would not.

The fakes check every limit a call falls under before it does anything, so a refused call
changes nothing (as on the real platforms) and is never counted as let through.

Usage::

    limits = Limits([Limit("bot", 30, 1.0, lambda call: "bot")])
    refused = limits.check("sendMessage", {"chat_id": 7}, now)
    if refused is not None:
        ...  # answer 429 with refused.retry_after_s
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What a limit keys a call by ("bot" for a bot-wide limit, the chat id for a per-chat one), or
# None when the limit does not apply to it.
Keyer = Callable[[str, Mapping[str, Any]], str | None]


@dataclass(frozen=True)
class Limit:
    name: str  # "bot", "chat", "group", "channel", ...
    count: int
    per_s: float
    key: Keyer


@dataclass(frozen=True)
class Violation:
    at: float  # time.monotonic() of the refused call
    limit: str
    key: str
    method: str
    retry_after_s: float


@dataclass
class Limits:
    limits: Sequence[Limit]
    # Every call refused for a limit, in order.
    violations: list[Violation] = field(default_factory=list)
    _sent: dict[tuple[str, str], deque[float]] = field(default_factory=dict)

    def check(self, method: str, params: Mapping[str, Any], now: float) -> Violation | None:
        """Let the call through (recording it under every limit it falls under), or refuse
        it: the first limit it would break, recorded as a violation."""
        keyed = [(limit, key) for limit in self.limits if (key := limit.key(method, params))]
        for limit, key in keyed:
            sent = self._window(limit, key, now)
            if len(sent) >= limit.count:
                wait = sent[0] + limit.per_s - now
                violation = Violation(now, limit.name, key, method, wait)
                self.violations.append(violation)
                return violation
        for limit, key in keyed:
            self._window(limit, key, now).append(now)
        return None

    def violations_after(self, since: float) -> list[Violation]:
        return [v for v in self.violations if v.at >= since]

    def _window(self, limit: Limit, key: str, now: float) -> deque[float]:
        sent = self._sent.setdefault((limit.name, key), deque())
        while sent and sent[0] <= now - limit.per_s:
            sent.popleft()
        return sent


def retry_after(violation: Violation) -> int:
    """The whole seconds a platform tells the caller to wait (at least 1), as Telegram's
    `retry_after` does."""
    return max(1, math.ceil(violation.retry_after_s))
