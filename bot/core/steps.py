"""The model's steps in one reply: ask the model, run the tools it called, show it their
results, and ask again, until it answers in text or the step limit is reached.

Every call is recorded in the store before it runs (`bot.store.tools`), so that a tool with
side effects runs at most once per call the model asked for, and only while the user's newest
word still asks for it:
- a generation cut short (a newer message while the model wrote, a lost lease, a killed
  replica) leaves the record behind, and the next generation of the same turn, on any
  replica (or a /retry of it), resumes from it: the model sees the recorded steps and results
  and goes on;
- a call found started with no result is run again only if it has no side effects; otherwise
  the model is told its outcome is unknown, as it is when a call with side effects timed out
  or its server went away mid-call;
- a newer message while a tool runs does not cancel the tool (its result is kept); but no
  call starts once the user has written since its step was asked for (checked in the store,
  in the step that starts the call): the lease goes back as an interrupt would, and the next
  generation asks the model again with the newer messages, telling it which calls never ran;
- each call is bound to the tool it was offered as (`Tool.identity`): the admin check, the
  side-effect flag, the hold and the run all concern that one tool;
- the steps are in the context budget: results are cut to fit, and once no room is left the
  model is asked for its answer.
While the burst's window is still open (a speculative generation), only tools without side
effects run; one with side effects waits for the window to close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bot.config.settings import LLMSettings, ToolsSettings
from bot.core.lease import LeaseLost
from bot.core.race import Next, Race
from bot.llm.base import LLM, Answer, LLMError, Usage, generate
from bot.llm.prompt import Prompt, Used, estimated_tokens
from bot.stats import Stats
from bot.store import Lease, Record, Store
from bot.tokens import Counter
from bot.tools import Tool, Toolbox, ToolCall, ToolResult
from bot.traces import NO_BURST, Burst, content, conversation_id

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
STEP_LIMIT = "(I stopped there: this reply has used all the tool steps or time it is allowed.)"
# What the model reads for a call not run because the reply's time for tools is spent.
OUT_OF_TIME = (
    "error: not run: this reply has used all its time for tools; answer with what you have"
)
# What the model reads for a call that never ran because the user wrote again after it was
# asked for (held in the window, or queued behind an earlier call of its step).
NOT_RUN = (
    "error: not run: the user wrote again before this call started. Read their newest "
    "messages: call it again only if they still want it."
)
# What the model reads for the calls of a step that did not fit in its context.
NO_ROOM = "error: not run: no room is left in the context for its result; answer with what you have"
# What the model reads for a call of a tool bound to the person (their memory) once another
# tool's result has reached it in this reply: what a tool returned must never be written into
# a person's memory, however it asks.
AFTER_RESULTS = (
    "error: not run: this reply has read another tool's result, and what a tool returns is "
    "never written into the user's memory; save it in a later reply, from the user's own words"
)
# What a result cut to fit the context says.
ROOM_NOTE = "\n[cut to fit the context: {kept} of {total} characters shown]"
# Tokens a step's results may take at least, per call, for them to be worth running; and the
# share of the budget kept free for the estimate's error.
MIN_RESULT_TOKENS = 48
MARGIN = 0.05
# A call started with less time left than this still gets this long.
MIN_CALL_S = 1.0
# Waits for the window to close before a call with side effects, at most: a window that never
# closes is a bug, not a reason to wait.
HOLDS = 5
# A result as the history keeps it, per call, at most; the whole reply's calls at most.
HISTORY_RESULT_CHARS = 300
HISTORY_TOOLS_CHARS = 4000


@dataclass(frozen=True)
class Done:
    """A reply's steps came to this text; `tools`, what the calls were and gave, as JSON for
    the history (`bot.llm.prompt.used_of` reads it back)."""

    text: str
    tools: str = ""


@dataclass(frozen=True)
class ModelUse:
    """The model a reply's steps ask, and what a request to it may hold."""

    llm: LLM
    settings: LLMSettings
    counter: Counter
    budget: int  # tokens the whole request may take (the context less the answer's room)
    burst: Burst = NO_BURST  # where each request's `chat` span goes (`bot.traces`)
    conversation: str = ""
    stats: Stats = field(default_factory=Stats)  # each request's GenAI metrics


