"""Tracing on: spans recorded with the OpenTelemetry SDK and exported over OTLP.

Imported only when tracing is on (`bot.traces.tracing_of`). The SDK reads the standard
variables itself: `OTEL_EXPORTER_OTLP_ENDPOINT` (and its `_TRACES_` forms, headers, timeout),
`OTEL_TRACES_SAMPLER` and its argument, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`
(default here: `lastword`). Spans leave in batches on a thread of their own, so a collector
that is slow or down delays no reply, and the batch queue is bounded (the SDK's 2,048 spans by
default; more are dropped, and counted by the SDK).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opentelemetry import trace as api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from bot.traces import Attribute, Burst, Kind, Span, Tracing

log = logging.getLogger(__name__)

# The longest a stop waits for the last spans to leave.
FLUSH_S = 3.0
KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# The ids the next span made in this task takes: the candidate a first ingest proposed, so
# the span that begins the burst's trace is the one every later span names as its parent.
_PRIMED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "lastword_primed_ids", default=None
)


class _Ids(IdGenerator):
    """Random ids, or the primed ones once."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_trace_id(self) -> int:
        primed = _PRIMED.get()
        return primed[0] if primed else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        primed = _PRIMED.get()
        if primed:
            _PRIMED.set(None)
            return primed[1]
        return self._random.generate_span_id()


# A trace context as this version writes it. Another (a key edited by hand, a later format) is
# no trace: a burst is answered untraced rather than failing on its trace for ever.
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _valid(trace: str) -> bool:
    return TRACEPARENT.fullmatch(trace) is not None


@functools.lru_cache(maxsize=1024)
def _context(trace: str) -> Context:
    """The context whose parent is the span `trace` names. Kept for the bursts in flight: a
    reply's every span asks for it (contexts are immutable, so sharing one is safe)."""
    trace_id, span_id, flags = _ids(trace)
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return api.set_span_in_context(NonRecordingSpan(parent), Context())


def _ids(trace: str) -> tuple[int, int, int]:
    """A traceparent's trace id, span id and flags."""
    _, trace_id, span_id, flags = trace.split("-")
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


class _Recording(Span):
    def __init__(self, span: api.Span) -> None:
        self._span = span
        self.has_failed = False

    def set(self, key: str, value: Attribute) -> None:
        self._span.set_attribute(key, value)

    def failed(self, error_type: str) -> None:
        self.has_failed = True
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))


class _Burst(Burst):
    def __init__(self, tracer: api.Tracer, trace: str, captures_content: bool) -> None:
        self.captures_content = captures_content
        self._tracer = tracer
        self._context = _context(trace)
        self._trace_id = _ids(trace)[0]

    @contextmanager
    def span(self, name: str, *, kind: Kind = "internal") -> Iterator[Span]:
        # Inside another span of this burst, a child of it; else of the burst's first ingest.
        current = api.get_current_span().get_span_context()
        context = None if current.trace_id == self._trace_id else self._context
        # Exceptions are named by type only (`error.type`), never by message, which may carry
        # what a user wrote: the SDK would record the message as an event and as the status's
        # description.
        with self._tracer.start_as_current_span(
            name,
            context=context,
            kind=KINDS[kind],
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            recording = _Recording(span)
            try:
                yield recording
            except Exception as exc:
                if not recording.has_failed:
                    recording.failed(type(exc).__name__)
                raise


class _Replica(SpanProcessor):
    """Names the replica on every span too (`lastword.replica`): some trace stores show a
    span's attributes but not its resource's `service.instance.id`."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id

    def on_start(self, span: api.Span, parent_context: Context | None = None) -> None:
        span.set_attribute("lastword.replica", self.replica_id)


class OtelTracing(Tracing):
    """Spans recorded and exported; `exporter` and `processor` for tests (in memory, at once)."""

    def __init__(
        self,
        replica_id: str,
        exporter: SpanExporter | None = None,
        processor: Callable[[SpanExporter], SpanProcessor] = BatchSpanProcessor,
    ) -> None:
        attributes: dict[str, str] = {"service.instance.id": replica_id}
        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        if not named:
            attributes["service.name"] = "lastword"
        # Shut down by `shutdown`, bounded in time, not at the interpreter's exit (unbounded).
        self.provider = TracerProvider(
            resource=Resource.create(attributes), id_generator=_Ids(), shutdown_on_exit=False
        )
        if exporter is None:
            exporter = _otlp_exporter()
        self.provider.add_span_processor(_Replica(replica_id))
        self.provider.add_span_processor(processor(exporter))
        self.tracer = self.provider.get_tracer("lastword")
        self.captures_content = os.environ.get(CAPTURE_CONTENT, "").lower() == "true"
        self._random = RandomIdGenerator()

    def candidate(self) -> str:
        trace_id = self._random.generate_trace_id()
        span_id = self._random.generate_span_id()
        # The sampler decides once, for the whole burst, as it would for a root span.
        decision = self.provider.sampler.should_sample(None, trace_id, "ingest").decision
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
        if not _valid(trace):
            return
        links = (
            [Link(api.get_current_span(_context(follows)).get_span_context())]
            if _valid(follows)
            else []
        )
        if began:
            trace_id, span_id, _ = _ids(trace)
            primed = _PRIMED.set((trace_id, span_id))
            context: Context | None = Context()
        else:
            primed, context = None, _context(trace)
        try:
            span = self.tracer.start_span(
                "ingest", context=context, links=links, start_time=started_ns, attributes=attributes
            )
        finally:
            if primed is not None:
                _PRIMED.reset(primed)
        span.end()

    def noted(self, name: str, trace: str, started_ns: int, **attributes: Attribute) -> None:
        if not _valid(trace):
            return
        span = self.tracer.start_span(
            name, context=_context(trace), start_time=started_ns, attributes=attributes
        )
        span.end()

    def burst(self, trace: str) -> Burst:
        if not _valid(trace):
            return super().burst(trace)
        return _Burst(self.tracer, trace, self.captures_content)

    def shutdown(self) -> None:
        # On a thread of its own, waited for FLUSH_S at most: a collector that hangs must not
        # hold a stop past systemd's patience (the spans still queued are dropped then).
        done = threading.Event()

        def flush() -> None:
            self.provider.force_flush(timeout_millis=int(FLUSH_S * 1000))
            self.provider.shutdown()
            done.set()

        threading.Thread(target=flush, name="lastword-traces-flush", daemon=True).start()
        if not done.wait(FLUSH_S):
            log.warning(
                "the traces' exporter did not finish within %gs; spans left dropped", FLUSH_S
            )


def _otlp_exporter() -> SpanExporter:
    """OTLP over HTTP, configured by the `OTEL_EXPORTER_OTLP_*` variables."""
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol not in ("", "http/protobuf"):
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not offered; using http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
