"""Reading the tables a benchmark prints, for the benchmarks' smoke tests."""

from __future__ import annotations

import re


def table(
    out: str, first: str, names: tuple[str, ...], after: str = ""
) -> dict[str, dict[str, str]]:
    """The rows named `names` of the table whose header starts with `first` (the first such
    after the line containing `after`), by column."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    header = next(line for line in lines[start:] if line.startswith(first + " "))
    columns = re.split(r"\s{2,}", header.strip())
    rows = {}
    for line in lines[lines.index(header, start) + 2 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] not in names:
            break
        rows[cells[0]] = dict(zip(columns, cells, strict=True))
    return rows
