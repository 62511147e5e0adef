"""The OTLP exporter the standard variables ask for."""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)


def otlp_exporter() -> SpanExporter:
    """OTLP over HTTP, configured by the `OTEL_EXPORTER_OTLP_*` variables (gRPC is not
    offered: its wheel is large, and every collector and trace store here takes HTTP)."""
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol not in ("", "http/protobuf"):
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not offered; using http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
