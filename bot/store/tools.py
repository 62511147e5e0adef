"""The turn's record of tool calls: what each model step of a burst asked for and what each
call gave, in the conversation's slot, so that a call with side effects runs at most once per
call the model asked for, whatever interrupts, kills or replicas do meanwhile.

A generation records a step's calls (`record_step`) before running any, asks before each call
(`begin_call`: run it, reuse its result, or tell the model its outcome is unknown) and records
what it gave (`end_call`). A later generation of the same burst reads the record
(`tool_record`) and resumes from it: the model sees the recorded steps and results and goes
on from there. Writes are checked against the lease's token and fence, as the pre-send check
is; starting and finishing a call are durable at the configured level, since the tool's effect
is outside Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from bot.store import scripts
from bot.store.calls import Calls
from bot.store.config import CLOCK_SLACK_MS
from bot.store.conversations import Lease
from bot.store.replies import as_text, decoded
from bot.tools import ToolCall

Begin = Literal["run", "done", "unknown", "hold", "lost"]


@dataclass(frozen=True)
class Begun:
    """What `begin_call` said: run the call, or its recorded result (`done`: text, error), or
    `unknown` (started before and never finished, with side effects), or `hold` for `wait_ms`
    (the window is still open), or `lost` (the lease or the record is gone)."""

    status: Begin
    text: str = ""
    error: bool = False
    wait_ms: int = 0


@dataclass(frozen=True)
class Recorded:
    """One recorded call's state: `done` with its result, or `started`/`unknown`."""

    status: Literal["started", "done", "unknown"]
    text: str = ""
    error: bool = False


@dataclass(frozen=True)
class Record:
    """A burst's record: the calls of each step in order, and what is known of each call,
    by (step, index in the step)."""

    steps: tuple[tuple[ToolCall, ...], ...] = ()
    calls: dict[tuple[int, int], Recorded] = field(default_factory=dict)


def call_name(step: int, index: int) -> str:
    return f"{step}:{index}"


class Tools(Calls):
    """Record, begin and end tool calls; read a burst's record."""

    async def tool_record(self, conversation: str, burst: int) -> Record:
        """The record of `burst` (empty if the record is of another burst, or there is none).
        A plain read: the record only changes under the lease, which the caller holds."""
        key = self.layout.keys(conversation).tools
        async with self._reaching():
            raw = await self.redis.hgetall(key)
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        if fields.get("burst") != str(burst):
            return Record()
        steps: list[tuple[ToolCall, ...]] = []
        for k in range(int(fields.get("steps") or 0)):
            listed = json.loads(fields.get(f"s:{k}") or "[]")
            steps.append(tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in listed))
        calls: dict[tuple[int, int], Recorded] = {}
        for name, value in fields.items():
            if name.startswith("c:"):
                step, _, index = name[2:].partition(":")
                entry = json.loads(value)
                calls[int(step), int(index)] = Recorded(
                    entry["status"], entry.get("text", ""), bool(entry.get("error"))
                )
        return Record(tuple(steps), calls)

    async def record_step(
        self, lease: Lease, burst: int, step: int, calls: tuple[ToolCall, ...]
    ) -> bool:
        """Record the calls step `step` of `burst` asked for; False if the lease is lost."""
        k = self.layout.keys(lease.conversation)
        listed = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
        args: dict[str, str | int] = {
            "token": lease.token,
            "fence": lease.fence,
            "burst": burst,
            "step": step,
            "calls": json.dumps(listed),
            "retention_ms": self.settings.retention_ms,
        }
        keys = {"lease": k.lease, "tools": k.tools}
        return bool(await self._run(scripts.TOOL_STEP, keys, args))

    async def begin_call(
        self, lease: Lease, burst: int, step: int, index: int, side_effects: bool
    ) -> Begun:
        """Whether call `index` of step `step` may run now (and, if so, it is started)."""
        k = self.layout.keys(lease.conversation)
        args: dict[str, str | int] = {
            "token": lease.token,
            "fence": lease.fence,
            "burst": burst,
            "call": call_name(step, index),
            "side_effects": int(side_effects),
            "window_bound_ms": self.settings.max_wait_ms + CLOCK_SLACK_MS,
            "retention_ms": self.settings.retention_ms,
        }
        keys = {"lease": k.lease, "tools": k.tools, "window": k.window}
        reply = decoded(await self._run_durable(scripts.TOOL_BEGIN, keys, args))
        return Begun(reply["status"], reply["text"], bool(reply["error"]), int(reply["wait_ms"]))

    async def end_call(
        self, lease: Lease, burst: int, step: int, index: int, text: str, error: bool
    ) -> bool:
        """Record what call `index` of step `step` gave; False if it could not be (the call was
        declared unknown meanwhile, or its burst is answered)."""
        k = self.layout.keys(lease.conversation)
        args: dict[str, str | int] = {
            "token": lease.token,
            "burst": burst,
            "call": call_name(step, index),
            "text": text,
            "error": int(error),
            "retention_ms": self.settings.retention_ms,
        }
        return bool(await self._run_durable(scripts.TOOL_END, {"tools": k.tools}, args))
