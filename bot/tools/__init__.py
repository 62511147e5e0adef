"""Tools the model may call: what a tool is, what a call and its result are, and the toolbox
that offers a replica's tools and runs one call within its bounds.

Tools come from two sources, each a module of its own: MCP servers (`bot.tools.mcp`, one
client session per server per replica) and Python functions installed in the
`lastword.tools` entry point group (`bot.tools.python`). The cycle sees neither: it asks the
`Toolbox` which tools a user is offered (as many as fit the context, `bot.tools.fit`) and runs
calls through it. Whether a call runs at all,
or reuses the result of an earlier generation of the same burst, is decided in the store
(`bot.store.tools`), before the toolbox is asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

log = logging.getLogger(__name__)

# What the model is told of a result cut to `LASTWORD_TOOLS__OUTPUT_CHARS`.
CUT_NOTE = "\n[cut: the tool's output was {total} characters; the first {kept} are shown]"
# What the model reads for a call of a tool that has gone (its server stopped offering it)
# since it was offered.
GONE = "error: the tool {name!r} is no longer available (its server has gone since it was offered)"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")
# Characters of a tool's or a server's text that one log line carries at most.
LOG_CHARS = 300


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
    # Its name at its source (`name` may be renamed to settle a collision); '' for `name`.
    origin: str = ""

    @property
    def identity(self) -> str:
        """Which tool this is, whatever it is called in the toolbox: its source and its name
        there. A call is bound to it when offered, and runs on nothing else."""
        return f"{self.source}/{self.origin or self.name}"

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
        """The call in an assistant message's `tool_calls`, its name as Chat Completions takes
        it back (a name the model mangled is echoed mended; no tool has it either way)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": well_named(self.name), "arguments": self.arguments},
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
    # Whether the tool may or may not have run (it timed out, or its server went away).
    unknown: bool = False


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
    # Masks the replica's secrets in a tool's text before a log line cuts it (a cut first
    # could leave part of a secret that the log's own masking no longer recognises).
    scrub: Callable[[str], str] = field(default=str)
    # Tokens the schemas of the tools offered may take (`bot.tools.fit.room_for_tools`);
    # None: no bound.
    room: int | None = None
    # What each user is offered (by whether they are an admin), as fitted at each `offer`.
    fits: dict[bool, tuple[Tool, ...]] = field(default_factory=dict)
    # What the last warning said was left out, so that it is said once, not per offer.
    told: str = ""

    def offer(self, sources: Iterable[Iterable[tuple[Tool, Runner]]]) -> None:
        """Offer every source's tools afresh, in the order given, whichever started first. A
        name two tools share goes to the first; each other one is renamed with its source as
        a prefix (then a number), to a name no tool has, so a rename never takes a name in use
        and every replica names each tool alike once its servers are up."""
        listed = [entry for tools in sources for entry in tools]
        named: dict[str, tuple[Tool, Runner]] = {}
        renamed: list[tuple[Tool, Runner]] = []
        for tool, runner in listed:
            if tool.name in named:
                renamed.append((tool, runner))
            else:
                named[tool.name] = (tool, runner)
        taken = set(named)
        for tool, runner in renamed:
            name = _free_name(tool, taken)
            log.warning(
                "tool %s of %s is offered as %s: %s already has the name",
                tool.name,
                tool.source,
                name,
                named[tool.name][0].source,
            )
            taken.add(name)
            named[name] = (replace(tool, name=name, origin=tool.origin or tool.name), runner)
        self.tools = {tool.name: (tool, runner) for tool, runner in named.values()}
        self._fit()

    def _fit(self) -> None:
        """Fit what admins and other users are offered to the room (each in the toolbox's
        order), and warn once of what is left out, whenever that changes."""
        # Here, not above: the module needs `Tool` from this one.
        from bot.tools.fit import FIX, cost, fitted

        everything = [tool for tool, _ in self.tools.values()]
        users = [tool for tool in everything if not tool.admin_only]
        if self.room is None:
            self.fits = {True: tuple(everything), False: tuple(users)}
            return
        costs = {tool.name: cost(tool) for tool in everything}
        for_admins, for_users = (
            fitted(everything, self.room, costs),
            fitted(users, self.room, costs),
        )
        self.fits = {True: for_admins.offered, False: for_users.offered}
        told = for_admins.told()
        if for_users.left_out and for_users.left_out != for_admins.left_out:
            told += f" (to users who are not admins: {len(for_users.left_out)} left out)"
        if told and told != self.told:
            log.warning("%s; fix: %s", told, FIX)
        self.told = told

    def offered(self, admin: bool) -> list[Tool]:
        """The tools a user is offered: for an admin all of them, else those not admin-only;
        of those, as many as fit the room, in the toolbox's order."""
        return list(self.fits.get(admin, ()))

    def get(self, name: str) -> Tool | None:
        entry = self.tools.get(name)
        return entry[0] if entry else None

    async def run(
        self, call: ToolCall, key: str, timeout_s: float, cap: int, bound: Tool | None = None
    ) -> ToolResult:
        """Run one call within `timeout_s`, its output cut to `cap` characters: on the tool
        it was `bound` to when offered (the one whose admin and side-effect flags were
        checked), whatever holds its name now; else on the tool named in the call. Never
        raises for the tool's sake: an unknown tool, one gone since it was offered, arguments
        that are not a JSON object, a timeout or an exception become an error result the
        model reads (`unknown` when whether it ran cannot be known). Cancellation propagates."""
        if bound is None:
            entry = self.tools.get(call.name)
        else:
            entry = next((e for e in self.tools.values() if e[0].identity == bound.identity), None)
        if entry is None and bound is not None:
            return ToolResult(GONE.format(name=call.name), error=True)
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
            text = f"error: the tool did not answer within {timeout_s:g} s"
            return ToolResult(text, error=True, unknown=True)
        except OutcomeUnknown as exc:
            log.warning("tool %s (%s): %s", tool.name, tool.source, cut(self.scrub(str(exc))))
            return ToolResult(capped(f"error: {exc}", cap), error=True, unknown=True)
        except Exception as exc:  # a failing tool is the model's to hear of
            why = f"{type(exc).__name__}: {exc}"
            log.warning("tool %s (%s) failed: %s", tool.name, tool.source, cut(self.scrub(why)))
            return ToolResult(capped(f"error: the tool failed: {why}", cap), error=True)
        return ToolResult(capped(text, cap))

    async def close(self) -> None:
        """Close every source at once: a server that ignores the end of its input takes
        seconds to stop, and several must not add up at shutdown."""
        closed = await asyncio.gather(*(close() for close in self.closers), return_exceptions=True)
        for failed in closed:
            if isinstance(failed, Exception):
                log.warning("closing a tool source failed: %s: %s", type(failed).__name__, failed)


def well_named(name: str) -> str:
    """`name` as Chat Completions allows a tool's name: [A-Za-z0-9_-]{1,64}."""
    return _NOT_NAME.sub("_", name)[:64] or "tool"


def _free_name(tool: Tool, taken: set[str]) -> str:
    """A name for `tool` that no tool in `taken` has: its source's name as a prefix, then a
    number if even that is taken."""
    prefix = tool.source.partition(":")[2] or tool.source
    name = f"{prefix}_{tool.name}"[:64]
    n = 2
    while name in taken:
        suffix = f"_{n}"
        name = f"{prefix}_{tool.name}"[: 64 - len(suffix)] + suffix
        n += 1
    return name


def cut(text: str, chars: int = LOG_CHARS) -> str:
    """`text` for a log line: at most `chars` characters, saying how long it was."""
    if len(text) <= chars:
        return text
    return f"{text[:chars]}… [{len(text)} characters]"


def capped(text: str, cap: int) -> str:
    """`text`, or its first `cap` characters with a note of what was cut."""
    if len(text) <= cap:
        return text
    return text[:cap] + CUT_NOTE.format(total=len(text), kept=cap)
