"""The prompt for one reply: the system prompt, as much recent history as fits, then every
unanswered message folded into one user turn.

The unanswered messages are what the reply is for, so they are never trimmed away for the
sake of history. Only if they alone exceed the budget are the oldest of them left out, and
the model is told how many. In a group, what others said (`bot.llm.others`) opens that user turn
as data: the message replied to before history, the room's lines after it, within a share of
the budget, so the room can never crowd out the person or push a request over.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from bot.llm.others import NOBODY, ROOM_CLOSE, ROOM_INTRO, ROOM_OPEN, Others
from bot.llm.remembered import MEMORY_CLOSE, MEMORY_INTRO, MEMORY_OPEN, MEMORY_SHARE, shown
from bot.tokens import PER_MESSAGE, Counter
from bot.tools import well_named

FOLD_HEADER = "Here is everything I sent that you have not answered yet, in order:"
# The room's lines take at most this fraction of a prompt's budget: 1/ROOM_SHARE.
ROOM_SHARE = 4
# Told to the model when the provider refused the images of the turn.
IMAGES_NOT_SHOWN = (
    "The user sent images, marked [photo] or [image], that could not be shown to you. Say so "
    "politely, and answer everything else."
)


@dataclass(frozen=True)
class Used:
    """A tool call a past reply made: the tool's name, the arguments as the model wrote them,
    and what it returned (cut)."""

    name: str
    arguments: str
    result: str


@dataclass(frozen=True)
class Turn:
    role: Literal["user", "assistant"]
    text: str
    # The tool calls a past reply made before it answered: shown to the model as calls and
    # `tool` results, attributed data, never as the reply's own sentences.
    used: tuple[Used, ...] = ()

    def counted(self) -> str:
        """What the turn's tokens are counted from."""
        return self.text + "".join(u.name + u.arguments + u.result for u in self.used)


def used_of(tools: str) -> tuple[Used, ...]:
    """A history entry's tool calls (`bot.core.steps.Done.tools`): none if it holds none, or is
    not of that shape (an entry from before calls were kept as data is shown without them)."""
    try:
        listed = json.loads(tools) if tools else []
    except ValueError:
        return ()
    if not isinstance(listed, list):
        return ()
    return tuple(
        Used(str(e.get("tool", "")), str(e.get("arguments", "{}")), str(e.get("result", "")))
        for e in listed
        if isinstance(e, dict)
    )


@dataclass(frozen=True)
class Image:
    """An image shown to the model: a `data:` URL of the re-encoded bytes (never a platform's
    URL, which may carry a secret or expire), and its estimated cost in prompt tokens."""

    url: str
    tokens: int


