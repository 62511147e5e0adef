"""Tools the model may call: what a tool is, what a call and its result are, and the toolbox
that offers a replica's tools and runs one call within its bounds.

Tools come from two sources, each a module of its own: MCP servers (`bot.tools.mcp`, one
client session per server per replica) and Python functions installed in the
`lastword.tools` entry point group (`bot.tools.python`). The cycle sees neither: it asks the
`Toolbox` which tools a user is offered and runs calls through it. Whether a call runs at all,
or reuses the result of an earlier generation of the same burst, is decided in the store
(`bot.store.tools`), before the toolbox is asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

# What the model is told of a result cut to `LASTWORD_TOOLS__OUTPUT_CHARS`.
CUT_NOTE = "\n[cut: the tool's output was {total} characters; the first {kept} are shown]"


@dataclass(frozen=True)
class Tool:
    """One tool as the model is offered it, and what lastword must know to run it safely."""

    name: str  # as the model calls it: unique in the toolbox, [A-Za-z0-9_-]{1,64}
    description: str
    parameters: dict[str, Any]  # a JSON schema of an object
    # Whether running it changes anything outside lastword. A tool that changes something runs
    # at most once per call the model asked for; one that does not may run again.
    side_effects: bool
    admin_only: bool = False
    # Where it comes from, for logs, `doctor` and `/tools`: "mcp:<server>" or "python:<name>".
    source: str = ""
    # A short human title for the draft line ("Using Get current time…"); the name if none.
    title: str = ""

    def spec(self) -> dict[str, Any]:
        """The tool in a Chat Completions request's `tools`."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def shown(self) -> str:
        """What the user sees while it runs."""
        return self.title or self.name.replace("_", " ").capitalize()


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for: its id in this step, the tool's name, and the arguments as
    the JSON text the model wrote (kept as written: the record matches on it)."""

    id: str
    name: str
    arguments: str

    def message(self) -> dict[str, Any]:
        """The call in an assistant message's `tool_calls`."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class OutcomeUnknown(Exception):
    """A call was sent and never answered (the server went away mid-call, or it timed out):
    whether the tool ran is unknown, so one with side effects must not be called again."""


@dataclass(frozen=True)
class ToolResult:
    """What a call gave the model: its text (the tool's output, or what went wrong), and
    whether it failed."""

    text: str
    error: bool = False


class Runner(Protocol):
    """A source's way to run one of its tools: the arguments decoded, and the call's stable
    idempotency key (an MCP server gets it in the request's `_meta`). Returns the output as
    text; raises whatever the tool raised."""

    async def __call__(self, tool: Tool, arguments: dict[str, Any], key: str) -> str: ...


@dataclass
class Toolbox:
    """Every tool this replica offers, each with the runner of its source."""

    tools: dict[str, tuple[Tool, Runner]] = field(default_factory=dict)
    # Called at stop, in order: a source's sessions and child processes.
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def add(self, tools: Iterable[Tool], runner: Runner) -> None:
        """Offer `tools`, run by `runner`. A name already taken gets its source as a prefix,
        so two servers may each have a `search`."""
        for tool in tools:
            name = tool.name
            if name in self.tools:
                prefix = tool.source.partition(":")[2] or tool.source
                name = f"{prefix}_{tool.name}"[:64]
                log.warning(
                    "tool %s of %s is offered as %s: %s already has the name",
                    tool.name,
                    tool.source,
                    name,
                    self.tools[tool.name][0].source,
                )
                tool = Tool(**{**tool.__dict__, "name": name})
            self.tools[name] = (tool, runner)

    def offered(self, admin: bool) -> list[Tool]:
        """The tools a user is offered: all of them for an admin, else those not admin-only."""
        return [tool for tool, _ in self.tools.values() if admin or not tool.admin_only]

    def get(self, name: str) -> Tool | None:
        entry = self.tools.get(name)
        return entry[0] if entry else None

    async def run(self, call: ToolCall, key: str, timeout_s: float, cap: int) -> ToolResult:
        """Run one call within `timeout_s`, its output cut to `cap` characters. Never raises
        for the tool's sake: an unknown tool, arguments that are not a JSON object, a timeout
        or an exception become an error result the model reads. Cancellation propagates."""
        entry = self.tools.get(call.name)
        if entry is None:
            return ToolResult(f"error: there is no tool named {call.name!r}", error=True)
        tool, runner = entry
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            return ToolResult(f"error: the arguments are not JSON ({exc})", error=True)
        if not isinstance(arguments, dict):
            return ToolResult("error: the arguments must be a JSON object", error=True)
        try:
            async with asyncio.timeout(timeout_s):
                text = await runner(tool, arguments, key)
        except TimeoutError:
            log.warning("tool %s (%s) timed out after %gs", tool.name, tool.source, timeout_s)
            text, error = f"error: the tool did not answer within {timeout_s:g} s", True
        except Exception as exc:  # a failing tool is the model's to hear of
            log.warning(
                "tool %s (%s) failed: %s: %s", tool.name, tool.source, type(exc).__name__, exc
            )
            text, error = f"error: the tool failed: {type(exc).__name__}: {exc}", True
        else:
            error = False
        return ToolResult(capped(text, cap), error)

    async def close(self) -> None:
        """Close every source at once: a server that ignores the end of its input takes
        seconds to stop, and several must not add up at shutdown."""
        closed = await asyncio.gather(*(close() for close in self.closers), return_exceptions=True)
        for failed in closed:
            if isinstance(failed, Exception):
                log.warning("closing a tool source failed: %s: %s", type(failed).__name__, failed)


def capped(text: str, cap: int) -> str:
    """`text`, or its first `cap` characters with a note of what was cut."""
    if len(text) <= cap:
        return text
    return text[:cap] + CUT_NOTE.format(total=len(text), kept=cap)
