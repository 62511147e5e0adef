"""Smoke runs of `benchmarks.interrupt` (issue 22's rows, issue 35's typing row) and
`benchmarks.lastword_latency` at a tiny size: each runs end to end, with its bot and fake
provider, and prints its table. The figures are the benchmarks' to report; only what lastword
guarantees whatever the load is asserted: every user answered, no stale reply, one reply per
burst on the console."""

from __future__ import annotations

import re

import pytest

from benchmarks import interrupt, lastword_latency

pytestmark = pytest.mark.timeout(90)


def table(out: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the table whose header starts with `first_header`, by column."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    columns = re.split(r"\s{2,}", lines[at].strip())
    rows = []
    for line in lines[at + 2 :]:
        if not line.strip() or line.startswith(" "):
            break
        rows.append(dict(zip(columns, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


def test_interrupt_rows_run_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    interrupt.main(
        ["--users", "6", "--stagger-s", "1", "--messages", "1", "2", "--rows", "today", "peers"]
    )
    out = capsys.readouterr().out
    rows = table(out, "row")
    assert [r["row"] for r in rows] == [
        "fixed 2000 ms (before speculation)",
        "peers (quiet 500 ms)",
    ], out
    assert all(r["answered"] == "6 / 6" and r["stale replies"] == "0" for r in rows), out
    assert all(float(r["prompt tok / reply"]) > 0 for r in rows), out


def test_interrupt_typing_row_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    # Two users of each kind (single-liners, fast bursts, slow typists), typing signals sent.
    interrupt.main(["--workload", "typists", "--users", "6", "--stagger-s", "1"])
    out = capsys.readouterr().out
    rows = table(out, "row")
    assert [r["row"] for r in rows] == [
        "speculate 400 + learned 600",
        "speculate 400 + learned 600 + typing",
    ], out
    assert all(r["answered"] == "6 / 6" for r in rows), out
    assert "typing signals, speculate 400 + learned 600 + typing:" in out, out


def test_lastword_latency_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    # A quiet window longer than the workload's longest gap (1 s): every burst is one reply.
    window = ["--quiet-ms", "1200", "--speculate-ms", "100"]
    lastword_latency.main(
        ["--bursts", "2", "--model-s", "0.2", *window, "--rows", "today", "speculate"]
    )
    out = capsys.readouterr().out
    rows = table(out, "row")
    assert len(rows) == 4 and "!" not in out, out
    assert all(r["bursts"] == "2" and r["replies / burst"] == "1.00" for r in rows), out
