"""split_message: replies cut to a platform's limit without losing text or breaking code blocks.

Adapters send whatever these parts are, so a lost character, a part over the limit or a code
block that no longer renders is what a user would see.
"""

from __future__ import annotations

import itertools
import random

import pytest

from bot.outbound.split import FENCE, split_message

# Runs of visible characters, each with the code block it renders in (see classify).
Classified = list[tuple[str, str | None]]


def classify(text: str) -> Classified:
    """The visible characters outside fence lines, whitespace dropped, in runs tagged with the
    code block they render in: the block's language ("" when untagged), or None for plain
    text. Fence lines toggle. Adjacent runs of one tag are merged, so equal texts compare
    equal however they were cut."""
    runs: list[tuple[list[str], str | None]] = []
    lang: str | None = None
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith(FENCE):
            lang = None if lang is not None else stripped[len(FENCE) :].strip()
            continue
        visible = "".join(line.split())
        if not visible:
            continue
        if runs and runs[-1][1] == lang:
            runs[-1][0].append(visible)
        else:
            runs.append(([visible], lang))
    return [("".join(chunks), tag) for chunks, tag in runs]


def merge(runs: Classified) -> Classified:
    merged: Classified = []
    for chars, tag in runs:
        if merged and merged[-1][1] == tag:
            merged[-1] = (merged[-1][0] + chars, tag)
        else:
            merged.append((chars, tag))
    return merged


def fence_lines(text: str) -> int:
    return sum(1 for line in text.split("\n") if line.strip().startswith(FENCE))


def check_invariants(text: str, limit: int, *, same_language: bool = True) -> list[str]:
    """The properties every split must have; returns the parts for further checks.

    `same_language=False` only asks that code stays code (an overlong tag is reopened bare)."""
    parts = split_message(text, limit)
    assert all(len(part) <= limit for part in parts), [len(p) for p in parts]
    assert all(part.strip() for part in parts), "an empty part"
    assert not any(part.startswith("\n") for part in parts[1:]), "a part starts with a blank line"
    # Each part renders on its own: it closes every block it opens (the input's are balanced).
    assert all(fence_lines(part) % 2 == 0 for part in parts), parts
    # Nothing lost, nothing reordered, and every character still renders as it did in the
    # original: code stays code in the same language, plain text stays plain.
    rendered = [run for part in parts for run in classify(part)]
    expected = classify(text)
    if not same_language:
        rendered = [(chars, None if lang is None else "") for chars, lang in rendered]
        expected = [(chars, None if lang is None else "") for chars, lang in expected]
    assert merge(rendered) == merge(expected)
    return parts


def words(n: int) -> str:
    return " ".join(f"w{i:04d}" for i in range(n))


def test_short_text_is_one_unchanged_part() -> None:
    text = "Hello!\n\nTwo paragraphs,\n  and an indented line.  "
    assert split_message(text, 100) == [text]
    exact = "x" * 100
    assert split_message(exact, 100) == [exact]


def test_empty_text_gives_no_parts() -> None:
    assert split_message("", 100) == []
    assert split_message(" \n\n ", 100) == []


def test_limit_too_small_is_refused() -> None:
    with pytest.raises(ValueError):
        split_message("x" * 100, 20)


def test_paragraph_break_is_preferred() -> None:
    first = "First paragraph, line one.\nLine two of the first paragraph."
    second = "Second paragraph.\nIt goes on and on " + "and on " * 20
    parts = check_invariants(first + "\n\n" + second, 120)
    # A line break and spaces were also in reach, but the paragraph break wins.
    assert parts[0] == first
    assert parts[1].startswith("Second paragraph.")


def test_line_break_is_preferred_over_space() -> None:
    lines = [f"line {i} has a few words in it" for i in range(10)]
    parts = check_invariants("\n".join(lines), 100)
    assert len(parts) > 1
    for part in parts:
        # Every part is whole lines: no line was cut at one of its spaces.
        assert all(line in lines for line in part.split("\n")), part


def test_word_boundary_is_preferred_over_a_hard_cut() -> None:
    text = words(100)
    parts = check_invariants(text, 80)
    assert len(parts) > 1
    for part in parts:
        assert all(len(word) == 5 and word.startswith("w") for word in part.split(" ")), part
    assert " ".join(parts) == text


def test_a_long_word_is_cut_hard() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(250))
    parts = check_invariants(text, 100)
    assert "".join(parts) == text
    assert len(parts) == 3
    assert all(len(part) <= 100 for part in parts)


def test_no_stub_part_from_an_early_space() -> None:
    # Cutting at the space would leave a 1-character part; a hard cut is better.
    text = "a " + "x" * 300
    parts = check_invariants(text, 100)
    assert len(parts[0]) > 25


