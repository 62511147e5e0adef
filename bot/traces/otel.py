"""Tracing on: spans recorded as plain records and exported over OTLP by the SDK, in a
process of its own.

Imported only when tracing is on (`bot.traces.tracing_of`). The SDK reads the standard
variables itself: `OTEL_EXPORTER_OTLP_ENDPOINT` (and its `_TRACES_` forms, headers, timeout),
`OTEL_TRACES_SAMPLER` and its argument, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`
(default here: `lastword`).

The event loop pays for a span only a tuple and an append (about a tenth of what the SDK's
own span costs): the SDK's spans are made, encoded and posted in the exporter's process
(`bot.traces.pipe`, `bot.traces.exporter`). There a collector that is slow or down delays no
reply, and every queue on the way is bounded.
"""

from __future__ import annotations

import contextvars
import functools
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import Decision

from bot.traces import Attribute, Burst, Kind, Span, Tracing
from bot.traces.otlp import warn_of_protocol
from bot.traces.pipe import Pipe
from bot.traces.records import KIND_CLIENT, KIND_INTERNAL, Record, readable, record, resource_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

KINDS = {"internal": KIND_INTERNAL, "client": KIND_CLIENT}
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# The span open in this task (trace id, span id): the parent of the next span of its burst.
_CURRENT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "lastword_current_span", default=None
)
# Span ids: 64 random bits, never 0 (no span).
_random = random.Random()

# A trace context as this version writes it. Another (a key edited by hand, a later format) is
# no trace: a burst is answered untraced rather than failing on its trace for ever.
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@functools.lru_cache(maxsize=1024)
def _ids(trace: str) -> tuple[int, int, int] | None:
    """A traceparent's trace id, span id and flags; None if it is not one this version wrote
    (kept for the bursts in flight: a reply's every span asks)."""
    if TRACEPARENT.fullmatch(trace) is None:
        return None
    _, trace_id, span_id, flags = trace.split("-")
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def _span_id() -> int:
    return _random.getrandbits(64) or 1


class _Recording(Span):
    def __init__(self) -> None:
        self.attributes: dict[str, Attribute] = {}
        self.has_failed = False

    def set(self, key: str, value: Attribute) -> None:
        self.attributes[key] = value

    def failed(self, error_type: str) -> None:
        self.has_failed = True
        self.attributes["error.type"] = error_type


class _Burst(Burst):
    def __init__(
        self, put: Callable[[Record], None], ids: tuple[int, int, int], captures_content: bool
    ) -> None:
        self.captures_content = captures_content
        self._put = put
        self._trace_id, self._root, self._flags = ids

    @contextmanager
    def span(self, name: str, *, kind: Kind = "internal") -> Iterator[Span]:
        # Inside another span of this burst, a child of it; else of the burst's first ingest.
        current = _CURRENT.get()
        parent = current[1] if current and current[0] == self._trace_id else self._root
        span_id = _span_id()
        token = _CURRENT.set((self._trace_id, span_id))
        recording = _Recording()
        started = time.time_ns()
        try:
            yield recording
        except Exception as exc:
            # Named by type only (`error.type`), never by message, which may carry what a
            # user wrote.
            if not recording.has_failed:
                recording.failed(type(exc).__name__)
            raise
        finally:
            _CURRENT.reset(token)
            ids = (self._trace_id, span_id, parent, parent == self._root, self._flags)
            self._put(
                record(
                    name,
                    KINDS[kind],
                    ids,
                    (started, time.time_ns()),
                    recording.attributes,
                    recording.has_failed,
                )
            )


class OtelTracing(Tracing):
    """Spans recorded and exported by the exporter's process; `exporter`, for tests, takes
    them in this process instead, one by one as they end."""

    def __init__(self, replica_id: str, exporter: SpanExporter | None = None) -> None:
        self.replica_id = replica_id
        # Only the sampler: it decides once, for a whole burst, at its first message.
        self.sampler = TracerProvider(shutdown_on_exit=False).sampler
        self.captures_content = os.environ.get(CAPTURE_CONTENT, "").lower() == "true"
        if exporter is None:
            warn_of_protocol()
        self.pipe = Pipe(replica_id) if exporter is None else None
        self._exporter = exporter
        self._resource = None if exporter is None else resource_of(replica_id)

    def _put(self, record: Record) -> None:
        if self.pipe is not None:
            self.pipe.put(record)
            return
        assert self._exporter is not None and self._resource is not None
        self._exporter.export(readable([record], self._resource, self.replica_id))

    def candidate(self) -> str:
        trace_id = _random.getrandbits(128) or 1
        span_id = _span_id()
        decision = self.sampler.should_sample(None, trace_id, "ingest").decision
        sampled = decision == Decision.RECORD_AND_SAMPLE
        return f"00-{trace_id:032x}-{span_id:016x}-{1 if sampled else 0:02x}"

    def ingested(
        self,
        trace: str,
        follows: str,
        started_ns: int,
        *,
        began: bool = False,
        **attributes: Attribute,
    ) -> None:
        ids = _ids(trace)
        if ids is None or not ids[2] & 1:
            return
        trace_id, root, flags = ids
        before = _ids(follows)
        links = (before,) if before else ()
        # The burst's first message: its ingest is the root, with the candidate's own ids,
        # so every span any replica records for the burst names it as parent.
        span = (trace_id, root, 0, False, flags) if began else self._child_of(ids)
        times = (started_ns, time.time_ns())
        self._put(record("ingest", KIND_INTERNAL, span, times, attributes, links=links))

    def noted(self, name: str, trace: str, started_ns: int, **attributes: Attribute) -> None:
        ids = _ids(trace)
        if ids is None or not ids[2] & 1:
            return
        times = (started_ns, time.time_ns())
        self._put(record(name, KIND_INTERNAL, self._child_of(ids), times, attributes))

    @staticmethod
    def _child_of(ids: tuple[int, int, int]) -> tuple[int, int, int, bool, int]:
        trace_id, root, flags = ids
        return (trace_id, _span_id(), root, True, flags)

    def burst(self, trace: str) -> Burst:
        ids = _ids(trace)
        if ids is None or not ids[2] & 1:
            return super().burst(trace)
        return _Burst(self._put, ids, self.captures_content)

    def shutdown(self) -> None:
        if self.pipe is not None:
            self.pipe.shutdown()
