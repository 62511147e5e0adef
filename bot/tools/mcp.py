"""Tools from MCP servers, through the official `mcp` SDK: one `McpSource` per configured
server (`LASTWORD_TOOLS__MCP_SERVERS`), started once per replica.

A stdio server whose command is a bare `python` or `python3` is run as lastword's own
interpreter (`sys.executable`), and every line that names the server says so (`describe`): an
MCP server `pip install`ed beside lastword is then found whatever PATH holds, or lacks (a
unit's PATH has no venv; a shell's `python` may be pyenv's, the system's, or none). Any other
command, a path included, is run as written.

A source owns its server's session in one long-lived task, because the SDK's transports and
session are async context managers built on anyio cancel scopes, which must be entered and
exited by the same task. Calls from other tasks only send requests over the session. The task
starts the server (a child process over stdio, through lastword's own transport in
`bot.tools.stdio`, or a streamable HTTP connection through `bot.tools.http_limits`'s
transport), lists its tools within the start timeout and offers them; when the session ends
(the process exits, the connection closes, a stdio server wrote a message over
`max_message_bytes`) or will not start, it tries again after a backoff of 1 s doubling to
60 s, and offers the tools as listed again. A call in flight when the server dies fails with
an unknown outcome; one whose answer was over the limit fails with `TooLong` (it ran: it
answered), over either transport; a call made while the server restarts waits for it (the
toolbox's call timeout bounds the wait).

Each call carries its idempotency key in the request's `_meta`, under `KEY_META`, so a server
that honours it can make a repeated call harmless.

What a server says reaches the log cut to a few hundred characters, and masked: its URL is
shown as scheme, host and port only, and its headers, its environment's credentials and its
whole URL are masked wherever they appear (`bot.config.secrets.server_secrets`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import anyio

from bot.backoff import Backoff
from bot.config.secrets import server_secrets
from bot.config.settings import McpServer
from bot.masking import Scrub, masked_url
from bot.tools import OutcomeUnknown, Runner, Tool, cut, well_named
from bot.tools.stdio import MAX_MESSAGE_BYTES, TOO_LONG, LastWords, stdio_client

if TYPE_CHECKING:
    from mcp.client import Client, Transport
    from mcp.client.stdio import StdioServerParameters
    from mcp.types import CallToolResult, RequestParamsMeta
    from mcp.types import Tool as McpTool

log = logging.getLogger(__name__)

# Where a call's idempotency key goes in the request's `_meta` (a prefixed key, as MCP asks of
# keys that are not its own).
KEY_META = "lastword/idempotency-key"
# Restarting a server that failed or died: never a tight loop.
RESTART_FIRST_S = 1.0
RESTART_CAP_S = 60.0
# Closing a session: the stdio transport closes a child's stdin, waits 2 s, then terminates
# and kills its process group, each step bounded; this is the backstop over all of it.
CLOSE_TIMEOUT_S = 10.0
# A server that lists tools on more pages than this is cut off there (each page is a request).
MAX_PAGES = 20
# Streamable HTTP: as the SDK's own default client (a response stream may stay open for long).
HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0
# The commands that name "a Python" rather than a program: run as lastword's own interpreter.
OWN_PYTHON = frozenset({"python", "python3"})


T = TypeVar("T")


class ToolError(Exception):
    """The server ran the tool and it reported failure (`isError`): the text is its own."""


class ServerDown(OutcomeUnknown):
    """The server went away while the call was in flight: whether the tool ran is unknown."""


class TooLong(Exception):
    """The server's answer to the call was over the message limit, so the server was stopped:
    the tool ran and answered, too much, so the outcome is known (an error)."""


def command_of(config: McpServer) -> str:
    """The program a stdio server is started as: its command, or lastword's own interpreter
    for a bare `python` or `python3` (when it knows its own path)."""
    assert config.command is not None
    if config.command in OWN_PYTHON and sys.executable:
        return sys.executable
    return config.command


def describe(config: McpServer) -> str:
    """The server as logs and `doctor` show it: its command (and what a bare `python` runs),
    or its URL's scheme, host and port; never its arguments, headers, environment, or the
    rest of its URL, any of which may hold a credential."""
    if config.url is not None:
        return masked_url(str(config.url))
    command, run = config.command, command_of(config)
    return command if run == command else f"{command} = lastword's interpreter {run}"


def with_stderr(why: str, last_words: LastWords, scrub: Callable[[str], str]) -> str:
    """`why`, and what the server last wrote on its stderr when it wrote anything, masked by
    `scrub`: a server that will not start says why itself (`No module named …`), where the
    session only sees its end (`Connection closed`)."""
    told = last_words.told(scrub)
    return f"{why}; its stderr ended: {told}" if told else why


def reason(exc: BaseException, scrub: Scrub | None = None) -> str:
    """One line on why a start or a call failed, from the first leaf of an exception group,
    masked by `scrub` and then cut for a log line (masked first, so that no cut leaves part
    of a secret unmasked)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return cut(scrub(line) if scrub is not None else line)


