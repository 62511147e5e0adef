"""Counts as a person reads them: "1 user", "2 users", "1,024 tokens"."""

from __future__ import annotations


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """`count` with its noun, singular for exactly one; `plural` for nouns that do not just
    take an "s" ("1 reply", "2 replies")."""
    noun = singular if count == 1 else (plural or singular + "s")
    return f"{count:,} {noun}"
