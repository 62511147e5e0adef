"""The turn's record of tool calls: what each model step of a burst asked for and what each
call gave, in the conversation's slot, so that a call with side effects runs at most once per
call the model asked for, whatever interrupts, kills or replicas do meanwhile.

A generation records a step's calls (`record_step`) before running any, asks before each call
(`begin_call`: run it, reuse its result, tell the model its outcome is unknown, or not run it
because the user has written since) and records what it gave (`end_call`). A later
generation of the same turn reads the record (`tool_record`) and resumes from it: the model
sees the recorded steps and results and goes on from there. A turn's record is found by the
turn's id (the first version of the burst it answers), which the history keeps with the
reply, so a /retry finds it too. Writes are checked against the lease's token and fence, as
the pre-send check is; starting and finishing a call are durable at the configured level, since
the tool's effect is outside Redis.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Literal

from bot.store import scripts
from bot.store.calls import Calls
from bot.store.config import CLOCK_SLACK_MS
from bot.store.conversations import Lease
from bot.store.replies import as_text, decoded
from bot.tools import ToolCall

Begin = Literal["run", "done", "unknown", "moved", "dropped", "hold", "lost"]


@dataclass(frozen=True)
class Begun:
    """What `begin_call` said: run the call, or its recorded result (`done`: text, error), or
    `unknown` (started before and never finished, with side effects), or `moved` (a newer
    message: this generation is stale), or `dropped` (the call was asked for before the user's
    newest word, and never runs), or `hold` for `wait_ms` (the window is still open), or `lost`
    (the lease or the record is gone)."""

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
    """A turn's record: its id (random, made when it was born: the calls' idempotency keys
    carry it), the calls of each step in order with the tool each was bound to, and what is
    known of each call, by (step, index in the step)."""

    id: str = ""
    steps: tuple[tuple[ToolCall, ...], ...] = ()
    calls: dict[tuple[int, int], Recorded] = field(default_factory=dict)
    # The tool each call was bound to when it was offered (`Tool.identity`), by (step, index).
    bound: dict[tuple[int, int], str] = field(default_factory=dict)


def call_name(step: int, index: int) -> str:
    return f"{step}:{index}"


class Tools(Calls):
    """Record, begin and end tool calls; read a burst's record."""

    async def tool_record(self, conversation: str, burst: int) -> Record:
        """The record of turn `burst` (empty if the record holds no such turn). A plain read:
        a turn's record only changes under the lease, which the caller holds."""
        key = self.layout.keys(conversation).tools
        async with self._reaching():
            raw = await self.redis.hgetall(key)
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        turn = str(burst)
        if f"id:{turn}" not in fields:
            return Record()
        steps: list[tuple[ToolCall, ...]] = []
        bound: dict[tuple[int, int], str] = {}
        for k in range(int(fields.get(f"steps:{turn}") or 0)):
            listed = json.loads(fields.get(f"s:{turn}:{k}") or "[]")
            steps.append(tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in listed))
            bound.update({(k, j): c["tool"] for j, c in enumerate(listed) if c.get("tool")})
        calls: dict[tuple[int, int], Recorded] = {}
        prefix = f"c:{turn}:"
        for name, value in fields.items():
            if name.startswith(prefix):
                step, _, index = name[len(prefix) :].partition(":")
                entry = json.loads(value)
                calls[int(step), int(index)] = Recorded(
                    entry["status"], entry.get("text", ""), bool(entry.get("error"))
                )
        return Record(fields[f"id:{turn}"], tuple(steps), calls, bound)

    async def record_step(
        self,
        lease: Lease,
        burst: int,
        step: int,
        calls: tuple[ToolCall, ...],
        version: int,
        bound: tuple[str, ...] = (),
    ) -> str:
        """Record the calls step `step` of turn `burst` asked for, made from a prompt that
        covered `version`, each bound to a tool (`bound[i]`, `Tool.identity`; '' for a name
        no offered tool has). Returns the record's id ('' if the lease is lost)."""
        k = self.layout.keys(lease.conversation)
        tools = bound or ("",) * len(calls)
        listed = [
            {"id": c.id, "name": c.name, "arguments": c.arguments, "tool": tool}
            for c, tool in zip(calls, tools, strict=True)
        ]
        args: dict[str, str | int] = {
            "token": lease.token,
            "fence": lease.fence,
            "turn": burst,
            "step": step,
            "calls": json.dumps(listed),
            "version": version,
            "id": secrets.token_hex(8),
            "retention_ms": self.settings.retention_ms,
        }
        keys = {"lease": k.lease, "tools": k.tools}
        return as_text(await self._run(scripts.TOOL_STEP, keys, args))

    async def begin_call(
        self,
        lease: Lease,
        burst: int,
        step: int,
        index: int,
        side_effects: bool,
        version: int,
    ) -> Begun:
        """Whether call `index` of step `step` may start now (and, if so, it is started), for
        a generation whose prompt covered `version`."""
        k = self.layout.keys(lease.conversation)
        args: dict[str, str | int] = {
            "token": lease.token,
            "fence": lease.fence,
            "turn": burst,
            "call": call_name(step, index),
            "side_effects": int(side_effects),
            "version": version,
            "window_bound_ms": self.settings.max_wait_ms + CLOCK_SLACK_MS,
            "retention_ms": self.settings.retention_ms,
        }
        keys = {"lease": k.lease, "tools": k.tools, "window": k.window, "state": k.state}
        reply = decoded(await self._run_durable(scripts.TOOL_BEGIN, keys, args))
        return Begun(reply["status"], reply["text"], bool(reply["error"]), int(reply["wait_ms"]))

    async def end_call(
        self,
        lease: Lease,
        burst: int,
        step: int,
        index: int,
        text: str,
        error: bool,
        *,
        unknown: bool = False,
    ) -> bool:
        """Record what call `index` of step `step` gave, or that its outcome is `unknown` (it
        timed out, or its server went away mid-call); False if it could not be (the call was
        declared unknown meanwhile, or its turn's record is gone)."""
        k = self.layout.keys(lease.conversation)
        args: dict[str, str | int] = {
            "token": lease.token,
            "turn": burst,
            "call": call_name(step, index),
            "status": "unknown" if unknown else "done",
            "text": text,
            "error": int(error),
            "retention_ms": self.settings.retention_ms,
        }
        return bool(await self._run_durable(scripts.TOOL_END, {"tools": k.tools}, args))