def tools_of(server: str, config: McpServer, listed: list[McpTool]) -> list[tuple[Tool, str]]:
    """The server's tools as lastword offers them, each with its name on the server. Whether a
    tool has side effects: the configuration's rule for the tool, else the server's, else the
    tool's own `readOnlyHint` (no hint: it has them). Admin-only: the tool's rule, else the
    server's."""
    found = []
    for tool in listed:
        rule = config.tools.get(tool.name)
        hints = tool.annotations
        side_effects = not (hints is not None and hints.read_only_hint is True)
        if config.side_effects is not None:
            side_effects = config.side_effects
        if rule is not None and rule.side_effects is not None:
            side_effects = rule.side_effects
        admin_only = config.admin_only
        if rule is not None and rule.admin_only is not None:
            admin_only = rule.admin_only
        offered = Tool(
            name=well_named(tool.name),
            description=tool.description or tool.title or tool.name,
            parameters=dict(tool.input_schema),
            side_effects=side_effects,
            admin_only=admin_only,
            source=f"mcp:{server}",
            title=(hints.title if hints is not None else None) or tool.title or "",
            origin=tool.name,
        )
        found.append((offered, tool.name))
    unknown = sorted(set(config.tools) - {tool.name for tool in listed})
    if unknown:
        log.warning(
            "MCP server %s has no tool named %s, which its configuration has a rule for",
            server,
            cut(", ".join(unknown)),
        )
    return found


