"""A smoke run of `benchmarks.groups` at a tiny size: three `lastword run` replicas, two groups
with people bursting at the bot and one chatting, then the same in DMs. What the design
guarantees whatever the machine is asserted (one reply per burst, none stale, none to the
wrong message or to the chatter); the times are the benchmark's to report."""

from __future__ import annotations

import pytest

from benchmarks import groups
from tests.test_benchmarks_tools import table

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_groups_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    groups.main(["--groups", "2", "--people", "2", "--chatters", "1", "--rounds", "1"])
    out = capsys.readouterr().out

    rows = table(out, "place", ("groups", "DMs"))
    assert set(rows) == {"groups", "DMs"}, out
    for row in rows.values():
        assert row["bursts"] == "4" and row["replies/burst"] == "1.00", out
        assert row["stale"] == "0" and row["to chatter"] == "0", out
        assert float(row["p50 (s)"]) > 0, out
    assert rows["groups"]["wrong message"] == "0", out
