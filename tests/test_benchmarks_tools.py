"""A smoke run of `benchmarks.tools` at a tiny size: `lastword run` replicas, the fakes in
processes of their own and the append MCP server run end to end and print both tables. Only
what lastword guarantees whatever the load is asserted: under the storm, one execution per
requested call, one reply per user covering every message; with a replica killed, never more
than one execution per requested call. The times are the benchmark's to report."""

from __future__ import annotations

import re

import pytest

from benchmarks import tools

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

TINY = [
    "--users", "3",
    "--stagger-s", "1",
    "--storm", "2", "3",
    "--tool-s", "0.5",
    "--steps-users", "4",
    "--steps-per-turn", "2",
    "--steps-every-ms", "200",
]  # fmt: skip


def table(out: str, first: str, names: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The rows named `names` of the table whose header starts with `first`, by column."""
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith(first + " "))
    columns = re.split(r"\s{2,}", header.strip())
    rows = {}
    for line in lines[lines.index(header) + 2 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] not in names:
            break
        rows[cells[0]] = dict(zip(columns, cells, strict=True))
    return rows


def test_tools_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    tools.main(TINY)
    out = capsys.readouterr().out

    assert "command: python -m benchmarks.tools --users 3" in out, out
    storm = table(out, "row", ("storm", "kill"))
    assert set(storm) == {"storm", "kill"}, out
    calm = storm["storm"]
    assert calm["exec / requested"] == "1.00" and calm["dup keys"] == "0", out
    assert calm["replies / user (by count)"] == "1.00 (1: 3)", out
    assert calm["all folded"] == "3 / 3" and calm["unsettled"] == "0", out
    killed = storm["kill"]
    assert float(killed["exec / requested"]) <= 1.0 and killed["dup keys"] == "0", out
    assert killed["users exec > req"] == "0" and killed["unsettled"] == "0", out

    steps = table(out, "tool", ("read_only_echo", "append", "both"))
    # Two users each, two steps each, every one matched to its requests and its run.
    assert {name: row["steps"] for name, row in steps.items()} == {
        "read_only_echo": "4",
        "append": "4",
        "both": "8",
    }, out
    assert "! steps" not in out, out
