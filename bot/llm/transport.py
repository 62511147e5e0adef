"""The OpenAI client's HTTP transport: aiohttp under httpx2's interface, so that the client
keeps its own request building and errors while the connections are aiohttp's pool (one per
generation in flight, `MAX_CONNECTIONS`), and a cancelled generation closes its connection at
once (the provider stops generating, and charging)."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import AsyncIterator

import aiohttp
import httpx2

from bot.tls import client_context

# Connections to the provider at most, as the OpenAI client's own pool allows: one per
# generation in flight.
MAX_CONNECTIONS = 1000


def http_client(timeout_s: float) -> httpx2.AsyncClient:
    """The OpenAI client's HTTP client, as its default one (redirects followed, the same
    certificates), sending over aiohttp (`AiohttpTransport`)."""
    transport = AiohttpTransport(client_context())
    return httpx2.AsyncClient(transport=transport, timeout=timeout_s, follow_redirects=True)


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport (what the OpenAI client sends through) over an aiohttp session.

    httpx's connection pool looks over every pooled connection on each request, checking
    each for expiry with a system call or two, and parses responses in Python: with a hundred
    generations streaming at once, a flooded replica spent about a sixth of its event loop
    there. aiohttp keeps idle connections per host in a queue and parses HTTP in C. Above it
    the client is unchanged: base URL, key, headers, status errors; each request's timeouts
    are honoured here, and a transport failure is raised as the httpx2 error the client maps.
    Proxies come from the environment, as httpx takes them (`_proxy`).
    """

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        self._ssl = ssl_context
        # Made on the first request, on the loop that sends it.
        self._session: aiohttp.ClientSession | None = None
        # HTTPS_PROXY, NO_PROXY and the like, read once, as httpx reads them for its client.
        self._proxies = urllib.request.getproxies()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        limits = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            connect=limits.get("pool"),
            sock_connect=limits.get("connect"),
            sock_read=limits.get("read"),
        )
        try:
            response = await self._session_now().request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=await request.aread(),
                timeout=timeout,
                allow_redirects=False,
                proxy=self._proxy(request.url),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc
        return httpx2.Response(
            response.status,
            headers=response.raw_headers,
            stream=_AiohttpBody(response),
            extensions={"reason_phrase": (response.reason or "").encode()},
        )

    def _proxy(self, url: httpx2.URL) -> str | None:
        """The proxy the environment names for `url`, if any."""
        if not self._proxies or urllib.request.proxy_bypass(url.host):
            return None
        return self._proxies.get(url.scheme) or self._proxies.get("all")

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=self._ssl)
            # The body as sent: httpx decodes it, by its headers. Cookies are httpx's too (it
            # sets them on the request). No trust_env: it reads ~/.netrc in a thread on every
            # request; the proxies it would take from the environment come from `_proxy`.
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session


class _AiohttpBody(httpx2.AsyncByteStream):
    """A response body as httpx2 reads it: the chunks as they come."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc

    async def aclose(self) -> None:
        # A body read to its end leaves its connection to the next request; one cut short (a
        # cancelled generation) drops it, which is how the provider learns to stop.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _httpx_error(exc: aiohttp.ClientError | TimeoutError) -> Exception:
    """The httpx2 error the OpenAI client expects for an aiohttp failure."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx2.ConnectTimeout(str(exc))
    if isinstance(exc, TimeoutError):
        return httpx2.ReadTimeout(str(exc))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx2.ConnectError(str(exc))
    return httpx2.ReadError(str(exc))