def text_of(result: CallToolResult) -> str:
    """A tool's result as the model reads it: its text content joined, its structured content
    as JSON when it gave no text, and any other content named. Raises `ToolError` carrying the
    text when the tool reported failure."""
    from mcp.types import EmbeddedResource, TextContent, TextResourceContents

    texts: list[str] = []
    others: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            texts.append(block.text)
        elif isinstance(block, EmbeddedResource) and isinstance(
            block.resource, TextResourceContents
        ):
            texts.append(block.resource.text)
        else:
            others.append(f"[{block.type.replace('_', ' ')} omitted]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(texts + others)
    if result.is_error:
        raise ToolError(text or "the tool reported an error and said nothing more")
    return text


def _unheard(ending: _Ending) -> None:
    """Nobody to tell of a session's end (`probe`'s session)."""


@dataclass
class _Ending:
    """How one session ends, as its transport sees it: `over` once it has ended (or must),
    and whether the server was stopped for a message over the limit. `ended` is told at once,
    so that no call is sent on a session that is over while it winds down."""

    ended: Callable[[_Ending], None] = _unheard
    over: asyncio.Event = field(default_factory=asyncio.Event)
    overlong: bool = False
    # What a stdio server last wrote on its stderr, complete once its transport has exited.
    last_words: LastWords = field(default_factory=LastWords)

    @property
    def ending(self) -> bool:
        """Whether the session is over or being ended: no call is to be sent on it."""
        return self.overlong or self.over.is_set()

    def end(self) -> None:
        self.over.set()
        self.ended(self)

    def overran(self) -> None:
        """The server is being stopped for a message over the limit. The session is not over
        yet: the call that message answered is to hear of it first."""
        self.overlong = True
        self.ended(self)


class _Watched(Generic[T]):
    """A transport's read stream that calls `ended` when the server's side ends (the child
    exited, the connection closed): how the owner learns its session is over. Everything else
    is the inner stream's."""

    def __init__(self, inner: Any, ended: Callable[[], None]) -> None:
        self.inner = inner
        self.ended = ended

    @property
    def last_context(self) -> Any:
        # The SDK looks for this on context-carrying streams (streamable HTTP's).
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> T:
        try:
            item: T = await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.ended()
            raise
        return item

    def __aiter__(self) -> _Watched[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self.ended()
        await self.inner.aclose()

    async def __aenter__(self) -> _Watched[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _stdio(config: McpServer) -> StdioServerParameters:
    from mcp.client.stdio import StdioServerParameters

    assert config.command is not None
    # The transport merges `env` over a minimal environment (`bot.tools.stdio.INHERITED`):
    # the server does not see lastword's own settings and secrets.
    return StdioServerParameters(
        command=command_of(config), args=config.args, env=config.env or None, cwd=config.cwd
    )


@asynccontextmanager
async def _transport(
    server: str, config: McpServer, ending: _Ending, max_message_bytes: int
) -> AsyncIterator[Any]:
    """The server's read and write streams, the read one watched for its end."""
    if config.command is not None:
        async with stdio_client(
            _stdio(config),
            name=server,
            max_message_bytes=max_message_bytes,
            on_overlong=ending.overran,
            last_words=ending.last_words,
        ) as (read, write):
            yield _Watched[Any](read, ending.end), write
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from bot.tools.http_limits import BoundedTransport

    url = str(config.url)
    timeout = httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S)
    bounded = BoundedTransport(server, url, max_message_bytes)
    # The SDK's own limit on an event, as a backstop only: the transport hands on events of
    # at most the limit in bytes, which decode to at most three times as many.
    backstop = 3 * max_message_bytes
    async with (
        httpx2.AsyncClient(headers=config.headers, timeout=timeout, transport=bounded) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=backstop) as streams,
    ):
        yield _Watched[Any](streams[0], ending.end), streams[1]


def _client(server: str, config: McpServer, ending: _Ending, max_message_bytes: int) -> Client:
    from mcp.client import Client
    from mcp.types import Implementation

    transport: Transport = _transport(server, config, ending, max_message_bytes)
    # No response cache: a restarted server is listed afresh, and a call always reaches it.
    return Client(
        transport, cache=None, client_info=Implementation(name="lastword", version=_version())
    )


def _version() -> str:
    try:
        return version("lastword")
    except PackageNotFoundError:
        return "unknown"


async def _listed(client: Client) -> list[McpTool]:
    tools: list[McpTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


async def probe(
    server: str,
    config: McpServer,
    timeout_s: float,
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    last_words: LastWords | None = None,
) -> list[Tool]:
    """Start the server, list its tools and stop it, all within `timeout_s`, as a replica
    does: `doctor`'s check. Raises what went wrong (TimeoutError when it did not answer in
    time), by when `last_words` holds what a stdio server last wrote on its stderr."""
    ending = _Ending(last_words=last_words or LastWords())
    with anyio.fail_after(timeout_s):
        async with _client(server, config, ending, max_message_bytes) as client:
            listed = await _listed(client)
    return [tool for tool, _ in tools_of(server, config, listed)]


@dataclass(frozen=True)
class McpRunner:
    """Runs one tool of a source by its name on the server, whatever the toolbox calls it."""

    source: McpSource
    name: str

    async def __call__(self, tool: Tool, arguments: dict[str, Any], key: str) -> str:
        return await self.source.call(self.name, arguments, key)


# What a source does with its tools each time the server is (re)started and listed.
Offer = Callable[[str, list[tuple[Tool, Runner]]], None]


class McpSource:
    """One configured MCP server, kept running for this replica's life."""

    def __init__(
        self,
        name: str,
        config: McpServer,
        start_timeout_s: float,
        offer: Offer,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.name = name
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.offer = offer
        self.max_message_bytes = max_message_bytes
        self.source = f"mcp:{name}"
        # What its failures are masked of before they are logged.
        self.scrub = Scrub(server_secrets(config))
        self._client: Client | None = None
        # Set while a session is up and not over; calls wait on it.
        self._up = asyncio.Event()
        # Set once the first start has succeeded or failed: what `load_toolbox` waits for.
        self.tried = asyncio.Event()
        # How the current session ends (its server ended, or close() asked).
        self._ending = _Ending(self._ended)
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        # Sessions that got up, so far.
        self.starts = 0

    def start(self) -> None:
        """Start the server in the background: `tried` is set once the first attempt ended."""
        self._task = asyncio.create_task(self._own(), name=f"mcp {self.name}")

    async def call(self, name: str, arguments: dict[str, Any], key: str) -> str:
        """Run tool `name` (as the server calls it), waiting for the server to be up first.
        Unbounded here: the toolbox bounds every call."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        while not self._up.is_set():
            await self._up.wait()
        client, ending = self._client, self._ending
        assert client is not None
        try:
            # An open mapping at run time; mypy does not know PEP 728's extra items yet.
            meta = cast("RequestParamsMeta", {KEY_META: key})
            result = await client.call_tool(name, arguments, meta=meta)
        except MCPError as exc:
            if exc.code == TOO_LONG:
                # Over stdio the server is stopped (its pipe is left mid-message); over HTTP
                # only that answer is dropped.
                stopped = ", so the server was stopped and is restarted" if ending.overlong else ""
                raise TooLong(
                    f"the answer of the MCP server {self.name} was over "
                    f"{self.max_message_bytes} bytes{stopped}"
                ) from None
            if exc.code != CONNECTION_CLOSED:
                raise
            ending.end()
            if ending.overlong:
                raise ServerDown(
                    f"the MCP server {self.name} was stopped during the call, for a message "
                    f"over {self.max_message_bytes} bytes: the call's outcome is unknown"
                ) from exc
            raise ServerDown(
                f"the MCP server {self.name} went away during the call: its outcome is unknown"
            ) from exc
        return text_of(result)

    async def close(self) -> None:
        """End the session and the server's process, within `CLOSE_TIMEOUT_S` or so."""
        self._closing = True
        self._ending.end()
        task = self._task
        if task is None:
            return
        if self._client is None:
            # Starting or waiting to retry: nothing to end gracefully.
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)

    def _ended(self, ending: _Ending) -> None:
        """A session is over: no call is sent on it from now on (if it is still the current
        one: a late word from an older session changes nothing)."""
        if ending is self._ending:
            self._up.clear()

    async def _own(self) -> None:
        """Start, serve, and restart after a backoff when the session fails or ends."""
        backoff = Backoff(RESTART_FIRST_S, RESTART_CAP_S)
        said = ""
        while not self._closing:
            began, starts = asyncio.get_running_loop().time(), self.starts
            try:
                await self._session()
                why = "its session ended (the server exited or closed the connection)"
            except Exception as exc:  # whatever the SDK or the server raised: retried
                why = reason(exc, self.scrub)
            told = why
            if self._ending.overlong:
                why = told = (
                    f"it wrote a message over {self.max_message_bytes} bytes, so it was stopped"
                )
            elif starts == self.starts:
                # It never got up: its own last words are the likeliest cause.
                told = with_stderr(why, self._ending.last_words, self.scrub)
            self.tried.set()
            if self._closing:
                break
            if asyncio.get_running_loop().time() - began > RESTART_CAP_S:
                backoff.reset()
            delay = backoff.next_delay()
            # A WARNING when it goes down, or fails anew; failing again as before is INFO
            # (whatever it wrote on stderr: a time stamp there makes no failure new).
            level = logging.INFO if why == said and starts == self.starts else logging.WARNING
            said = why
            log.log(
                level,
                "MCP server %s (%s) is not running: %s; starting it again in %g s",
                self.name,
                describe(self.config),
                told,
                delay,
            )
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        """One session: start the server and list its tools within the start timeout, offer
        them, and hold the session until it is over."""
        self._ending = ending = _Ending(self._ended)
        limit = self.max_message_bytes
        with anyio.CancelScope(deadline=anyio.current_time() + self.start_timeout_s) as start:
            async with _client(self.name, self.config, ending, limit) as client:
                listed = await _listed(client)
                start.deadline = math.inf
                tools = tools_of(self.name, self.config, listed)
                offered: list[tuple[Tool, Runner]] = [
                    (tool, McpRunner(self, name)) for tool, name in tools
                ]
                self.offer(self.source, offered)
                log.info(
                    "MCP server %s (%s) is up with %d tools: %s",
                    self.name,
                    describe(self.config),
                    len(tools),
                    cut(", ".join(tool.name for tool, _ in tools)),
                )
                self._client = client
                self.starts += 1
                if not ending.ending:
                    self._up.set()
                self.tried.set()
                try:
                    await ending.over.wait()
                finally:
                    self._up.clear()
                    self._client = None
        if start.cancelled_caught:
            raise TimeoutError(f"no tools listed within {self.start_timeout_s:g} s")