def test_code_block_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"    print({i})  # step {i}" for i in range(40))
    text = f"Here is the script:\n\n```python\n{code}\n```\n\nRun it with python3."
    parts = check_invariants(text, 300)
    assert len(parts) >= 4
    assert parts[0].startswith("Here is the script:")
    for index, part in enumerate(parts):
        if "print(" in part:
            # The block is closed in every part that shows code, and reopened as python.
            assert part.count("```python\n") == 1 and fence_lines(part) == 2, part
            assert index == 0 or part.startswith("```python\n"), part
    # Indentation inside the block survives the cuts (it is not boundary whitespace).
    assert all("    print(" in part for part in parts[1:-1])
    assert parts[-1].endswith("Run it with python3.")


def test_untagged_code_block_reopens_untagged() -> None:
    code = "\n".join(f"row {i}: " + "=" * 30 for i in range(20))
    parts = check_invariants(f"```\n{code}\n```", 200)
    assert len(parts) > 1
    assert all(part.startswith("```\n") and part.endswith("\n```") for part in parts)


def test_no_empty_code_block_at_a_cut() -> None:
    # The cut would fall right after the opening fence: move the fence to the next part.
    text = "intro " * 12 + "\n```sh\n" + "echo hello\n" * 12 + "```"
    parts = check_invariants(text, 90)
    for part in parts:
        lines = part.split("\n")
        assert not any(a.startswith(FENCE) and b == FENCE for a, b in itertools.pairwise(lines)), (
            part
        )


@pytest.mark.timeout(5)
def test_long_fence_line_and_unbreakable_code_terminate() -> None:
    # Regression: an opener longer than a quarter of the limit, followed by code without any
    # break, used to re-cut after the reopened fence forever.
    text = "```python3x\n" + "A" * 200 + "\n```"
    parts = check_invariants(text, 40, same_language=False)
    assert parts[0].startswith("```python3x\nAAA")


@pytest.mark.timeout(5)
def test_overlong_fence_opener_is_reopened_bare() -> None:
    opener = "```python title=" + "t" * 40
    text = opener + "\n" + "\n".join(f"x = {i}" for i in range(40)) + "\n```"
    parts = check_invariants(text, 100, same_language=False)
    assert parts[0].startswith(opener)
    assert all(part.startswith("```\n") for part in parts[1:])
    assert all(fence_lines(part) == 2 for part in parts)


def test_5000_chars_at_2000_give_three_ordered_parts() -> None:
    text = words(834)[:5000]
    assert len(text) == 5000
    parts = check_invariants(text, 2000)
    assert len(parts) == 3
    assert " ".join(parts).split() == text.split()


def test_telegram_limit_4096() -> None:
    exact = "y " * 2048
    assert split_message(exact, 4096) == [exact]
    over = exact + "z"
    parts = check_invariants(over, 4096)
    assert len(parts) == 2
    assert all(len(part) <= 4096 for part in parts)
    assert parts[-1].endswith("z")


def _random_text(rng: random.Random) -> str:
    blocks: list[str] = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.3:
            lang = rng.choice(["", "python", "sh", "json", "c++"])
            lines = []
            for _ in range(rng.randint(0, 15)):
                indent = " " * rng.choice([0, 0, 2, 4, 8])
                line = " ".join(
                    "".join(rng.choices("abcxyz(){}=;", k=rng.randint(1, 10)))
                    for _ in range(rng.randint(0, 12))
                )
                lines.append(indent + line)
            if rng.random() < 0.1:
                lines.append("Q" * rng.randint(50, 300))
            body = "\n".join(lines)
            blocks.append(f"{FENCE}{lang}\n{body}\n{FENCE}" if lines else f"{FENCE}{lang}\n{FENCE}")
        else:
            lines = []
            for _ in range(rng.randint(1, 6)):
                tokens = []
                for _ in range(rng.randint(0, 25)):
                    if rng.random() < 0.03:
                        tokens.append("L" * rng.randint(30, 400))
                    else:
                        tokens.append("".join(rng.choices("lorem ipsu", k=rng.randint(1, 12))))
                lines.append(" ".join(tokens))
            blocks.append("\n".join(lines))
    separators = ["\n\n", "\n", "\n\n\n"]
    text = blocks[0]
    for block in blocks[1:]:
        text += rng.choice(separators) + block
    return text


def test_random_texts_keep_the_invariants() -> None:
    rng = random.Random(20240611)
    split_counts = 0
    for _ in range(800):
        text = _random_text(rng)
        limit = rng.choice([38, 40, 50, 64, 100, 160, 300, 2000])
        parts = check_invariants(text, limit)
        split_counts += len(parts) > 1
    # The generator must actually exercise splitting, not just short texts.
    assert split_counts > 500
