"""An MCP server for the tool tests, written with the `mcp` SDK's own server side: run as
`python -m tests.support.fakes.mcp_append_server` it speaks stdio; with `--http` it serves
streamable HTTP on a loopback port of its choosing, prints `PORT <n>` as its first line of stdout,
and answers only requests that carry `Authorization: Bearer $LW_TOKEN` (so a test sees the
configured headers sent).

Its one side effect is a line appended to the file `LW_APPEND_FILE` names (the argument and
the call's idempotency key, as the request's `_meta` carried it): the file is how a test counts
the times a call really ran. `LW_STARTS_FILE`, when set, gets a line per start (its pid), so a
test can see a restart happen and find the process. `LW_TIMES_FILE`, when set, gets a line per
run of `append` and `read_only_echo`: the tool, its text, the idempotency key, and when the
tool's own work started and ended (`time.monotonic()`, one clock for every process here), so a
benchmark can take the tool's own time out of a tool step's. With `LW_LINGER` set, it outlives
the end of its stdin and ignores SIGTERM. With `LW_FAIL_ONCE` naming a file that does not
exist yet, it creates the file and exits at once: its first start fails, the next succeeds.

For the bounds on what a server may send: `flood` answers with as many bytes as asked in one
message (over HTTP, as a JSON body, or with `sse` as one server-sent event, streamed a MiB at
a time by `_flooding` ahead of the SDK), `boom` fails with as long an error as asked,
`complain` writes to its stderr (as many lines as asked, its environment's variables
expanded), and `env_names` names the variables in its environment. With `LW_MANY_TOOLS` set
to a number, it offers that many more tools (`many_0001`, …), each with a schema of about
`MANY_TOOL_BYTES` bytes as a Chat Completions request carries it: a toolbox bigger than a
model's context.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The `_meta` key lastword puts each call's idempotency key under.
KEY_META = "lastword/idempotency-key"

server: MCPServer[Any] = MCPServer("lastword-append", version="1.0")
# The SDK logs through rich where rich is installed: wrapping `boom`'s 3 MB error to 80
# columns took seconds of CPU before the call was answered, past 30 s on a loaded machine.
# Plain lines, as a server without rich writes them, cost the server next to nothing.
logging.basicConfig(
    level=logging.INFO, format="%(message)s", handlers=[logging.StreamHandler()], force=True
)
# The size of each of the `LW_MANY_TOOLS` tools' schemas, as a request's `tools` entry.
MANY_TOOL_BYTES = 992
# Of a flood over HTTP, what is written at once.
MIB = 2**20
# The client's end of stdout, kept before the SDK's server moves it off fd 1 (see `_wire`).
WIRE = 1


def _append(line: str, variable: str = "LW_APPEND_FILE") -> None:
    path = os.environ[variable]
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def _key(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return str(meta.get(KEY_META, ""))


def _timed(tool: str, text: str, ctx: Context, started: float) -> None:
    """A line for the benchmark, if it asked for them: this run of `tool`, start to now."""
    if os.environ.get("LW_TIMES_FILE"):
        ended = time.monotonic()
        _append(f"{tool}\t{text}\t{_key(ctx)}\t{started:.6f}\t{ended:.6f}", "LW_TIMES_FILE")


@server.tool(title="Append a line")
async def append(text: str, ctx: Context, delay_s: float = 0.0) -> str:
    """Append `text` to the test's file (a side effect: no readOnlyHint), then wait `delay_s`."""
    started = time.monotonic()
    _append(f"{text}\t{_key(ctx)}")
    await asyncio.sleep(delay_s)
    _timed("append", text, ctx, started)
    return f"appended {text}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def slow(seconds: float) -> str:
    """Wait `seconds`, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} s"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def boom(pad: int = 0) -> str:
    """Always fails, with `pad` more characters of error."""
    raise ToolError("the boom tool always fails" + "!" * pad)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def big(n: int) -> str:
    """`n` characters of output."""
    return "x" * n


@server.tool(annotations=ToolAnnotations(title="Echo, read only", read_only_hint=True))
def read_only_echo(text: str, ctx: Context) -> str:
    """Say `text` back."""
    _timed("read_only_echo", text, ctx, time.monotonic())
    return text


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def flood(
    n: int, ctx: Context, sse: bool = False, declared: bool = False, gzip: bool = False
) -> str:
    """Answer with `n` bytes of text as one message, written straight to the client a MiB at
    a time as it goes (never held whole in memory), as a server streaming a huge result does.
    Meant for answers over the client's limit: the SDK's own answer follows, for an id
    already answered. Over HTTP `_flooding` answers instead: as one event if `sse`, with its
    `Content-Length` if `declared`, compressed (whole, so keep `n` small) if `gzip`."""
    request = json.dumps(ctx.request_context.request_id)
    _wire(
        b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"'
        % (request.encode())
    )
    mib = b"x" * 2**20
    for start in range(0, n, len(mib)):
        _wire(mib[: n - start])
    _wire(b'"}],"isError":false}}\n')
    return "flooded"


def _wire(data: bytes) -> None:
    """Write to the client: the stdout the process started with, which the SDK's server moves
    off fd 1 (it points fd 1 at stderr, so that a stray print cannot corrupt the stream)."""
    view = memoryview(data)
    while view:
        view = view[os.write(WIRE, view) :]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def complain(text: str, times: int = 1) -> str:
    """Write `text`, its $VARIABLES expanded from the environment, to stderr `times` times,
    a line each."""
    line = os.path.expandvars(text) + "\n"
    for _ in range(times):
        sys.stderr.write(line)
    sys.stderr.flush()
    return f"complained {times} times"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def env_names() -> str:
    """The names of the variables in this server's environment (not their values), sorted,
    as a JSON list."""
    return json.dumps(sorted(os.environ))


@server.tool()
def die() -> str:
    """Exit the process at once, mid-call, as a crashing server does."""
    os._exit(3)


def _many(count: int) -> None:
    """Offer `count` more tools, each with a schema of about `MANY_TOOL_BYTES` bytes."""

    def many(text: str) -> str:
        return text

    overhead = len(json.dumps(_spec("many_0000", "")))
    for i in range(1, count + 1):
        name = f"many_{i:04d}"
        about = f"Tool {i} of {count}: says its text back. " + "Padding. " * 120
        server.add_tool(many, name=name, description=about[: MANY_TOOL_BYTES - overhead])


def _spec(name: str, description: str) -> dict[str, Any]:
    """A `many` tool as a Chat Completions request carries it."""
    parameters = {
        "properties": {"text": {"title": "Text", "type": "string"}},
        "required": ["text"],
        "title": "manyArguments",
        "type": "object",
    }
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def _flooding(app: ASGIApp) -> ASGIApp:
    """`app`, but a call of `flood` over HTTP is answered here, streamed a MiB at a time as a
    JSON body or as one server-sent event (its `sse` argument), never held whole."""

    async def flooding(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        received: list[Message] = []
        more = True
        while more:
            message = await receive()
            received.append(message)
            more = message.get("more_body", False)
        body = b"".join(m.get("body", b"") for m in received)
        try:
            asked = json.loads(body)
            call = asked["params"] if asked.get("method") == "tools/call" else {}
        except (ValueError, AttributeError, KeyError):
            call = {}
        if call.get("name") == "flood":
            await _flood(send, asked["id"], call.get("arguments") or {})
            return
        replay = iter(received)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await app(scope, replayed, send)

    return flooding


async def _flood(send: Send, request: object, arguments: dict[str, Any]) -> None:
    n = int(arguments["n"])
    head = b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"' % (
        json.dumps(request).encode()
    )
    tail = b'"}],"structuredContent":{"result":"flooded"},"isError":false,"resultType":"complete"}}'
    kind = b"application/json"
    if arguments.get("sse"):
        head, tail, kind = b"event: message\ndata: " + head, tail + b"\n\n", b"text/event-stream"
    headers = [(b"content-type", kind)]
    if arguments.get("declared"):
        headers.append((b"content-length", b"%d" % (len(head) + n + len(tail))))
    if arguments.get("gzip"):
        body = gzip.compress(head + b"x" * n + tail)
        headers += [(b"content-encoding", b"gzip"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    mib = b"x" * MIB
    try:
        await send({"type": "http.response.body", "body": head, "more_body": True})
        for start in range(0, n, MIB):
            await send({"type": "http.response.body", "body": mib[: n - start], "more_body": True})
        await send({"type": "http.response.body", "body": tail})
    except OSError:
        pass  # the client hung up, as it should past its limit


def _authorised(app: ASGIApp, token: str) -> ASGIApp:
    """`app`, answering 401 to an HTTP request without `Authorization: Bearer <token>`."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        given = dict(scope.get("headers", [])).get(b"authorization", b"")
        if scope["type"] == "http" and given != f"Bearer {token}".encode():
            await PlainTextResponse("who are you?", status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def _serve_http() -> None:
    # Bound and listening here, not by uvicorn, so the port is known before anyone connects,
    # and a client that connects before uvicorn runs (a loaded machine) waits in the backlog
    # rather than being refused.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    app = _authorised(_flooding(server.streamable_http_app()), os.environ["LW_TOKEN"])
    config = uvicorn.Config(app, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def _linger() -> None:
    """Outlive the end of stdin and ignore SIGTERM, as a badly written server may: only a
    SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def main() -> None:
    starts = os.environ.get("LW_STARTS_FILE")
    if starts:
        with open(starts, "a", encoding="utf-8") as file:
            file.write(f"{os.getpid()} {time.time()}\n")
    fail_once = os.environ.get("LW_FAIL_ONCE")
    if fail_once and not os.path.exists(fail_once):
        open(fail_once, "w").close()
        sys.exit("failing this first start, as asked")
    _many(int(os.environ.get("LW_MANY_TOOLS") or 0))
    if "--http" in sys.argv[1:]:
        _serve_http()
    else:
        global WIRE
        WIRE = os.dup(1)
        server.run("stdio")
        if os.environ.get("LW_LINGER"):
            _linger()


if __name__ == "__main__":
    main()
