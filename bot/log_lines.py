"""What every log line is about, set by the code that knows: the conversation being handled
(`about`, read by `bot.service.logs` into each line) and, tracing on, the trace of the burst
being answered (`traced`), so an operator goes from a warning to the burst's whole story; the
libraries too chatty to show below WARNING (`quiet`) and the warnings of theirs no DM bot
needs (`irrelevant`). A platform adapter names its own library's here; the logging set-up
applies them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

# How log lines are written (LASTWORD_LOG_FORMAT): for a terminal, or for the journal and log
# collectors.
LogStyle = Literal["text", "logfmt", "json"]
conversation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "conversation", default=None
)
trace_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)

# Libraries whose INFO lines are noise at best (one per HTTP request) and leaks at worst. A
# platform adds its own library's with `quiet`.
CHATTY = {
    "httpx",
    "httpcore",
    # The openai client's own copy of httpx logs under these names.
    "httpx2",
    "httpcore2",
    "openai",
}

# Library warnings (logger, text) about features a DM bot never uses, said at every start. A
# platform adds its own library's with `irrelevant`.
IRRELEVANT: set[tuple[str, str]] = set()


@contextmanager
def about(conv: str) -> Iterator[None]:
    """Tag every line logged inside (this task and tasks it starts) with `conv`."""
    token = conversation.set(conv)
    try:
        yield
    finally:
        conversation.reset(token)


@contextmanager
def traced(traceparent: str) -> Iterator[None]:
    """Tag every line logged inside with the trace id of `traceparent` (a W3C traceparent;
    "", tracing off: nothing)."""
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:  # tracing off (""), or not a trace context
        yield
        return
    token = trace_id.set(parts[1])
    try:
        yield
    finally:
        trace_id.reset(token)


def quiet(*names: str) -> None:
    """Show these loggers' lines from WARNING up only (all of them at DEBUG): a library
    that logs every request, such as a platform's. Takes effect in `setup` (plug-ins are
    loaded with the settings, before it): importing a module must not change how a process
    that only imports it logs."""
    CHATTY.update(names)


def irrelevant(logger: str, text: str) -> None:
    """Drop the lines of `logger` that contain `text`: a library's warning about a feature a
    DM bot never uses, which would otherwise be said at every start."""
    IRRELEVANT.add((logger, text))