@dataclass(frozen=True)
class ToolUse:
    """The tools a reply may call, and the bounds of each call."""

    settings: ToolsSettings
    toolbox: Toolbox
    tools: tuple[Tool, ...]  # those its person is offered
    # Tools bound to the person the reply answers (their memory), run here rather than by
    # the replica's toolbox.
    personal: Toolbox = field(default_factory=Toolbox)

    def box(self, tool: Tool) -> Toolbox:
        """What runs a call bound to `tool`."""
        mine = any(t.identity == tool.identity for t, _ in self.personal.tools.values())
        return self.personal if mine else self.toolbox


@dataclass(frozen=True)
class TurnRecord:
    """Where a reply's calls are recorded, under which lease."""

    store: Store
    lease: Lease
    burst: int  # the turn's id: its record's name (the first version of its burst)
    version: int  # the version the prompt covers: no call starts once V has moved past it


@dataclass
class Steps:
    """One reply's tool loop under one lease. `race` runs what a newer message cancels (the
    model's steps, a wait for the window) and, before and after each tool call, says whether
    a newer message arrived meanwhile (`Race.steered`); either way `Next` ends the loop."""

    model: ModelUse
    offer: ToolUse
    turn: TurnRecord
    race: Race
    # Told what the reply is doing while a tool runs ("calling get_time…"): the live draft.
    on_text: Callable[[str], None] | None = None
    calls_run: int = 0
    calls_reused: int = 0
    # When the reply's time for tools ends (`time.monotonic()`): `LASTWORD_LLM__DEADLINE_S`
    # after its first step, so a reply ends in bounded time however many calls hang.
    until: float = 0.0
    # The record's id, which every call's idempotency key carries.
    record: str = ""
    # Set once no more tools may run in this reply (no room left in the context, or the user
    # wrote again and this generation is not interrupted): the model is asked for its answer.
    closed: bool = False
    # Set once a result of a tool not bound to the person has reached the model in this reply:
    # from then on no tool bound to them (their memory) runs.
    heard_tools: bool = False

    async def _ask(self, prompt: Prompt, usage: Usage) -> Answer | Next:
        """One request to the model, cut short by a newer message: a `chat` span in the
        GenAI conventions, with its own tokens."""
        model = self.model
        with model.burst.span(f"chat {model.settings.model}", kind="client") as span:
            span.set("gen_ai.operation.name", "chat")
            span.set("gen_ai.provider.name", model.llm.name)
            span.set("gen_ai.request.model", model.settings.model)
            span.set("gen_ai.conversation.id", conversation_id(model.conversation))
            before, began, error = len(usage.attempts), time.monotonic(), ""
            try:
                answered = await self.race(generate(model.llm, prompt, model.settings, usage))
            except LLMError as exc:
                error = exc.kind
                span.failed(error)
                raise
            except asyncio.CancelledError:
                # The reply's own span says why: its lease lost, or the replica stopping.
                span.set("lastword.ended", "cancelled")
                raise
            finally:
                attempts = usage.attempts[before:]
                tokens = (
                    sum(a.prompt_tokens for a in attempts),
                    sum(a.completion_tokens for a in attempts),
                )
                span.set("gen_ai.usage.input_tokens", tokens[0])
                span.set("gen_ai.usage.output_tokens", tokens[1])
                model.stats.model_request(
                    model.llm.name, model.settings.model, tokens, time.monotonic() - began, error
                )
            if isinstance(answered, Next):
                # Restarted: the burst's own next message (or its typing) came while its window
                # was open; interrupted: a message after the window.
                span.set("lastword.ended", "restarted" if self.race.restarted else "interrupted")
                return answered
            finish = "tool_calls" if answered.calls else "stop"
            span.set("lastword.ended", "done")
            span.set("gen_ai.response.model", model.settings.model)
            span.set("gen_ai.response.finish_reasons", [finish])
            if model.burst.captures_content:
                calls = [call.message() for call in answered.calls]
                span.set("gen_ai.input.messages", content.input_messages(prompt.messages()))
                span.set(
                    "gen_ai.output.messages", content.output_messages(answered.text, calls, finish)
                )
            return answered

    async def answer(self, prompt: Prompt, usage: Usage) -> Done | Next:
        """The reply's text after as many steps as it takes; `Next` if a newer message cut
        it short."""
        if not self.offer.tools:
            answered = await self._ask(prompt, usage)
            return answered if isinstance(answered, Next) else Done(answered.text)
        self.until = time.monotonic() + self.model.settings.deadline_s
        asked = replace(prompt, tools=tuple(tool.spec() for tool in self.offer.tools))
        used: list[Used] = []
        resumed = await self._resume(asked, used)
        if isinstance(resumed, Next):
            return resumed
        asked, k = resumed
        while True:
            last = (
                self.closed or k >= self.offer.settings.step_limit or time.monotonic() >= self.until
            )
            asked = replace(asked, tool_choice="none" if last else "auto")
            answered = await self._ask(asked, usage)
            if isinstance(answered, Next):
                return answered
            if not answered.calls or last:
                return Done(answered.text or STEP_LIMIT, _history(used))
            calls = self._bounded(answered.calls)
            step = replace(asked, steps=(*asked.steps, _assistant(answered.text, calls)))
            share = self._share(step, len(calls))
            if share < MIN_RESULT_TOKENS:
                # Its results would not fit: it is not run, and the model answers instead.
                log.warning(
                    "no room in the context of %s for the results of %d tool calls; the model "
                    "is asked for its answer",
                    self.turn.lease.conversation,
                    len(calls),
                )
                self.closed = True
                continue
            bound = tuple(self._offered(call.name) for call in calls)
            identities = tuple(tool.identity if tool else "" for tool in bound)
            record = await self.turn.store.record_step(
                self.turn.lease, self.turn.burst, k, calls, self.turn.version, identities
            )
            if not record:
                raise LeaseLost(self.turn.lease.conversation)
            self.record = record
            ran = await self._run_step(k, calls, bound, Record(), step, share, used)
            if isinstance(ran, Next):
                return ran
            asked = ran
            k += 1

    async def _resume(self, asked: Prompt, used: list[Used]) -> tuple[Prompt, int] | Next:
        """Take up the steps an earlier generation of the turn recorded (its calls reused,
        run if never started and still asked for, never run if the user wrote since): the
        prompt with them, and how many there were; or `Next`."""
        record = await self.turn.store.tool_record(self.turn.lease.conversation, self.turn.burst)
        self.record = record.id
        for k, recorded in enumerate(record.steps):
            bound = tuple(
                self._bound(record.bound[k, j]) if (k, j) in record.bound else None
                for j in range(len(recorded))
            )
            # Each call under the name its tool bears now: a server that came up since may have
            # taken the name it was made under, and a call shown by a name this user is no
            # longer offered looks never made, so a model would ask for it again.
            calls = tuple(
                replace(call, name=tool.name) if tool else call
                for call, tool in zip(recorded, bound, strict=True)
            )
            step = replace(asked, steps=(*asked.steps, _assistant("", calls)))
            share = max(self._share(step, len(calls)), MIN_RESULT_TOKENS)
            ran = await self._run_step(k, calls, bound, record, step, share, used)
            if isinstance(ran, Next):
                return ran
            asked = ran
        return asked, len(record.steps)

    def _offered(self, name: str) -> Tool | None:
        """The offered tool a call names, if any: what the call is bound to."""
        return next((tool for tool in self.offer.tools if tool.name == name), None)

    def _bound(self, identity: str) -> Tool | None:
        """The offered tool a recorded call was bound to, if this user is offered it here."""
        return next((tool for tool in self.offer.tools if tool.identity == identity), None)

    def _share(self, step: Prompt, calls: int) -> int:
        """Tokens each of a step's `calls` results may take, for the request to stay within
        the budget (less a margin for the estimate's error)."""
        room = int(self.model.budget * (1 - MARGIN)) - estimated_tokens(step, self.model.counter)
        return room // max(calls, 1)

    def _bounded(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """The calls of a step that are run: the first `MAX_CALLS_PER_STEP`."""
        if len(calls) > MAX_CALLS_PER_STEP:
            log.warning(
                "the model asked for %d tool calls in one step for %s; the first %d are run",
                len(calls),
                self.turn.lease.conversation,
                MAX_CALLS_PER_STEP,
            )
        return calls[:MAX_CALLS_PER_STEP]

    async def _run_step(
        self,
        k: int,
        calls: tuple[ToolCall, ...],
        bound: tuple[Tool | None, ...],
        record: Record,
        step: Prompt,
        share: int,
        used: list[Used],
    ) -> Prompt | Next:
        """Run (or reuse) step `k`'s calls, one after another, each on the tool it is bound
        to: the prompt with their results (each cut to `share` tokens); `Next` if a newer
        message arrived meanwhile. Calls run in order, not at once: a model's calls in one
        step may depend on each other's effects. Before each call the race is asked whether
        the user wrote again, so a "stop" stops the calls not yet started."""
        results: list[dict[str, Any]] = []
        for j, (call, tool) in enumerate(zip(calls, bound, strict=True)):
            steered = await self.race.steered()
            if steered is not None:
                return steered
            result = await self._call(k, j, call, tool, record)
            if isinstance(result, Next):
                return result
            text = self._fitted(result.text, share)
            self.heard_tools |= tool is not None and self.offer.box(tool) is self.offer.toolbox
            results.append({"role": "tool", "tool_call_id": call.id, "content": text})
            used.append(Used(call.name, call.arguments, result.text))
        steered = await self.race.steered()
        if steered is not None:
            return steered
        asked = replace(step, steps=(*step.steps, *results))
        if self._share(asked, 1) < MIN_RESULT_TOKENS * 2:
            self.closed = True  # no room for another step: the model answers now
        return asked

    def _fitted(self, text: str, tokens: int) -> str:
        """`text` within `tokens` (as counted), cut with a note if it must be."""
        if self.model.counter.count(text) <= tokens:
            return text
        kept = len(text)
        while kept > 0:
            kept = int(kept * 0.8)
            fitted = text[:kept] + ROOM_NOTE.format(kept=kept, total=len(text))
            if self.model.counter.count(fitted) <= tokens:
                return fitted
        return ROOM_NOTE.format(kept=0, total=len(text)).strip()

    async def _call(
        self, k: int, j: int, call: ToolCall, tool: Tool | None, record: Record
    ) -> ToolResult | Next:
        """`_outcome`, in an `execute_tool` span that says whether the call ran, was reused
        from the record (a /retry, a takeover) or was not run."""
        with self.model.burst.span(f"execute_tool {call.name}") as span:
            span.set("gen_ai.operation.name", "execute_tool")
            span.set("gen_ai.tool.name", call.name)
            span.set("gen_ai.tool.call.id", call.id)
            ran, reused = self.calls_run, self.calls_reused
            result = await self._outcome(k, j, call, tool, record)
            if isinstance(result, Next):
                span.set("lastword.tool.outcome", "interrupted")
                return result
            outcome = "ran" if self.calls_run > ran else "not run"
            span.set("lastword.tool.outcome", "reused" if self.calls_reused > reused else outcome)
            if result.error:
                span.failed("tool_error")
            return result

    async def _outcome(
        self, k: int, j: int, call: ToolCall, tool: Tool | None, record: Record
    ) -> ToolResult | Next:
        """One call's result: recorded, run now, not run, or unknown; or what cut a wait
        short."""
        known = record.calls.get((k, j))
        if known is not None and known.status == "done":
            self.calls_reused += 1
            return ToolResult(known.text, known.error)
        if tool is None:
            return ToolResult(NOT_OFFERED.format(name=call.name), error=True)
        if self.heard_tools and self.offer.box(tool) is self.offer.personal:
            return ToolResult(AFTER_RESULTS, error=True)
        if self.closed:
            return ToolResult(NO_ROOM, error=True)
        left = self.until - time.monotonic()
        if left <= 0:
            return ToolResult(OUT_OF_TIME, error=True)
        for _ in range(HOLDS):
            begun = await self.turn.store.begin_call(
                self.turn.lease, self.turn.burst, k, j, tool.side_effects, self.turn.version
            )
            if begun.status != "hold":
                break
            waited = await self.race(asyncio.sleep(begun.wait_ms / 1000))
            if isinstance(waited, Next):
                return waited
        else:
            raise RuntimeError(f"the window of {self.turn.lease.conversation} is still open")
        if begun.status == "lost":
            raise LeaseLost(self.turn.lease.conversation)
        if begun.status == "done":
            self.calls_reused += 1
            return ToolResult(begun.text, begun.error)
        if begun.status == "unknown":
            log.warning(
                "tool %s for %s was started before and never finished; the model is told its "
                "outcome is unknown",
                tool.name,
                self.turn.lease.conversation,
            )
            return ToolResult(UNKNOWN, error=True)
        if begun.status == "moved":
            handed = await self.race.moved()
            if handed is not None:
                return handed
            self.closed = True
            return ToolResult(NOT_RUN, error=True)
        if begun.status == "dropped":
            log.info(
                "tool %s for %s was asked for before the user wrote again; not run",
                tool.name,
                self.turn.lease.conversation,
            )
            return ToolResult(NOT_RUN, error=True)
        if self.on_text is not None:
            self.on_text(f"{tool.shown()}…")
        key = f"{self.turn.lease.conversation}:{self.record}:{k}:{j}"
        timeout = min(self.offer.settings.call_timeout_s, max(left, MIN_CALL_S))
        result = await self.offer.box(tool).run(
            call, key, timeout, self.offer.settings.output_chars, tool
        )
        self.calls_run += 1
        unknown = result.unknown and tool.side_effects
        await self.turn.store.end_call(
            self.turn.lease, self.turn.burst, k, j, result.text, result.error, unknown=unknown
        )
        if unknown:
            log.warning(
                "tool %s for %s may or may not have run (%s); the model is told its outcome "
                "is unknown",
                tool.name,
                self.turn.lease.conversation,
                result.text[:200],
            )
            return ToolResult(UNKNOWN, error=True)
        return result


def _assistant(text: str, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [call.message() for call in calls],
    }


def _history(used: list[Used]) -> str:
    """What the history keeps of a reply's calls, as JSON: each result cut, and as many calls
    as fit in `HISTORY_TOOLS_CHARS` (the last kept one says how many more were left out)."""
    kept: list[dict[str, str]] = []
    size = 0
    for n, call in enumerate(used):
        result = call.result
        if len(result) > HISTORY_RESULT_CHARS:
            result = result[:HISTORY_RESULT_CHARS] + "…"
        arguments = call.arguments
        if len(arguments) > HISTORY_RESULT_CHARS:
            # Still a JSON object, as a provider may check the history's calls.
            arguments = json.dumps({"cut": arguments[:HISTORY_RESULT_CHARS]})
        entry = {"tool": call.name[:64], "arguments": arguments, "result": result}
        size += len(json.dumps(entry))
        if kept and size > HISTORY_TOOLS_CHARS:
            kept[-1]["result"] += f"\n[{len(used) - n} more calls of this reply are not kept]"
            break
        kept.append(entry)
    return json.dumps(kept, ensure_ascii=False) if kept else ""
