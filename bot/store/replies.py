"""What Redis answers, as Python values: the client hands back bytes, and the scripts answer
with a JSON object (`cjson.encode`) whose fields the store's dataclasses take by name."""

from __future__ import annotations

import json
from typing import Any


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


_DECODER = json.JSONDecoder()


def decoded(raw: bytes | str) -> dict[str, Any]:
    """A script's reply object. Lua's cjson writes an empty table as `{}`, so a field that
    holds a list reads back as `{}` when empty: `listed` takes both."""
    # Decoded to text first: json.loads would sniff the bytes' encoding on every reply.
    found: dict[str, Any] = _DECODER.decode(raw.decode() if isinstance(raw, bytes) else raw)
    return found


def decoded_each(raw: bytes | str) -> list[dict[str, Any]]:
    """A script's reply of several objects (a list of them, as `decoded` reads one)."""
    found: list[dict[str, Any]] = _DECODER.decode(raw.decode() if isinstance(raw, bytes) else raw)
    return found


def listed(value: Any) -> list[Any]:
    """A list field of a script's reply (`decoded`), empty when cjson wrote `{}` or left it out."""
    return value if isinstance(value, list) else []
