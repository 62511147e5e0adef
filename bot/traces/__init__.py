"""Traces: one OpenTelemetry trace per burst, whichever replicas take part (docs/operating.md).

Off by default, and free then: `tracing_of` gives `OFF`, whose calls do nothing, and the
OpenTelemetry SDK is never imported. On (`LASTWORD_TRACES__ENABLED`, with the `otel` extra),
`bot.traces.otel` records spans through the SDK, configured by the standard `OTEL_*`
variables (where to export, the sampler, the service's name).

A burst's trace context is a W3C `traceparent` kept with its conversation in the store: the
first message's ingest proposes one (`Tracing.candidate`) and keeps it, later messages and the
lease that answers the burst read it in the same script calls, and the commit ends it. Every
span a replica records for the burst is a child of the first message's ingest span.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from bot.config.settings import Settings

__all__ = [
    "NO_BURST",
    "OFF",
    "Attribute",
    "Burst",
    "Kind",
    "Span",
    "Tracing",
    "conversation_id",
    "tracing_of",
]

Attribute = str | int | float | bool | Sequence[str]
Kind = Literal["internal", "client"]


class Span:
    """A span being recorded; this one records nothing (tracing off, or not sampled)."""

    def set(self, key: str, value: Attribute) -> None:
        """Set one attribute."""

    def failed(self, error_type: str) -> None:
        """The span's work failed: `error.type`, and the span's status an error."""


class Burst:
    """The spans of one burst's trace, recorded by this replica; these record nothing."""

    # Message text in `chat` spans (`bot.traces.content`): only when the operator opts in.
    captures_content = False

    @contextmanager
    def span(self, name: str, *, kind: Kind = "internal") -> Iterator[Span]:
        """A span for the block it wraps, a child of the burst's first ingest."""
        yield NO_SPAN


class Tracing:
    """Tracing off: nothing is recorded. `bot.traces.otel.OtelTracing` records."""

    def candidate(self) -> str:
        """A new trace context for a message that may begin a burst ("": tracing off)."""
        return ""

    def ingested(
        self,
        trace: str,
        follows: str,
        started_ns: int,
        *,
        began: bool = False,
        **attributes: Attribute,
    ) -> None:
        """Record a message's ingest, from `started_ns` to now: the root of `trace` when it
        `began` the trace (this replica's candidate, linked to `follows`, the burst before),
        else a child of that root."""

    def noted(self, name: str, trace: str, started_ns: int, **attributes: Attribute) -> None:
        """Record `name`, from `started_ns` to now, in the burst whose trace is `trace` ("":
        none): something that happened to the burst outside a reply (a typing hold)."""

    def burst(self, trace: str) -> Burst:
        """The spans this replica adds to the burst whose trace is `trace`."""
        return NO_BURST

    def shutdown(self) -> None:
        """Export what is left, within a few seconds."""


NO_SPAN = Span()
NO_BURST = Burst()
OFF = Tracing()


@functools.lru_cache(maxsize=4096)
def conversation_id(conversation: str) -> str:
    """`gen_ai.conversation.id`: an opaque stand-in, never the platform's ids."""
    return hashlib.sha256(conversation.encode()).hexdigest()[:32]


def tracing_of(settings: Settings) -> Tracing:
    """The tracing the settings ask for: `OFF` unless `traces.enabled`."""
    if not settings.traces.enabled:
        return OFF
    # Imported only when on: the SDK costs nothing to a bot that does not trace.
    from bot.traces.otel import OtelTracing

    return OtelTracing(settings.replica_id)
