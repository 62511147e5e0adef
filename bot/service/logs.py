"""Logging: one line per event, as text for a terminal or as logfmt/JSON for the journal.

Every line carries the replica's id, and every line logged while a conversation is being
handled carries that conversation, set once per task through a context variable, so an
admin can follow one conversation across replicas with a plain `grep`.

Secrets never reach a log line: every configured secret (every secret setting, a platform's
own tokens too, the credentials of every URL, LLM header values, values named as credentials)
is replaced by `***` in the final text, whoever logged it. That matters because libraries log
what they see; httpx, for one, logs each request URL, and a platform's API may put the bot's
token in the URL (Telegram's does). This module is the one place that knows what a secret is:
the lines that end the process (`fatal`), `lastword doctor` and the settings' errors mask
them with the same `Scrub`, and show URLs through `store_url`, `redact` and `masked_url`.

A line that ends the process goes to the journal at error priority, as an ERROR logged does.

A warning said again and again (a sweep skipped every second while Redis is down) is written
once a minute at most, then counted: `Collapse` writes the first, and one line with the count
when its minute is over, so an outage is two lines a minute in the journal, not sixty.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import SplitResult, unquote, urlsplit

from pydantic import BaseModel, SecretStr

if TYPE_CHECKING:
    # Only named here: the settings quote values through this module's masks.
    from bot.config.settings import McpServer, Settings

# What a secret is replaced with.
MASK = "***"
# How log lines are written (LASTWORD_LOG_FORMAT): for a terminal, or for the journal and log
# collectors.
LogStyle = Literal["text", "logfmt", "json"]
# A value shorter than this is never masked: it is too short to be a secret, and masking it
# would mangle ordinary text (an empty value would put a mask between every two characters).
MIN_SECRET_CHARS = 4

conversation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "conversation", default=None
)

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


@contextmanager
def about(conv: str) -> Iterator[None]:
    """Tag every line logged inside (this task and tasks it starts) with `conv`."""
    token = conversation.set(conv)
    try:
        yield
    finally:
        conversation.reset(token)


# An environment variable whose name says it holds a credential.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)


def secrets_of(settings: Settings) -> list[str]:
    """The values that must never appear in a log line, an error message or a doctor report:
    every secret setting of the whole tree (a platform's own too, whatever it names them),
    the credentials of every URL in it (the Redis password, in its user info or its query),
    every value under a name that says it is a credential (`extra_body`'s `api_key`), the
    LLM's header values and each MCP server's (`server_secrets`)."""
    values = list(_secret_values(settings))
    # Headers sent to the LLM may carry credentials of their own (an Authorization header).
    values += settings.llm.extra_headers.values()
    for server in settings.tools.mcp_servers.values():
        values += server_secrets(server)
    return maskable(values)


def maskable(values: Iterable[str]) -> list[str]:
    """The values worth masking, each once, longest first (so a secret that contains another
    is hidden whole): none shorter than `MIN_SECRET_CHARS`."""
    return sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)


def secret_env(env: Mapping[str, str]) -> list[str]:
    """The values of an environment whose names say they hold a credential (an API key by
    any name that says so)."""
    return [value for name, value in env.items() if SECRET_NAME.search(name)]


def server_secrets(server: McpServer) -> list[str]:
    """An MCP server's values that no log line may show: its headers, its environment's
    credentials, the credentials among its arguments (`secret_args`), and of its URL the whole
    text (an MCP URL often carries its credential in its path or query: the HTTP library logs
    every request's URL) and its credentials (`url_secrets`)."""
    values = [*server.headers.values(), *secret_env(server.env), *secret_args(server.args)]
    if server.url is not None:
        values += [str(server.url), *url_secrets(str(server.url))]
    return values


def secret_args(args: Iterable[str]) -> list[str]:
    """The credentials on a command line, as far as their names tell: the value of an
    option that says it is one (`--token X`, `--api-key=X`, `GITHUB_TOKEN=X`), and those of a
    URL given as an argument. (A bare token with no name before it cannot be told apart.)"""
    found: list[str] = []
    named = False
    for arg in args:
        name, equals, value = arg.partition("=")
        if named:
            found.append(arg)
        elif equals and SECRET_NAME.search(name):
            found.append(value)
        found += url_secrets(arg) if "://" in arg else []
        named = arg.startswith("-") and not equals and bool(SECRET_NAME.search(arg))
    return found


def url_secrets(url: str) -> list[str]:
    """A URL's credentials: the password of its user info and the values of its query
    parameters whose names say they are credentials (`?password=`, which redis-py takes,
    `?api_key=`), each as written and percent-decoded (a library may show either)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    userinfo, at, _ = parts.netloc.rpartition("@")
    values = [userinfo.partition(":")[2]] if at else []
    pairs = (pair.partition("=") for pair in parts.query.split("&"))
    values += (value for name, _, value in pairs if SECRET_NAME.search(name))
    return [form for value in values if value for form in (value, unquote(value))]


def _secret_values(node: object, name: str = "") -> Iterator[str]:
    """Every secret in a settings tree, in its models, lists and mappings: each `SecretStr`,
    the credentials of each URL, and each text under a name (a field's or a key's) that says
    it is a credential."""
    if isinstance(node, SecretStr):
        yield node.get_secret_value()
    elif isinstance(node, str):
        if SECRET_NAME.search(name):
            yield node
        if "://" in node:
            yield from url_secrets(node)
    elif isinstance(node, BaseModel):
        for field in type(node).model_fields:
            yield from _secret_values(getattr(node, field), field)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _secret_values(value, str(key))
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _secret_values(value, name)


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


def _quieten(level: str) -> None:
    for name in CHATTY:
        # Their warnings still show; DEBUG asks for everything.
        logging.getLogger(name).setLevel(level if level == "DEBUG" else "WARNING")


class Scrub:
    """Replaces secrets in text: those long enough to be secrets (`maskable`), longest
    first, whoever gathered them."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = maskable(secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text


def redact(url: str) -> str:
    """A web URL (an API's, the LLM's) fit for logs and error messages: its password and the
    query values named as credentials (`?password=`, `?api_key=`) shown as `***`, and its
    path too when the URL cannot be read as written (`_split`). Works on the raw text, so it
    cannot fail on a malformed URL."""
    split = _split(url)
    if split is None:
        return _scheme(url) + MASK
    parts, clear = split
    query = "&".join(
        f"{name}={MASK}" if equals and SECRET_NAME.search(name) else f"{name}{equals}{value}"
        for name, equals, value in (pair.partition("=") for pair in parts.query.split("&"))
    )
    userinfo, at, _ = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0] + ":" + MASK if ":" in userinfo else userinfo
    shown = f"{parts.scheme}://{user}{at}{_hosts(parts.netloc)}"
    if not clear:
        return f"{shown}/{MASK}"
    return shown + parts.path + (f"?{query}" if parts.query else "")


def store_url(url: str) -> str:
    """A store's URL (`LASTWORD_REDIS_URL`) as logs, errors, doctor and status show it: its
    scheme, host(s) and port(s), and which database (its number, the primary a Sentinel URL
    names, a socket's path). User info is `***`; the rest (a `?password=`, TLS options) is
    left out. Works on the raw text, so it cannot fail."""
    split = _split(url)
    if split is None or not split[1]:
        # An '@' after the host: the password's tail, once misread, could be anywhere.
        return _scheme(url) + MASK
    parts = split[0]
    _, at, _ = parts.netloc.rpartition("@")
    path = parts.path if re.fullmatch(r"[\w./~+-]*", parts.path) else "/" + MASK
    db = [
        value
        for name, _, value in (pair.partition("=") for pair in parts.query.split("&"))
        if name == "db" and value.isdigit()
    ]
    return f"{parts.scheme}://{MASK + at if at else ''}{_hosts(parts.netloc)}{path}" + (
        f"?db={db[0]}" if db else ""
    )


def masked_url(url: str) -> str:
    """The URL as scheme, host and port only, for a URL whose every other part may be a
    credential (an MCP server's `?api_key=…` or `/s/<secret>/`): user info, path, query and
    fragment are each shown as `***` when present. Works on the raw text, so it cannot fail."""
    split = _split(url)
    if split is None:
        return _scheme(url) + MASK
    parts = split[0]
    _, at, _ = parts.netloc.rpartition("@")
    shown = f"{parts.scheme}://{MASK + at if at else ''}{_hosts(parts.netloc)}"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{shown}/{MASK}"
    return shown + parts.path


def _split(url: str) -> tuple[SplitResult, bool] | None:
    """The URL's parts, and whether they are clear: no '@' after the host. A password holding
    an unencoded /, ?, # or @ leaves its tail past the host, where any part may be the
    password's, and the user info before it is then read as the host (`_hosts` masks a port
    that is no number). None for text that is no URL (`scheme://` first), or one whose
    brackets are left open."""
    if not _scheme(url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts, "@" not in parts.path + parts.query + parts.fragment


def _scheme(url: str) -> str:
    """The URL's `scheme://`, empty for text that does not start with one."""
    scheme, sep, _ = url.partition("://")
    return scheme + sep if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) and sep else ""


def _hosts(netloc: str) -> str:
    """The host(s) and port(s) of a URL's authority, user info left out: a host or port that
    cannot be one (the tail of a password misread as `host:port`) shown as `***`."""
    shown = []
    for hostport in netloc.rpartition("@")[2].split(","):
        host, colon, port = hostport.rpartition(":")
        if not colon or (host.startswith("[") and not host.endswith("]")):
            host, colon, port = hostport, "", ""
        host = host if re.fullmatch(r"\[[0-9A-Fa-f:.]*\]|[\w.-]*", host) else MASK
        shown.append(host + colon + (port if port.isdigit() or not colon else MASK))
    return ",".join(shown)


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
        conv = conversation.get()
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        when += f".{int(record.msecs):03d}Z"
        if self.style == "text":
            where = f" [{conv}]" if conv else ""
            return f"{when} {record.levelname} {record.name}{where}: {message}"
        fields: dict[str, str] = {
            "ts": when,
            "level": record.levelname.lower(),
            "logger": record.name,
            "replica": self.replica,
        }
        if conv:
            fields["conversation"] = conv
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
