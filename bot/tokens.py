"""Counting tokens offline, well enough to fit a prompt into the model's context.

No tokenizer ships with its encodings for every model, and lastword never downloads one at
run time, so this is an estimate: a quarter of a token per ASCII character (English prose
runs at about four characters a token with GPT-style tokenizers) and one token per other
character (CJK and most non-Latin scripts take one or more), plus a few tokens per message
for the chat framing. It is then checked against what the provider says it counted: the
`usage` of each answer moves a correction factor, so a model whose tokenizer differs is
budgeted by its own count after a few replies.

It also words the counts people read, so that /usage, /stats and `lastword status` say the
same thing of the same number (`spent`).
"""

from __future__ import annotations

import math

from bot.plural import counted

# The chat format's framing per message (role, separators), as OpenAI documents it.
PER_MESSAGE = 4
# How far one answer's usage moves the correction factor (an exponential moving average).
LEARNING_RATE = 0.3
# The factor stays within these bounds, so one odd answer cannot wreck the budget.
MIN_FACTOR, MAX_FACTOR = 0.5, 3.0


def estimate(text: str) -> int:
    """The estimated token count of `text`, before correction."""
    ascii_chars = sum(1 for char in text if char < "\x80")
    return math.ceil(ascii_chars / 4 + (len(text) - ascii_chars))


class Counter:
    """Estimates tokens, corrected by what the provider reports."""

    def __init__(self) -> None:
        self.factor = 1.0

    def count(self, text: str) -> int:
        """Tokens for `text` as one message of a chat prompt."""
        return math.ceil(estimate(text) * self.factor) + PER_MESSAGE

    def learn(self, estimated: int, reported: int) -> None:
        """The provider counted `reported` prompt tokens where we estimated `estimated`."""
        if estimated <= 0 or reported <= 0:
            return
        ratio = reported / estimated * self.factor
        factor = self.factor + LEARNING_RATE * (ratio - self.factor)
        self.factor = min(max(factor, MIN_FACTOR), MAX_FACTOR)


# What a daily budget is counted in once some model's tokens weigh more than others' (a
# `models` entry's `cost`): each token times its model's cost, rounded per reply.
WEIGHTED = "weighted tokens"


def spent(prompt: int, completion: int) -> str:
    """Tokens as every surface shows them: the prompt tokens the model read plus the
    completion tokens it wrote (what providers bill), unweighted, with the split. Every
    generation counts, whether its reply was sent, interrupted or thrown away as stale: the
    provider billed it all the same."""
    split = f"{prompt:,} prompt + {completion:,} completion"
    return f"{counted(prompt + completion, 'token')} ({split})"
