"""The byte limit on an MCP server's messages over streamable HTTP: the same as stdio's
(`LASTWORD_TOOLS__MAX_MESSAGE_BYTES`, `bot.tools.stdio`), enforced while the answer is read.

The SDK's streamable-HTTP client reads a JSON answer whole (`aread`), then parses it, with no
limit: a server answering 100 MB stalled the replica's loop for 1-2 s and took a GB of
memory. `BoundedTransport` is the httpx2 transport under the SDK's client, so every answer
passes through it, as it comes, before the SDK sees any of it:

- **A JSON answer** is read in the transport's chunks, counted as it comes (a declared
  `Content-Length` over the limit is refused before a byte is read), and handed on whole only
  within the limit. One over it is dropped as soon as it passes the limit (the connection
  closed) and the request it answers gets the JSON-RPC error `TOO_LONG` in its place: the
  tool answered, too much, so its call is an error with a known outcome, as over stdio. The
  session stays up (unlike stdio, nothing is left half-read on a shared pipe).
- **An event stream** (SSE) is handed on a whole event at a time, each at most the limit: an
  event over it is dropped unread past the limit, and the request whose stream it was gets
  `TOO_LONG` as the stream's last event; the server's own stream (a GET, answering nothing)
  is ended with an error, which the SDK counts against its reconnections.
- **No compression**: every request asks for `identity`, since a limit on compressed bytes
  bounds nothing; an answer compressed anyway is refused the same way.

So at most one message's limit is held per answer, and the SDK parses only messages within
it, as stdio's. Proxies are the environment's, as the SDK's own client takes them.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from collections.abc import AsyncIterator

import httpx2

from bot.tls import client_context
from bot.tools.stdio import TOO_LONG

# The logger of everything about MCP servers (`bot.tools.stdio`'s).
log = logging.getLogger("bot.tools.mcp")

# JSON-RPC's code for an internal error: what a request gets for an answer lastword refuses
# for its form (compressed), not its size.
REFUSED = -32603
# Where an event ends: a line's end followed by an empty line (SSE ends lines with CRLF, LF
# or CR). A CRLF blank line is matched at its LF-CR pair, its last LF counted in the next
# event: a byte's difference, never an event merged or split, since every byte is handed on
# as it came.
_EVENT_END = re.compile(rb"\n[\r\n]|\r\r")


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url` (`HTTPS_PROXY`, `NO_PROXY` and the like),
    if any: httpx2 takes none from the environment for a client given its own transport."""
    parsed = httpx2.URL(url)
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(parsed.host):
        return None
    return proxies.get(parsed.scheme) or proxies.get("all")


def answering(request: httpx2.Request) -> int | str | None:
    """The id of the JSON-RPC request a POST carries: what its answer answers. None for
    anything else (a notification, a response, a GET or a DELETE), whose answer the SDK
    never reads as a message."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):
        return None
    if not isinstance(message, dict) or "method" not in message:
        return None
    asked = message.get("id")
    if isinstance(asked, bool) or not isinstance(asked, int | str):
        return None
    return asked


def _error(asked: int | str, code: int, why: str) -> bytes:
    """A JSON-RPC error answering request `asked`."""
    error = {"jsonrpc": "2.0", "id": asked, "error": {"code": code, "message": why}}
    return json.dumps(error).encode()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """httpx2's own transport to one MCP server, every answer bounded by `limit` bytes a
    message (see the module). `server` names it in the log."""

    def __init__(self, server: str, url: str, limit: int) -> None:
        self.server = server
        self.limit = limit
        self.inner = httpx2.AsyncHTTPTransport(verify=client_context(), proxy=proxy_for(url))

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self.inner.handle_async_request(request)
        asked = answering(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            why = f"the answer was compressed ({encoding}), though lastword asked for none"
            log.warning("MCP server %s: %s; refused", self.server, why)
            return self._answer(response, asked, REFUSED, why)
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)  # an async transport's
        if kind == "text/event-stream":
            events = Events(stream, self.limit, self.server, asked)
            return httpx2.Response(
                response.status_code,
                headers=response.headers,
                stream=events,
                extensions=response.extensions,
            )
        if asked is None:
            # An answer to no request (a notification's, a DELETE's): the SDK reads only its
            # status, never its body.
            return response
        body = await self._read(response, stream)
        if body is None:
            why = f"the answer was over {self.limit} bytes"
            return self._answer(response, asked, TOO_LONG, why)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            content=body,
            extensions=response.extensions,
        )

    async def _read(
        self, response: httpx2.Response, stream: httpx2.AsyncByteStream
    ) -> bytes | None:
        """The whole body, or None once it is over the limit (the rest never read)."""
        try:
            declared = int(response.headers.get("content-length", ""))
        except ValueError:
            declared = 0
        body = bytearray()
        try:
            if declared > self.limit:
                self._over(declared)
                return None
            async for chunk in stream:
                body += chunk
                if len(body) > self.limit:
                    self._over()
                    return None
        finally:
            await response.aclose()
        return bytes(body)

    def _over(self, declared: int = 0) -> None:
        """Say that an answer was refused for its size."""
        said = f"; it declared {declared}" if declared else ""
        log.warning(
            "MCP server %s answered with a message over %d bytes "
            "(LASTWORD_TOOLS__MAX_MESSAGE_BYTES%s): refused, its call is an error",
            self.server,
            self.limit,
            said,
        )

    def _answer(
        self, response: httpx2.Response, asked: int | str | None, code: int, why: str
    ) -> httpx2.Response:
        """The JSON-RPC error `code` for request `asked`, as the server's answer; a read error
        for an answer no request waits for."""
        if asked is None:
            raise httpx2.ReadError(f"MCP server {self.server}: {why}")
        return httpx2.Response(
            200,
            headers={"content-type": "application/json"},
            content=_error(asked, code, why),
            extensions=response.extensions,
        )


class Events(httpx2.AsyncByteStream):
    """An event stream handed on a whole event at a time, each at most `limit` bytes. Past
    the limit the stream ends: with a `TOO_LONG` event for request `asked`, or, with none to
    tell, a read error. Each byte is looked at once to find where events end (where the last
    chunk ended, a byte back, is where the next look starts)."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, limit: int, server: str, asked: int | str | None
    ) -> None:
        self.inner = inner
        self.limit = limit
        self.server = server
        self.asked = asked

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = bytearray()
        async for chunk in self.inner:
            start = max(len(pending) - 1, 0)
            pending += chunk
            # Where the last whole event within the limit ends; whether one was over it.
            end, over = 0, False
            for found in _EVENT_END.finditer(pending, start):
                if found.end() - end > self.limit:
                    over = True
                    break
                end = found.end()
            if end:
                yield bytes(pending[:end])
                del pending[:end]
            if over or len(pending) > self.limit:
                yield self._over()
                return
        if pending:
            yield bytes(pending)

    def _over(self) -> bytes:
        """What ends the stream of an event over the limit: its request's error, as an event."""
        log.warning(
            "MCP server %s sent an event over %d bytes (LASTWORD_TOOLS__MAX_MESSAGE_BYTES): "
            "refused, %s",
            self.server,
            self.limit,
            "its call is an error" if self.asked is not None else "its stream is closed",
        )
        if self.asked is None:
            raise httpx2.ReadError(f"MCP server {self.server}: an event over {self.limit} bytes")
        why = f"the answer was over {self.limit} bytes"
        return b"event: message\ndata: " + _error(self.asked, TOO_LONG, why) + b"\n\n"

    async def aclose(self) -> None:
        await self.inner.aclose()
