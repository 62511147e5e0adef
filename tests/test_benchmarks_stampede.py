"""A smoke run of `benchmarks.stampede` at a tiny size: three `lastword run` replicas against
the fake Bot API enforcing Telegram's limits print both tables. Only what the shared budget
guarantees whatever the machine is asserted (no 429, every user answered once); the times are
the benchmark's to report."""

from __future__ import annotations

import pytest

from benchmarks import stampede
from tests.test_benchmarks_tools import table

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_stampede_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    stampede.main(["--users", "12", "--modes", "shared", "--calls", "20"])
    out = capsys.readouterr().out

    [shared] = table(out, "budget", ("shared",)).values()
    assert shared["429s"] == "0" and shared["429s after 1st s"] == "0", out
    assert shared["delivered"] == "12/12" and shared["duplicates"] == "0", out
    assert float(shared["ratio"].rstrip("x")) > 0, out
    steps = table(out, "step", ("budget_take", "budget_done"))
    assert set(steps) == {"budget_take", "budget_done"}, out
    assert all(int(step["median (µs)"]) > 0 for step in steps.values()), out
