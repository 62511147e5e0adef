"""The exporter's process: `python -m bot.traces.exporter REPLICA_ID`, started by a replica
that traces (`bot.traces.pipe`).

It reads batches of span records from its stdin (a 4-byte big-endian length, then the
`marshal`led list) and hands them to the SDK's batch processor and OTLP exporter, which read
the `OTEL_EXPORTER_OTLP_*` variables themselves. Encoding and posting spans take CPU and,
on a thread, the interpreter's lock: here they take neither from the replica's event loop.

It ends when its stdin closes, which the kernel does when the replica exits, however it
exits: what it holds is exported within `FLUSH_S`, then it is gone. SIGINT and SIGTERM are
ignored, so a Ctrl-C or systemd's stop, sent to the whole group, does not drop spans the
replica is still about to close the pipe on.
"""

from __future__ import annotations

import logging
import marshal
import os
import signal
import sys
import threading
from typing import BinaryIO

log = logging.getLogger("bot.traces.exporter")

# The longest the last spans take to leave once the replica is gone.
FLUSH_S = 3.0
# A batch larger than this is not a batch the replica wrote: the stream is broken.
MAX_BATCH_BYTES = 64 * 1024 * 1024


def next_batch(stream: BinaryIO) -> bytes | None:
    """The next batch's bytes, or None at the end of the stream."""
    header = stream.read(4)
    if len(header) < 4:
        return None
    size = int.from_bytes(header, "big")
    if size > MAX_BATCH_BYTES:
        raise ValueError(f"a batch of {size} bytes: the stream is broken")
    body = stream.read(size)
    return body if len(body) == size else None


def main(argv: list[str]) -> int:
    # First, before the SDK's imports take their half second.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from bot.traces.records import readable, resource_of

    # Exporting spans comes after answering people: on a busy machine this yields the CPU
    # (once started: a start at this priority could take seconds there).
    os.nice(10)
    logging.basicConfig(
        level=logging.WARNING, format="traces exporter: %(levelname)s %(name)s: %(message)s"
    )
    replica_id = argv[1] if len(argv) > 1 else "-"
    resource = resource_of(replica_id)
    processor = BatchSpanProcessor(OTLPSpanExporter())
    stream = sys.stdin.buffer
    try:
        while (batch := next_batch(stream)) is not None:
            for span in readable(marshal.loads(batch), resource, replica_id):
                processor.on_end(span)
    except (ValueError, EOFError, TypeError) as exc:
        log.error("stopped reading spans: %s", exc)
    # The export may hang on a collector that does: bounded, then the process is gone anyway.
    done = threading.Event()

    def flush() -> None:
        processor.force_flush(timeout_millis=int(FLUSH_S * 1000))
        processor.shutdown()  # type: ignore[no-untyped-call]
        done.set()

    threading.Thread(target=flush, name="flush", daemon=True).start()
    if not done.wait(FLUSH_S + 0.5):
        log.warning("the collector did not take the last spans within %gs; dropped", FLUSH_S)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
