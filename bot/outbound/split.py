"""Splitting a reply to a platform's length limit, shared by every adapter.

Cuts fall on a paragraph break if one is in reach, else a line break, else a space, else
mid-word. A cut inside a fenced code block closes the fence and reopens it in the next part,
so each part renders on its own.
"""

from __future__ import annotations

FENCE = "```"


def _cut_point(text: str, limit: int, after: int = 0) -> int:
    """Where the next part ends: past `after`, and never later than `limit`."""
    window = text[:limit]
    for separator in ("\n\n", "\n", " "):
        at = window.rfind(separator)
        # A cut in the first quarter would leave a stub of a part; go finer instead. A cut at
        # or before `after` (the end of a reopened fence line) would take nothing of the text.
        if at > max(limit // 4, after):
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
    """`text` as parts of at most `limit` characters, in order, none of them blank."""
    if limit < 2 * len(FENCE) + 32:
        raise ValueError("limit too small to split with code fences")
    parts: list[str] = []
    rest = text
    reopen = ""
    while rest.strip():
        rest = reopen + rest
        if len(rest) <= limit:
            parts.append(rest)
            break
        # Leave room to close a fence if this part ends inside one.
        room = limit - len(FENCE) - 1
        cut = _cut_point(rest, room, len(reopen))
        opener = _open_fence(rest[:cut])
        head, newline, last = rest[:cut].rstrip("\n").rpartition("\n")
        if opener is not None and last.strip() == opener:
            # The cut falls right after a fence opens: the part would end in an empty block.
            # Move the opener to the next part, or if that leaves a stub, take some code along.
            start = len(head) + len(newline)
            cut = start if start > room // 4 else _cut_point(rest, room, start + len(last))
            opener = _open_fence(rest[:cut])
        part, rest = rest[:cut], rest[cut:]
        if opener is None:
            reopen = ""
        else:
            part = part.rstrip("\n") + "\n" + FENCE
            line, _, after = rest.lstrip("\n").partition("\n")
            if line.strip() == FENCE:
                # The block ends right at the cut: its own closing fence ends this part, rather
                # than an empty block being reopened and closed at the start of the next one.
                rest, reopen = after, ""
            else:
                # An opener too long to repeat is reopened bare: still code, just untagged.
                reopen = (opener if len(opener) < room // 2 else FENCE) + "\n"
        if not reopen:
            # Blank lines at a cut are boundary whitespace; a part should not start with them.
            rest = rest.lstrip("\n")
        parts.append(part.rstrip() or part)
    return [p for p in parts if p.strip()]
