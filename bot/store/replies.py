"""What Redis answers, as Python values: the client hands back bytes."""

from __future__ import annotations


def as_text(value: bytes | str | int | None) -> str:
    """A reply as text: bytes decoded (a byte that is not UTF-8 replaced rather than raising,
    as a key or a field may hold anything), a number written out, None (no such key) as ""."""
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def look_in(ms: int | str | bytes) -> int | None:
    """When to look at a conversation again, from a script's reply: its -1 means never
    (nothing is owed, or it is not ours to look at)."""
    value = int(ms)
    return None if value < 0 else value
