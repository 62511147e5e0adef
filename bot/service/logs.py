"""Logging: one line per event, as text for a terminal or as logfmt/JSON for the journal.

Every line carries the replica's id, and every line logged while a conversation is being
handled carries that conversation, set once per task through a context variable
(`bot.log_lines.about`), so an
admin can follow one conversation across replicas with a plain `grep`.

Secrets never reach a log line: every configured secret (every secret setting, a platform's
own tokens too, the credentials of every URL, LLM header values, values named as credentials)
is replaced by `***` in the final text, whoever logged it. That matters because libraries log
what they see; httpx, for one, logs each request URL, and a platform's API may put the bot's
token in the URL (Telegram's does). What a secret looks like is `bot.masking`'s, which
secrets the settings hold is `bot.config.secrets`'; here they mask every line's final text.

A line that ends the process goes to the journal at error priority, as an ERROR logged does.

A warning said again and again (a sweep skipped every second while Redis is down) is written
once a minute at most, then counted: `Collapse` writes the first, and one line with the count
when its minute is over, so an outage is two lines a minute in the journal, not sixty.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.config.secrets import secrets_of
from bot.log_lines import CHATTY, IRRELEVANT, LogStyle, conversation, trace_id
from bot.masking import Scrub

if TYPE_CHECKING:
    from bot.config.settings import Settings

# syslog priorities (sd-daemon(3)): a line that starts with one is filed under it.
PRIORITIES = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}

# A warning repeated within this long of its first line is counted, not written again.
REPEAT_WINDOW_S = 60.0
# What stands before a count of repeats ("<TIMES>29 in the last 20 s"): a multiplication
# sign, not an x, which would read as part of the message.
TIMES = "\N{MULTIPLICATION SIGN}"
# Distinct warnings counted at once. Past it the oldest count is written out early: a flood
# of ever-different warnings costs lines, never memory.
MAX_REPEATS = 256


def _quieten(level: str) -> None:
    for name in CHATTY:
        # Their warnings still show; DEBUG asks for everything.
        logging.getLogger(name).setLevel(level if level == "DEBUG" else "WARNING")


class LineFormatter(logging.Formatter):
    """Formats a record as one line of text, logfmt or JSON, with the replica, the
    conversation (when there is one) and any traceback folded into the line."""

    def __init__(
        self,
        style: LogStyle,
        replica: str,
        scrub: Scrub,
        *,
        journal: bool = False,
    ) -> None:
        super().__init__()
        self.style = style
        self.replica = replica
        self.scrub = scrub
        # Straight into the journal: each line starts with its priority, so that
        # `journalctl -p err` finds the errors.
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        line = self._line(record)
        if not self.journal:
            return line
        priority = f"<{PRIORITIES.get(record.levelname, 6)}>"
        # A text traceback spans lines, and the journal takes each line as an entry.
        return priority + line.replace("\n", "\n" + priority)

    def _line(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        message = self.scrub(message)
        conv, trace = conversation.get(), trace_id.get()
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        when += f".{int(record.msecs):03d}Z"
        if self.style == "text":
            about = " ".join(part for part in (conv, trace and f"trace={trace}") if part)
            where = f" [{about}]" if about else ""
            return f"{when} {record.levelname} {record.name}{where}: {message}"
        fields: dict[str, str] = {
            "ts": when,
            "level": record.levelname.lower(),
            "logger": record.name,
            "replica": self.replica,
        }
        if conv:
            fields["conversation"] = conv
        if trace:
            fields["trace_id"] = trace
        fields["msg"] = message
        if self.style == "json":
            return json.dumps(fields, ensure_ascii=False)
        return " ".join(f"{key}={_logfmt(value)}" for key, value in fields.items())


def _logfmt(value: str) -> str:
    if value and not any(c in value for c in ' "=\\\n\t'):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def to_journal() -> bool:
    """Whether stderr is connected to the journal: systemd sets `$JOURNAL_STREAM` to the
    device and inode of that stream, which a redirection elsewhere no longer matches."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        found = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{found.st_dev}:{found.st_ino}"


def style_named(name: str) -> LogStyle:
    """The log format `name` names, as `LASTWORD_LOG_FORMAT` spells it; text for any other."""
    return "logfmt" if name == "logfmt" else "json" if name == "json" else "text"


def fatal(
    message: str,
    scrub: Scrub | None = None,
    style: LogStyle = "text",
    replica: str = "",
) -> None:
    """Write the line that ends the process to stderr: masked by `scrub`, on one line (a
    message that spans lines is joined), under journald with the error priority an ERROR log
    line has, so that `journalctl -p err` shows why the unit stopped. In the log's `style`:
    as logfmt or JSON an ERROR record like the lines before it; as text the line a person at
    a terminal reads, `lastword: <message>`."""
    scrub = scrub or Scrub([])
    text = " ".join(scrub(message).splitlines())
    if style != "text":
        record = logging.LogRecord("lastword", logging.ERROR, __file__, 0, text, None, None)
        line = LineFormatter(style, replica, scrub, journal=to_journal()).format(record)
        print(line, file=sys.stderr, flush=True)
        return
    priority = f"<{PRIORITIES['ERROR']}>" if to_journal() else ""
    print(priority + "lastword: " + text, file=sys.stderr, flush=True)


