"""Tools written in Python, installed as plug-ins: each entry point of the `lastword.tools`
group names a `PythonTool`, as a package's metadata would declare it:

    [project.entry-points."lastword.tools"]
    weather = "my_package.tools:WEATHER"

with `WEATHER = PythonTool(function=weather, parameters={...}, side_effects=False)`.

An entry point that does not load (its module fails to import, it names something else, its
name is not one a model may call) is a WARNING naming it, and lastword starts without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any

from bot.plugins import entry_points
from bot.tools import Tool

log = logging.getLogger(__name__)

GROUP = "lastword.tools"
# A function with a parameter of this name is given the call's idempotency key in it.
KEY_PARAMETER = "idempotency_key"

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Plain functions running at once, at most (see `Threads`).
MAX_THREADS = 8


@dataclass(frozen=True, kw_only=True)
class PythonTool:
    """A Python function offered to the model as a tool.

    `function` is called with the model's arguments as keywords (and, if it has a parameter
    named `idempotency_key`, the call's stable key, the same for every run of one requested
    call): an `async def` is awaited, a plain function runs in a thread so it cannot stall the
    replica. What it returns is the result: a string as it is, anything else as JSON.
    `side_effects` has no default on purpose: a tool that changes anything runs at most once
    per call the model asked for, one that does not may run again, and only its author knows
    which it is.
    """

    function: Callable[..., Any]
    # A JSON schema of an object: the function's keyword arguments.
    parameters: dict[str, Any]
    side_effects: bool
    # The function's docstring when not given.
    description: str = ""
    # The function's name when not given; [A-Za-z0-9_-]{1,64}.
    name: str = ""
    admin_only: bool = False
    # Shown to the user while it runs ("Looking up the weather"); the name if not given.
    title: str = ""

    def tool(self, source: str) -> Tool:
        """The tool as the toolbox offers it."""
        return Tool(
            name=self.name or self.function.__name__,
            description=self.description or inspect.getdoc(self.function) or "",
            parameters=self.parameters,
            side_effects=self.side_effects,
            admin_only=self.admin_only,
            source=source,
            title=self.title,
        )


class Threads:
    """Daemon threads for plain functions, at most `limit` alive at once.

    Not the loop's default executor: DNS lookups share that one, so tools that hang there
    would stall every user's model requests, and its threads are joined at exit, so they would
    keep the replica from stopping. A slot is held until the thread ends, not until its caller
    stops waiting: tools that hang for ever take `limit` threads at most, and later calls wait
    for a slot (within the toolbox's call timeout).
    """

    def __init__(self, limit: int = MAX_THREADS) -> None:
        self._slots = asyncio.Semaphore(limit)

    async def run(self, function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            self._slots.release()
            if done.cancelled():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def work() -> None:
            outcome: tuple[Any, BaseException | None] = (
                None,
                RuntimeError("the tool's thread ended without a result"),
            )
            try:
                outcome = (function(**arguments), None)
            except Exception as exc:
                outcome = (None, exc)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(settle, *outcome)

        try:
            threading.Thread(target=work, name="lastword-tool", daemon=True).start()
        except BaseException:
            self._slots.release()
            raise
        return await done


@dataclass(frozen=True)
class PythonRunner:
    """Calls a `PythonTool`'s function."""

    declared: PythonTool
    threads: Threads = field(default_factory=Threads)

    async def __call__(self, tool: Tool, arguments: dict[str, Any], key: str) -> str:
        function = self.declared.function
        if KEY_PARAMETER in inspect.signature(function).parameters:
            arguments = {**arguments, KEY_PARAMETER: key}
        if inspect.iscoroutinefunction(function):
            result = await function(**arguments)
        else:
            # A thread cannot be stopped: past the call timeout the model hears it timed out,
            # and the function finishes on its own.
            result = await self.threads.run(function, arguments)
        return result if isinstance(result, str) else json.dumps(result, default=str)


def python_tools() -> list[tuple[Tool, PythonRunner]]:
    """Every tool installed in the `lastword.tools` entry point group that loads."""
    threads = Threads()  # shared: the bound is on the replica's threads, not each tool's
    found = []
    for point in entry_points(group=GROUP):
        loaded = _load(point, threads)
        if loaded is not None:
            found.append(loaded)
    return found


def _load(point: EntryPoint, threads: Threads) -> tuple[Tool, PythonRunner] | None:
    where = f"{point.name} = {point.value}"
    try:
        declared = point.load()
    except Exception as exc:  # a broken plug-in must not keep lastword from starting
        log.warning(
            "tool entry point %s did not load: %s: %s; starting without it",
            where,
            type(exc).__name__,
            exc,
        )
        return None
    if not isinstance(declared, PythonTool):
        log.warning(
            "tool entry point %s names a %s, not a bot.tools.python.PythonTool; "
            "starting without it",
            where,
            type(declared).__name__,
        )
        return None
    tool = declared.tool(f"python:{point.name}")
    if not _NAME.fullmatch(tool.name):
        log.warning(
            "tool entry point %s: the name %r is not one a model may call "
            "([A-Za-z0-9_-], 1 to 64 characters); starting without it",
            where,
            tool.name,
        )
        return None
    return tool, PythonRunner(declared, threads)
