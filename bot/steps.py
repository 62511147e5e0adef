"""The model's steps in one reply: ask the model, run the tools it called, show it their
results, and ask again, until it answers in text or the step limit is reached.

Every call is recorded in the store before it runs (`bot.store.tools`), so that a tool with
side effects runs at most once per call the model asked for:
- a generation cut short (a newer message while the model wrote, a lost lease, a killed
  replica) leaves the record behind, and the next generation of the same burst, on any
  replica, resumes from it: the model sees the recorded steps and results and goes on;
- a call found started with no result is run again only if it has no side effects; otherwise
  the model is told its outcome is unknown;
- a newer message while a tool runs does not cancel the tool (its result is kept): once the
  step's calls are done, the lease goes back as an interrupt would, and the next generation
  resumes with the newer message folded into the turn.
While the burst's window is still open (a speculative generation), only tools without side
effects run; one with side effects waits for the window to close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bot.lease import LeaseLost
from bot.llm import LLM, Usage, generate
from bot.prompt import Prompt
from bot.race import Next, Race
from bot.settings import LLMSettings, ToolsSettings
from bot.store import Lease, Record, Store
from bot.tools import Tool, Toolbox, ToolCall, ToolResult

log = logging.getLogger(__name__)

# What the model reads for a call with side effects that was started and never finished.
UNKNOWN = (
    "error: the outcome of this call is unknown. An earlier attempt started it and was cut "
    "off before it finished (the bot was restarted or lost its turn). Do not assume it "
    "succeeded or failed, and do not call it again: tell the user it may or may not have "
    "happened."
)
# Calls of one step that are run (and recorded) at most; the model's step is kept with these
# alone, so the record of a reply stays bounded whatever a provider sends.
MAX_CALLS_PER_STEP = 16
NOT_OFFERED = "error: there is no tool named {name!r} available to this user"
# What the reply says if the last step allowed still asked for tools rather than answering.
STEP_LIMIT = "(I stopped there: this reply used all the tool steps, or the time, it may.)"
# What the model reads for a call not run because the reply's time for tools is spent.
OUT_OF_TIME = (
    "error: not run: this reply has used all its time for tools; answer with what you have"
)
# A call started with less time left than this still gets this long.
MIN_CALL_S = 1.0
# Waits for the window to close before a call with side effects, at most: a window that never
# closes is a bug, not a reason to wait.
HOLDS = 5
# A result as the history keeps it, per call, at most; the whole reply's calls at most.
HISTORY_RESULT_CHARS = 300
HISTORY_TOOLS_CHARS = 2000


@dataclass(frozen=True)
class Done:
    """A reply's steps came to this text; `tools`, what the calls were, for the history."""

    text: str
    tools: str = ""


