"""An OTLP/HTTP trace receiver on loopback, as a collector (or Jaeger, Phoenix, Langfuse)
receives what the OpenTelemetry exporter sends: `POST /v1/traces`, protobuf bodies decoded with
`opentelemetry-proto`. It keeps every span, and can answer slowly, or fail, as a collector in
trouble does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.support.fakes.loopback import LoopbackServer


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # hex, as viewers show it
    span_id: str
    parent_id: str  # "": a root
    name: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: tuple[str, ...]  # the trace ids linked to


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class FakeOTLP(LoopbackServer):
    """Spans received, and the requests they came in."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        # Seconds each request is held before its answer: a slow collector.
        self.delay_s = 0.0
        self._changed = asyncio.Event()

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/traces", self._traces)

    @property
    def endpoint(self) -> str:
        """What `OTEL_EXPORTER_OTLP_ENDPOINT` says to reach it."""
        return self.origin

    async def _traces(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415)
        decoded = ExportTraceServiceRequest()
        try:
            decoded.ParseFromString(await request.read())
        except Exception:  # protobuf's DecodeError: not a body the exporter sends
            return web.Response(status=400)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.requests += 1
        for resource_spans in decoded.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        ReceivedSpan(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            _attributes(span.attributes),
                            resource,
                            tuple(link.trace_id.hex() for link in span.links),
                        )
                    )
        self._changed.set()
        self._changed = asyncio.Event()
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def named(self, name: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.name.startswith(name)]
