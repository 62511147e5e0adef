"""The OTLP protocol offered: HTTP with protobuf (`opentelemetry-exporter-otlp-proto-http`),
which the exporter's process uses as the `OTEL_EXPORTER_OTLP_*` variables configure it. gRPC
is not offered: its wheel is large, and every collector and trace store named in the docs
takes HTTP."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

OFFERED = ("", "http/protobuf")


def warn_of_protocol() -> None:
    """One warning, in the replica's log, if the variables ask for a protocol not offered."""
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol not in OFFERED:
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not offered; using http/protobuf", protocol)