@dataclass(frozen=True)
class Prompt:
    system: str
    history: tuple[Turn, ...]
    unanswered: tuple[str, ...]
    # Unanswered messages that did not fit and were left out (the oldest ones).
    left_out: int = 0
    # The images of each unanswered message (empty, or one tuple per message), shown right
    # after its text, in the order they were sent.
    images: tuple[tuple[Image, ...], ...] = ()
    # The model the user picked with /model (None: the configured one).
    model: str | None = None
    # Tools offered to the model (Chat Completions `tools` entries), and what it has done with
    # them in this reply so far: its assistant messages with `tool_calls` and the `tool`
    # messages with their results, in order, after the user turn.
    tools: tuple[dict[str, Any], ...] = ()
    steps: tuple[dict[str, Any], ...] = ()
    # "none" on the step after the last one allowed: the model must answer in text.
    tool_choice: Literal["auto", "none"] | None = None
    # What others said, as data: it opens the user turn (`Others.shown`).
    others: Others = NOBODY
    # The person's facts, as data (`bot.llm.remembered`): before what others said.
    memory: tuple[str, ...] = ()

    def messages(self) -> list[dict[str, Any]]:
        """Chat Completions messages as strict chat templates take them: the system prompt,
        then turns that start with the user's and alternate (adjacent turns of one role
        merged), ending in ONE user turn that folds every unanswered message, so the model
        answers them together. A history trimmed to start on a reply loses that reply, as a
        request may not open with the assistant."""
        out: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        history = list(self.history)
        while history and history[0].role == "assistant":
            history.pop(0)
        for n, turn in enumerate(history):
            if turn.used:
                calls = _calls_made(n, turn.used)
                if out[-1]["role"] == "assistant":
                    # A reply that made calls after another reply: one assistant turn that
                    # says the first and then calls, as alternation requires.
                    calls[0]["content"] = out.pop()["content"]
                out += calls
                out.append({"role": "assistant", "content": turn.text})
            else:
                _said(out, turn.role, turn.text)
        _said(out, "user", self.folded())
        out += self.steps
        return out

    def folded(self) -> str | list[dict[str, Any]]:
        """The one user turn: plain text, or, when images come with it, content parts with
        each image right after the text of the message that carried it."""
        if not any(self.images):
            return "\n".join(self._lines())
        all_lines = self._lines()
        # The header lines come first; then line i + first is unanswered message i.
        first = len(all_lines) - len(self.unanswered)
        parts: list[dict[str, Any]] = []
        lines: list[str] = []
        for i, line in enumerate(all_lines):
            lines.append(line)
            images = self.images[i - first] if i >= first else ()
            if images:
                parts.append({"type": "text", "text": "\n".join(lines)})
                parts += ({"type": "image_url", "image_url": {"url": im.url}} for im in images)
                lines = []
        if lines:
            parts.append({"type": "text", "text": "\n".join(lines)})
        return parts

    def _lines(self) -> list[str]:
        # A blank line between the data and the person's own words.
        data = [block for block in (shown(self.memory), self.others.shown()) if block]
        lines = ["\n\n".join(data) + "\n"] if data else []
        if len(self.unanswered) == 1 and not self.left_out:
            return [*lines, self.unanswered[0]]
        lines.append(FOLD_HEADER)
        if self.left_out:
            lines.append(
                f"({self.left_out} earlier message{'s were' if self.left_out > 1 else ' was'} "
                "left out: too long to fit.)"
            )
        lines += (f"{i}. {text}" for i, text in enumerate(self.unanswered, 1))
        return lines

    def without_images(self) -> Prompt:
        """The same prompt with no images, and the model told they could not be shown."""
        return replace(self, images=(), system=self.system + "\n\n" + IMAGES_NOT_SHOWN)

    def shrunk(self) -> Prompt | None:
        """The same prompt with the older half of its history and the room's lines dropped
        (the provider counts more than we did); None if there is neither left to drop."""
        if not self.history and not self.others.room:
            return None
        return replace(
            self,
            history=self.history[len(self.history) // 2 + 1 :],
            others=replace(self.others, room=()),
        )


def _said(out: list[dict[str, Any]], role: str, content: str | list[dict[str, Any]]) -> None:
    """Append a turn to `out`, merged into the last one if that is the same role's: texts
    joined by a blank line, or content parts after the text before them."""
    last = out[-1]
    if last["role"] != role:
        out.append({"role": role, "content": content})
    elif isinstance(content, str):
        last["content"] += "\n\n" + content
    else:
        last["content"] = [{"type": "text", "text": last["content"] + "\n\n"}, *content]


def _calls_made(n: int, used: tuple[Used, ...]) -> list[dict[str, Any]]:
    """A past reply's tool calls as the model made them: one assistant message with the
    calls, then each one's result as a `tool` message, so a follow-up question can use them
    without calling again, and a result is read as the tool's data, never as what the bot
    said (an instruction injected through a tool is not replayed in the bot's voice)."""
    ids = [f"past_{n}_{i}" for i in range(len(used))]
    calls = [
        {
            "id": i,
            "type": "function",
            "function": {"name": well_named(u.name), "arguments": u.arguments},
        }
        for i, u in zip(ids, used, strict=True)
    ]
    results = [
        {"role": "tool", "tool_call_id": i, "content": u.result}
        for i, u in zip(ids, used, strict=True)
    ]
    return [{"role": "assistant", "content": None, "tool_calls": calls}, *results]


def system_prompt(template: str, now: datetime | None = None) -> str:
    """The configured system prompt with `{date}` and `{time}` filled in (UTC). Other braces
    are left as they are, so a prompt may contain JSON examples."""
    now = now or datetime.now(UTC)
    return template.replace("{date}", now.strftime("%Y-%m-%d")).replace(
        "{time}", now.strftime("%H:%M UTC")
    )


# Introduces a user's /persona in the system prompt: theirs, after the operator's.
PERSONA_INTRO = (
    "The user asked you to follow these instructions of theirs in this conversation, as far "
    "as the instructions above allow:"
)


def with_persona(system: str, persona: str) -> str:
    """The system prompt with the user's own instructions (/persona) after it, if any."""
    return f"{system}\n\n{PERSONA_INTRO}\n{persona}" if persona else system


def fit(
    system: str,
    history: Sequence[Turn],
    unanswered: Sequence[str],
    budget: int,
    counter: Counter,
    images: Sequence[tuple[Image, ...]] = (),
    others: Others = NOBODY,
    memory: Sequence[str] = (),
) -> Prompt:
    """The prompt within `budget` tokens: the system prompt and the unanswered messages
    (with their images) first, newest kept first if even they do not fit; then what they
    reply to, if it fits; then history from the newest back; then the person's newest facts
    (`memory`), within what is left and at most 1/MEMORY_SHARE of the budget, so the
    conversation outranks old facts; then the room's newest lines, within what is left and
    at most 1/ROOM_SHARE of the budget."""
    left = budget - counter.count(system) - counter.count(FOLD_HEADER)
    shown = list(images) or [()] * len(unanswered)
    kept: list[tuple[str, tuple[Image, ...]]] = []
    for text, its_images in zip(reversed(unanswered), reversed(shown), strict=True):
        cost = counter.count(text) + sum(im.tokens for im in its_images)
        # The newest message always goes in: the reply is for it.
        if kept and cost > left:
            break
        kept.append((text, its_images))
        left -= cost
    kept.reverse()
    quoted = others.quoted
    cost = counter.count(Others(quoted).shown()) if quoted else 0
    if cost > left:
        quoted = ()
    else:
        left -= cost
    turns: list[Turn] = []
    for turn in reversed(history):
        cost = counter.count(turn.counted()) + PER_MESSAGE * 2 * len(turn.used)
        if cost > left:
            break
        turns.append(turn)
        left -= cost
    turns.reverse()
    facts = _newest(memory, min(left, budget // MEMORY_SHARE), counter, MEMORY_FRAME)
    left -= counter.count("\n".join(facts)) + (counter.count(MEMORY_FRAME) if facts else 0)
    return Prompt(
        system,
        tuple(turns),
        tuple(text for text, _ in kept),
        left_out=len(unanswered) - len(kept),
        images=tuple(its for _, its in kept) if any(shown) else (),
        others=Others(quoted, _newest(others.room, min(left, budget // ROOM_SHARE), counter)),
        memory=facts,
    )


ROOM_FRAME = "\n".join((ROOM_OPEN, ROOM_INTRO, ROOM_CLOSE))
MEMORY_FRAME = "\n".join((MEMORY_OPEN, MEMORY_INTRO, MEMORY_CLOSE))


def _newest(
    lines: Sequence[str], tokens: int, counter: Counter, frame: str = ROOM_FRAME
) -> tuple[str, ...]:
    """The newest of a block's `lines` that fit in `tokens`, with the block's `frame`."""
    left = tokens - counter.count(frame)
    kept: list[str] = []
    for line in reversed(lines):
        cost = counter.count(line)
        if cost > left:
            break
        kept.append(line)
        left -= cost
    return tuple(reversed(kept))


def estimated_tokens(prompt: Prompt, counter: Counter) -> int:
    """What `counter` expects the provider to count for `prompt`."""
    total = sum(im.tokens for its in prompt.images for im in its)
    for message in prompt.messages():
        content = message.get("content")
        if isinstance(content, str):
            total += counter.count(content)
        elif content:
            total += sum(counter.count(p["text"]) for p in content if p["type"] == "text")
        for call in message.get("tool_calls", ()):
            total += counter.count(call["function"]["name"] + call["function"]["arguments"])
    if prompt.tools:
        total += counter.count(json.dumps(prompt.tools))
    return total
