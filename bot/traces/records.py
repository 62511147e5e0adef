"""A finished span as a plain record, and the SDK's span made from it.

A replica records its spans as tuples of plain values: cheap to make on the event loop, and
`marshal` sends a batch of them to the exporter's process in one write. That process (or a
test, in its own) turns each into the SDK's `ReadableSpan` here, for the SDK's exporters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan

    from bot.traces import Attribute

# (name, kind: 0 internal / 1 client, trace id, span id, parent span id (0: none), whether the
# parent was recorded elsewhere (the burst's root), trace flags, start ns, end ns, attributes,
# failed, links: ((trace id, span id, flags), ...))
Record = tuple[
    str,
    int,
    int,
    int,
    int,
    bool,
    int,
    int,
    int,
    dict[str, "Attribute"],
    bool,
    tuple[tuple[int, int, int], ...],
]
KIND_INTERNAL, KIND_CLIENT = 0, 1
SCOPE = "lastword"


def record(
    name: str,
    kind: int,
    ids: tuple[int, int, int, bool, int],
    times: tuple[int, int],
    attributes: Mapping[str, Attribute],
    failed: bool = False,
    links: tuple[tuple[int, int, int], ...] = (),
) -> Record:
    """A record; `ids` is (trace id, span id, parent span id, parent remote, flags)."""
    trace_id, span_id, parent_id, remote, flags = ids
    plain = {key: _plain(value) for key, value in attributes.items()}
    return (name, kind, trace_id, span_id, parent_id, remote, flags, *times, plain, failed, links)


def _plain(value: Attribute) -> Attribute:
    """`value` in the exact type marshal takes: it takes no subclass (an enum's member, a
    named tuple), and one would stop the batch it is in."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    return tuple(str.__str__(item) for item in value)


def readable(records: Sequence[Record], resource: Resource, replica_id: str) -> list[ReadableSpan]:
    """The SDK's spans for `records`, each naming `replica_id` too (`lastword.replica`: some
    trace stores show a span's attributes but not its resource)."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    scope = InstrumentationScope(SCOPE)
    kinds = (SpanKind.INTERNAL, SpanKind.CLIENT)
    spans = []
    for row in records:
        name, kind, trace_id, span_id, parent_id, remote, flags, start, end = row[:9]
        attributes, failed, links = row[9:]
        trace_flags = TraceFlags(flags)
        parent = (
            SpanContext(trace_id, parent_id, is_remote=remote, trace_flags=trace_flags)
            if parent_id
            else None
        )
        spans.append(
            ReadableSpan(
                name=name,
                context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace_flags),
                parent=parent,
                resource=resource,
                attributes={**attributes, "lastword.replica": replica_id},
                links=[
                    Link(SpanContext(t, s, is_remote=True, trace_flags=TraceFlags(f)))
                    for t, s, f in links
                ],
                kind=kinds[kind],
                status=Status(StatusCode.ERROR) if failed else Status(StatusCode.UNSET),
                start_time=start,
                end_time=end,
                instrumentation_scope=scope,
            )
        )
    return spans


def resource_of(replica_id: str) -> Resource:
    """The replica's resource: `service.instance.id` its id, `service.name` lastword unless
    the operator named it (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), read by the SDK."""
    import os

    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, str] = {"service.instance.id": replica_id}
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        attributes["service.name"] = "lastword"
    return Resource.create(attributes)
