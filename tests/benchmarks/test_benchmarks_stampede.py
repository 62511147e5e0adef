"""A smoke run of `benchmarks.stampede` at a tiny size: three `lastword run` replicas against
the fake Bot API enforcing Telegram's limits print every table, the faults' rows and the hold
run in one fleet. Only what the shared budget guarantees whatever the machine is asserted (no
429, every user owed a reply answered, a held reply waits); the times and costs are the
benchmark's to report."""

from __future__ import annotations

import pytest

from benchmarks import stampede
from tests.support.bench_tables import table

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

# Each fault and the hold bite: at 10 calls a second the 12 replies take a second or more.
TINY = (
    "--users 12 --rate 10 --modes shared --calls 20 --one-fleet --fault-at-s 0.3"
    " --outage-s 0.5 --lease-ms 1500 --hold-replies 12 --hold-s 0.5"
)
ROWS = ("shared", "shared, flood wait", "shared, Redis restart", "shared, kill -9")


def test_stampede_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    stampede.main(TINY.split())
    out = capsys.readouterr().out

    rows = table(out, "case", ROWS)
    assert set(rows) == set(ROWS), out
    for row in rows.values():
        assert row["429s"] == "0" and row["429s after 1st s"] == "0", out
        # The flood wait's chat is owed nothing within the run.
        assert row["delivered"] == ("11/11" if "flood" in row["case"] else "12/12"), out
        assert float(row["ratio"].rstrip("x")) > 0, out
        assert float(row["model calls/user"]) >= 1, out
        assert float(row["budget calls/msg"]) > 0, out
    assert rows["shared"]["duplicates"] == "0", out
    for fault in ("flood wait:", "Redis restart:", "kill -9:"):
        assert f"  {fault} " in out, out
    held = table(out, "bot-wide scope", ("free (idle)", "held"))
    # Held, every reply written waits.
    assert held["held"]["waiting"] == "12", out
    assert float(held["held"]["Redis cmds/s"]) > 0, out
    steps = table(out, "step", ("an ask", "an ask and an answer"))
    assert set(steps) == {"an ask", "an ask and an answer"}, out
    assert all(int(step["median (µs)"]) > 0 for step in steps.values()), out
