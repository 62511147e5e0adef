"""The prompt for one reply: the system prompt, as much recent history as fits, then every
unanswered message folded into one user turn.

The unanswered messages are what the reply is for, so they are never trimmed away for the
sake of history. Only if they alone exceed the budget are the oldest of them left out, and
the model is told how many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from bot.tokens import Counter

FOLD_HEADER = "Here is everything I sent that you have not answered yet, in order:"


@dataclass(frozen=True)
class Turn:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class Prompt:
    system: str
    history: tuple[Turn, ...]
    unanswered: tuple[str, ...]
    # Unanswered messages that did not fit and were left out (the oldest ones).
    left_out: int = 0

    def messages(self) -> list[dict[str, str]]:
        """Chat Completions messages: history with adjacent turns of one role merged, then ONE
        user turn that folds every unanswered message, so the model answers them together."""
        out: list[dict[str, str]] = [{"role": "system", "content": self.system}]
        for turn in self.history:
            if len(out) > 1 and out[-1]["role"] == turn.role:
                out[-1]["content"] += "\n" + turn.text
            else:
                out.append({"role": turn.role, "content": turn.text})
        if out[-1]["role"] == "user":
            # The last answered turn cannot be a user turn, but a trimmed history might be.
            out.append({"role": "assistant", "content": "(no reply)"})
        out.append({"role": "user", "content": self.folded()})
        return out

    def folded(self) -> str:
        if len(self.unanswered) == 1 and not self.left_out:
            return self.unanswered[0]
        lines = [FOLD_HEADER]
        if self.left_out:
            lines.append(
                f"({self.left_out} earlier message{'s were' if self.left_out > 1 else ' was'} "
                "left out: too long to fit.)"
            )
        lines += (f"{i}. {text}" for i, text in enumerate(self.unanswered, 1))
        return "\n".join(lines)

    def shrunk(self) -> Prompt | None:
        """The same prompt with the older half of its history dropped; None if there is no
        history left to drop."""
        if not self.history:
            return None
        return replace(self, history=self.history[len(self.history) // 2 + 1 :])


def system_prompt(template: str, now: datetime | None = None) -> str:
    """The configured system prompt with `{date}` and `{time}` filled in (UTC). Other braces
    are left as they are, so a prompt may contain JSON examples."""
    now = now or datetime.now(UTC)
    return template.replace("{date}", now.strftime("%Y-%m-%d")).replace(
        "{time}", now.strftime("%H:%M UTC")
    )


def fit(
    system: str,
    history: Sequence[Turn],
    unanswered: Sequence[str],
    budget: int,
    counter: Counter,
) -> Prompt:
    """The prompt within `budget` tokens: the system prompt and the unanswered messages
    first (newest kept first if even they do not fit), then history from the newest back."""
    room = budget - counter.count(system) - counter.count(FOLD_HEADER)
    kept: list[str] = []
    for text in reversed(unanswered):
        cost = counter.count(text)
        # The newest message always goes in: the reply is for it.
        if kept and cost > room:
            break
        kept.append(text)
        room -= cost
    kept.reverse()
    turns: list[Turn] = []
    for turn in reversed(history):
        cost = counter.count(turn.text)
        if cost > room:
            break
        turns.append(turn)
        room -= cost
    turns.reverse()
    return Prompt(system, tuple(turns), tuple(kept), left_out=len(unanswered) - len(kept))


def estimated_tokens(prompt: Prompt, counter: Counter) -> int:
    """What `counter` expects the provider to count for `prompt`."""
    return sum(counter.count(m["content"]) for m in prompt.messages())
