"""Logging: one line per event, as text for a terminal or as logfmt/JSON for the journal.

Every line carries the replica's id, and every line logged while a conversation is being
handled carries that conversation, set once per task through a context variable, so an
admin can follow one conversation across replicas with a plain `grep`.

Secrets never reach a log line: every configured secret (every secret setting, a platform's
own tokens too, the Redis password, LLM header values) is replaced by `***` in the final
text, whoever logged it. That matters because libraries log what they see; httpx, for one,
logs each request URL, and a platform's API may put the bot's token in the URL (Telegram's
does). This module is the one place that knows what a secret is: error messages and
`lastword doctor` mask them with the same `Scrub` and `redact`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Literal
from urllib.parse import parse_qs, urlparse, urlsplit, urlunparse

from pydantic import BaseModel, SecretStr

from bot.settings import McpServer, Settings

# What a secret is replaced with.
MASK = "***"
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
    the Redis password, the LLM's header values and each MCP server's (`server_secrets`)."""
    values = list(_secret_values(settings))
    if settings.redis_url:
        parts = urlparse(settings.redis_url)
        if parts.password:
            values.append(parts.password)
        # redis-py also takes the password as a query parameter.
        values += parse_qs(parts.query).get("password", [])
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
    credentials, and of its URL the whole text (an MCP URL often carries its credential in
    its path or query: the HTTP library logs every request's URL), the password and the query
    values whose names say they are credentials (`?api_key=`)."""
    values = [*server.headers.values(), *secret_env(server.env)]
    if server.url is not None:
        url = str(server.url)
        parts = urlsplit(url)
        values.append(url)
        pairs = (pair.partition("=") for pair in parts.query.split("&"))
        values += (value for name, _, value in pairs if SECRET_NAME.search(name))
        if parts.password:
            values.append(parts.password)
    return values


def _secret_values(node: object) -> Iterator[str]:
    """Every `SecretStr` in a settings tree: in its models, lists and mappings."""
    if isinstance(node, SecretStr):
        yield node.get_secret_value()
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            yield from _secret_values(getattr(node, name))
    elif isinstance(node, dict):
        for value in node.values():
            yield from _secret_values(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _secret_values(value)


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
    """The URL without its password, fit for logs and error messages, before any settings
    (and so any `Scrub`) exist, or for a URL that is not in them.

    Works on the raw text (no port parsing), so it cannot fail on a malformed URL, and it
    also hides a `password=` query parameter, which redis-py accepts too.
    """
    parts = urlparse(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + MASK
    netloc = f"{userinfo}{at}{host}"
    query = "&".join(
        "password=" + MASK if pair.lower().startswith("password=") else pair
        for pair in parts.query.split("&")
    )
    if (netloc, query) == (parts.netloc, parts.query):
        # Unchanged: keep the text as given (urlunparse would turn unix:///x into unix:/x).
        return url
    return urlunparse(parts._replace(netloc=netloc, query=query))


def masked_url(url: str) -> str:
    """The URL as scheme, host and port only, for a URL whose every other part may be a
    credential (an MCP server's `?api_key=…` or `/s/<secret>/`): user info, path, query and
    fragment are each shown as `***` when present. Works on the raw text, so it cannot fail."""
    parts = urlsplit(url)
    _, at, host = parts.netloc.rpartition("@")
    shown = f"{parts.scheme}://{MASK + at if at else ''}{host}"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{shown}/{MASK}"
    return shown + parts.path


class LineFormatter(logging.Formatter):
    """Formats a record as one line of text, logfmt or JSON, with the replica, the
    conversation (when there is one) and any traceback folded into the line."""

    def __init__(
        self,
        style: Literal["text", "logfmt", "json"],
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


def _relevant(record: logging.LogRecord) -> bool:
    return not any(record.name == name and text in record.getMessage() for name, text in IRRELEVANT)


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
    handler.addFilter(_relevant)
    # discord.py imports its voice support (audioop) eagerly; lastword sends no audio.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    level = settings.log_level or default_level
    root.setLevel(level)
    _quieten(level)
    return formatter
