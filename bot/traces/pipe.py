"""Finished spans on their way out: gathered on the event loop, written in batches by a
thread to the exporter's process (`bot.traces.exporter`), which encodes and posts them.

Bounded everywhere, so a collector that is slow or down costs a reply nothing:
- at most `MAX_PENDING` records wait here; more are dropped and counted (a warning at most
  once a minute says how many);
- the thread's write blocks only the thread, and a stop waits for it `FLUSH_S` at most;
- an exporter that dies is started again, after a pause that doubles up to a minute.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import marshal
import subprocess
import sys
import threading
import time
from typing import IO

from bot.traces.records import Record

log = logging.getLogger(__name__)

# How often the thread sends what was gathered.
INTERVAL_S = 0.2
MAX_PENDING = 8192
FLUSH_S = 3.0
RESTART_S = (1.0, 60.0)
DROPS_LOGGED_EVERY_S = 60.0


class Pipe:
    """The replica's side of the exporter's process."""

    def __init__(self, replica_id: str) -> None:
        self.command = [sys.executable, "-m", "bot.traces.exporter", replica_id]
        # Counted on the loop (queue full) and on the thread (the exporter gone), apart.
        self._dropped_queued = 0
        self._dropped_sending = 0
        # Records written to the exporter so far.
        self.sent = 0
        # The exporter's exit status, once a stop has ended it.
        self.returncode: int | None = None
        self._pending: collections.deque[Record] = collections.deque()
        self._closing = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._not_before = 0.0
        self._started_at = 0.0
        self._pause_s = RESTART_S[0]
        self._dropped_logged = (0, 0.0)
        # Whether a batch has failed to be sent: its traceback is logged once, later ones counted.
        self._failed_before = False
        self._thread = threading.Thread(target=self._run, name="lastword-traces", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """The spans dropped so far: the queue full, or the exporter gone."""
        return self._dropped_queued + self._dropped_sending

    @property
    def pending(self) -> int:
        """Records waiting for the thread."""
        return len(self._pending)

    @property
    def exporter_pid(self) -> int | None:
        """The running exporter's pid, if one runs."""
        child = self._child
        return child.pid if child is not None and child.returncode is None else None

    def put(self, record: Record) -> None:
        """Queue one finished span (called on the event loop: an append, nothing more)."""
        if len(self._pending) >= MAX_PENDING:
            self._dropped_queued += 1
            return
        self._pending.append(record)

    def shutdown(self) -> None:
        """Send what is left and close the pipe; the exporter then flushes and exits. Waits
        `FLUSH_S` at most for both, then stops the exporter."""
        deadline = time.monotonic() + FLUSH_S
        self._closing.set()
        self._thread.join(FLUSH_S)
        child = self._child
        if child is None:
            return
        try:
            child.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            log.warning("the traces' exporter did not finish within %gs; spans dropped", FLUSH_S)
            child.kill()
            child.wait()
        self.returncode = child.returncode

    def _run(self) -> None:
        while True:
            closing = self._closing.wait(INTERVAL_S)
            batch = [self._pending.popleft() for _ in range(len(self._pending))]
            if batch:
                try:
                    self._send(batch)
                except Exception:
                    # Not the exporter's doing (a record marshal refuses, a bug): this batch is
                    # lost and counted, and the thread goes on with the next.
                    self._dropped_sending += len(batch)
                    if not self._failed_before:
                        log.exception("traces: a batch of %d spans could not be sent", len(batch))
                    self._failed_before = True
            self._log_drops()
            if closing:
                if self._child is not None and self._child.stdin is not None:
                    self._child.stdin.close()
                return

    def _send(self, batch: list[Record]) -> None:
        stdin = self._stdin()
        if stdin is None:
            self._dropped_sending += len(batch)
            return
        body = marshal.dumps(batch)
        try:
            stdin.write(len(body).to_bytes(4, "big") + body)
            stdin.flush()
            self.sent += len(batch)
        except OSError as exc:
            self._dropped_sending += len(batch)
            log.warning("the traces' exporter is gone (%s); starting another", exc)
            self._lost()

    def _stdin(self) -> IO[bytes] | None:
        """The running exporter's stdin; started if it is not running and not paused."""
        child = self._child
        if child is not None and child.poll() is None:
            return child.stdin
        if child is not None:
            log.warning("the traces' exporter exited (%s); starting another", child.returncode)
            self._lost()
        if time.monotonic() < self._not_before:
            return None
        try:
            # A session of its own: a Ctrl-C at the replica's terminal is not for it. No
            # stdout: the console's replies go there; its log lines go to stderr, as ours do.
            self._child = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
            self._started_at = time.monotonic()
        except OSError as exc:
            log.warning("could not start the traces' exporter: %s", exc)
            self._lost()
            return None
        return self._child.stdin

    def _lost(self) -> None:
        """The exporter is gone: the next starts after a pause, doubled each time one dies
        within a minute of its start."""
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            # What the dead one was not given is dropped with it (counted already).
            with contextlib.suppress(OSError):
                if child.stdin is not None:
                    child.stdin.close()
        now = time.monotonic()
        if now - self._started_at >= RESTART_S[1]:
            self._pause_s = RESTART_S[0]
        self._not_before = now + self._pause_s
        self._pause_s = min(self._pause_s * 2, RESTART_S[1])

    def _log_drops(self) -> None:
        logged, at = self._dropped_logged
        now = time.monotonic()
        if self.dropped > logged and now - at >= DROPS_LOGGED_EVERY_S:
            log.warning("traces: %d spans dropped so far (the exporter is behind)", self.dropped)
            self._dropped_logged = (self.dropped, now)
