"""Splitting a reply to a platform's length limit, shared by every adapter.

Cuts fall on a paragraph break if one is in reach, else a line break, else a space, else
mid-word. A cut inside a fenced code block closes the fence and reopens it in the next part,
so each part renders on its own.
"""

from __future__ import annotations

FENCE = "```"


def _cut_point(text: str, limit: int) -> int:
    window = text[:limit]
    for separator in ("\n\n", "\n", " "):
        at = window.rfind(separator)
        # A cut in the first quarter would leave a stub of a part; go finer instead.
        if at > limit // 4:
            return at + len(separator)
    return limit


def _open_fence(text: str) -> str | None:
    """The opening fence line (e.g. "```python") if `text` ends inside a code block."""
    opener: str | None = None
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith(FENCE):
            opener = None if opener is not None else stripped
    return opener


def split_message(text: str, limit: int) -> list[str]:
    if limit < 2 * len(FENCE) + 32:
        raise ValueError("limit too small to split with code fences")
    parts: list[str] = []
    rest = text
    reopen = ""
    while rest:
        rest = reopen + rest
        if len(rest) <= limit:
            parts.append(rest)
            break
        # Leave room to close a fence if this part ends inside one.
        cut = _cut_point(rest, limit - len(FENCE) - 1)
        part, rest = rest[:cut], rest[cut:]
        opener = _open_fence(part)
        if opener is not None:
            part = part.rstrip("\n") + "\n" + FENCE
            reopen = opener + "\n"
        else:
            reopen = ""
        parts.append(part.rstrip() or part)
    return [p for p in parts if p.strip()]