def _relevant(record: logging.LogRecord) -> bool:
    return not any(record.name == name and text in record.getMessage() for name, text in IRRELEVANT)


@dataclass
class _Repeats:
    """The warnings of one kind (`Collapse._kind`) within a window: when the window began,
    how many came (the first, written, included) and the latest, which the count line
    quotes."""

    began: float
    count: int
    latest: logging.LogRecord
    # The conversation the latest was about: the count line names it as that line would.
    about: str | None


class Collapse(logging.Handler):
    """Passes records on to `inner`, except a warning repeated within `window_s` of its first:
    the first is written, the repeats only counted, and when the window is over one line says
    how many there were: "<the latest> <TIMES>29 in the last 20 s". A window ends at the next
    warning of its kind after it, at `flush` (called periodically) once it has run out, and
    at `close` (at exit) in any case, so no count is lost. Errors and lines below WARNING
    always pass: an error is never hidden, and INFO lines are not a storm's."""

    def __init__(
        self,
        inner: logging.Handler,
        *,
        window_s: float = REPEAT_WINDOW_S,
        max_kinds: int = MAX_REPEATS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.window_s = window_s
        self.max_kinds = max_kinds
        self.clock = clock
        # Oldest window first: the one to end early when there are too many.
        self._windows: dict[tuple[object, ...], _Repeats] = {}

    @staticmethod
    def _kind(record: logging.LogRecord) -> tuple[object, ...]:
        """What makes two warnings the same: their logger, level and template, and what fills
        it, where an error counts by its class and a number with a fraction (a delay, a
        duration) by being one. So "sweep skipped: %s" with the same kind of error is one
        warning whatever the error's words, and "retrying in %.1fs" one whatever the delay;
        but warnings about two files, users or processes (named by text or whole numbers)
        stay two, each written."""
        args = record.args if isinstance(record.args, tuple) else ()
        filled = (type(a) if isinstance(a, BaseException | float) else str(a) for a in args)
        return (record.name, record.levelno, str(record.msg), *filled)

    def emit(self, record: logging.LogRecord) -> None:
        now = self.clock()
        ended = self._ended(now)
        show = True
        if logging.WARNING <= record.levelno < logging.ERROR:
            kind = self._kind(record)
            window = self._windows.get(kind)
            if window is None:
                self._windows[kind] = _Repeats(now, 1, record, conversation.get())
                while len(self._windows) > self.max_kinds:
                    ended.append(self._windows.pop(next(iter(self._windows))))
            else:
                window.count += 1
                window.latest = record
                window.about = conversation.get()
                show = False
        for window in ended:
            self._summarise(window, now)
        if show:
            self.inner.handle(record)

    def _ended(self, now: float | None = None) -> list[_Repeats]:
        """The windows over at `now` (all of them for None), taken out of those kept."""
        ended = [
            kind
            for kind, window in self._windows.items()
            if now is None or now - window.began >= self.window_s
        ]
        return [self._windows.pop(kind) for kind in ended]

    def _summarise(self, window: _Repeats, now: float) -> None:
        """The count line of an ended window, when anything in it went unwritten."""
        if window.count < 2:
            return
        latest = window.latest
        seconds = max(1, round(now - window.began))
        text = f"{latest.getMessage()} {TIMES}{window.count} in the last {seconds} s"
        line = logging.LogRecord(
            latest.name, latest.levelno, latest.pathname, latest.lineno, text, None, None
        )
        token = conversation.set(window.about)
        try:
            self.inner.handle(line)
        finally:
            conversation.reset(token)

    def flush(self) -> None:
        """Write the counts of the windows that are over (`write_counts`, periodically)."""
        self.write_counts(everything=False)

    def close(self) -> None:
        """Write every count still open: the process is ending (`logging.shutdown`)."""
        self.write_counts(everything=True)
        super().close()

    def write_counts(self, *, everything: bool) -> None:
        """Write the counts of the windows that are over, or of all (`everything`)."""
        with self.lock or contextlib.nullcontext():
            now = self.clock()
            for window in self._ended(None if everything else now):
                self._summarise(window, now)
        self.inner.flush()


def write_counts(*, everything: bool = False) -> None:
    """Write the counts of repeated warnings whose window is over: called periodically, so a
    storm that stops is still counted within a minute or so. With `everything`, all counts,
    over or not: the bot has stopped, and its last lines must say what it held back."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, Collapse):
            handler.write_counts(everything=everything)


def setup(settings: Settings, default_level: str) -> LineFormatter:
    """Log to stderr (the journal, under systemd) in the configured format."""
    formatter = LineFormatter(
        settings.log_format,
        settings.replica_id,
        Scrub(secrets_of(settings)),
        journal=to_journal(),
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    # Before the counting: a dropped line is not one of a storm's either.
    collapse = Collapse(handler)
    collapse.addFilter(_relevant)
    # discord.py imports its voice support (audioop) eagerly; lastword sends no audio.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    root = logging.getLogger()
    root.handlers[:] = [collapse]
    level = settings.log_level or default_level
    root.setLevel(level)
    _quieten(level)
    return formatter