@dataclass
class Steps:
    """One reply's tool loop under one lease. `race` runs what a newer message cancels (the
    model's steps, a wait for the window) and, after each tool step, says whether a newer
    message arrived meanwhile (`Race.steered`); either way `Next` ends the loop."""

    llm: LLM
    settings: LLMSettings
    tools: ToolsSettings
    toolbox: Toolbox
    store: Store
    lease: Lease
    burst: int  # the first version of the burst: the record's and the keys' name for it
    offered: tuple[Tool, ...]
    race: Race
    on_status: Callable[[str], None] | None = None
    calls_run: int = 0
    calls_reused: int = 0
    # When the reply's time for tools ends (`time.monotonic()`): `LASTWORD_LLM__DEADLINE_S`
    # after its first step, so a reply ends in bounded time however many calls hang.
    until: float = 0.0

    async def answer(self, prompt: Prompt, usage: Usage) -> Done | Next:
        """The reply's text after as many steps as it takes; `Next` if a newer message cut
        it short."""
        if not self.offered:
            answered = await self.race(generate(self.llm, prompt, self.settings, usage))
            return answered if isinstance(answered, Next) else Done(answered.text)
        self.until = time.monotonic() + self.settings.deadline_s
        steps: list[dict[str, Any]] = []
        history: list[str] = []
        resumed = await self._resume(steps, history)
        if isinstance(resumed, Next):
            return resumed
        specs = tuple(tool.spec() for tool in self.offered)
        k = resumed
        while True:
            last = k >= self.tools.step_limit or time.monotonic() >= self.until
            asked = replace(
                prompt, tools=specs, steps=tuple(steps), tool_choice="none" if last else "auto"
            )
            answered = await self.race(generate(self.llm, asked, self.settings, usage))
            if isinstance(answered, Next):
                return answered
            if not answered.calls or last:
                return Done(answered.text or STEP_LIMIT, _joined_history(history))
            calls = self._bounded(answered.calls)
            if not await self.store.record_step(self.lease, self.burst, k, calls):
                raise LeaseLost(self.lease.conversation)
            steps.append(_assistant(answered.text, calls))
            cut = await self._run_step(k, calls, Record(), steps, history)
            if cut is not None:
                return cut
            k += 1

    async def _resume(self, steps: list[dict[str, Any]], history: list[str]) -> int | Next:
        """Take up the steps an earlier generation of the burst recorded (its calls reused,
        or run if never finished and safe to): how many there were, or `Next`."""
        record = await self.store.tool_record(self.lease.conversation, self.burst)
        for k, calls in enumerate(record.steps):
            steps.append(_assistant("", calls))
            cut = await self._run_step(k, calls, record, steps, history)
            if cut is not None:
                return cut
        return len(record.steps)

    def _bounded(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """The calls of a step that are run: the first `MAX_CALLS_PER_STEP`."""
        if len(calls) > MAX_CALLS_PER_STEP:
            log.warning(
                "the model asked for %d tool calls in one step for %s; the first %d are run",
                len(calls),
                self.lease.conversation,
                MAX_CALLS_PER_STEP,
            )
        return calls[:MAX_CALLS_PER_STEP]

    async def _run_step(
        self,
        k: int,
        calls: tuple[ToolCall, ...],
        record: Record,
        steps: list[dict[str, Any]],
        history: list[str],
    ) -> Next | None:
        """Run (or reuse) step `k`'s calls, one after another, adding their results to
        `steps`; `Next` if a newer message arrived meanwhile (None: go on). Calls run in
        order, not at once: a model's calls in one step may depend on each other's effects."""
        for j, call in enumerate(calls):
            result = await self._call(k, j, call, record)
            if isinstance(result, Next):
                return result
            steps.append({"role": "tool", "tool_call_id": call.id, "content": result.text})
            history.append(_history_line(call, result))
        return await self.race.steered()

    async def _call(self, k: int, j: int, call: ToolCall, record: Record) -> ToolResult | Next:
        """One call's result: recorded, run now, or unknown; or what cut a wait short."""
        known = record.calls.get((k, j))
        if known is not None and known.status == "done":
            self.calls_reused += 1
            return ToolResult(known.text, known.error)
        tool = next((t for t in self.offered if t.name == call.name), None)
        if tool is None:
            return ToolResult(NOT_OFFERED.format(name=call.name), error=True)
        left = self.until - time.monotonic()
        if left <= 0:
            return ToolResult(OUT_OF_TIME, error=True)
        for _ in range(HOLDS):
            begun = await self.store.begin_call(self.lease, self.burst, k, j, tool.side_effects)
            if begun.status != "hold":
                break
            waited = await self.race(asyncio.sleep(begun.wait_ms / 1000))
            if isinstance(waited, Next):
                return waited
        else:
            raise RuntimeError(f"the window of {self.lease.conversation} is still open")
        if begun.status == "lost":
            raise LeaseLost(self.lease.conversation)
        if begun.status == "done":
            self.calls_reused += 1
            return ToolResult(begun.text, begun.error)
        if begun.status == "unknown":
            log.warning(
                "tool %s for %s was started before and never finished; the model is told its "
                "outcome is unknown",
                call.name,
                self.lease.conversation,
            )
            return ToolResult(UNKNOWN, error=True)
        if self.on_status is not None:
            self.on_status(f"{tool.shown()}…")
        key = f"{self.lease.conversation}:{self.burst}:{k}:{j}"
        timeout = min(self.tools.call_timeout_s, max(left, MIN_CALL_S))
        result = await self.toolbox.run(call, key, timeout, self.tools.output_chars)
        self.calls_run += 1
        await self.store.end_call(self.lease, self.burst, k, j, result.text, result.error)
        return result


def _assistant(text: str, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [call.message() for call in calls],
    }


def _history_line(call: ToolCall, result: ToolResult) -> str:
    text = result.text
    if len(text) > HISTORY_RESULT_CHARS:
        text = text[:HISTORY_RESULT_CHARS] + "…"
    try:
        arguments = json.dumps(json.loads(call.arguments or "{}"), ensure_ascii=False)
    except ValueError:
        arguments = call.arguments
    return f"{call.name}({arguments}) -> {text}"


def _joined_history(lines: list[str]) -> str:
    """What the history keeps of a reply's calls: one line each, bounded in all."""
    joined = "\n".join(lines)
    return joined if len(joined) <= HISTORY_TOOLS_CHARS else joined[:HISTORY_TOOLS_CHARS] + "…"
