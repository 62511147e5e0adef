"""A smoke run of `benchmarks.groups` at a tiny size: three `lastword run` replicas, two groups
with people bursting at the bot and one chatting, then the same in DMs, then in the groups
under Telegram's limits, alone and a few seconds into a flood by one more member. What the
design guarantees whatever the machine is asserted (one reply per burst, none stale, none to
the wrong message or to the chatter, every mention of the flood covered, no 429); the times
are the benchmark's to report."""

from __future__ import annotations

import re

import pytest

from benchmarks import groups
from tests.support.bench_tables import table

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

PLACES = ("groups", "DMs", "groups, Telegram's limits", "groups, one flooding")


def test_groups_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    groups.main(
        [
            *("--groups", "2", "--people", "2", "--chatters", "1", "--rounds", "1"),
            *("--flood-s", "6", "--ask-at-s", "4"),
        ]
    )
    out = capsys.readouterr().out

    rows = table(out, "place", PLACES)
    assert set(rows) == set(PLACES), out
    for row in rows.values():
        assert row["bursts"] == "4" and row["replies/burst"] == "1.00", out
        assert row["stale"] == "0" and row["to chatter"] == "0", out
        assert float(row["p50 (s)"]) > 0, out
    for place in PLACES[:1] + PLACES[2:]:
        assert rows[place]["wrong message"] == "0", out
    fate = re.search(r"^the flood: 12 mentions .* (\d+)/12 covered by one; 429s: (\d+)$", out, re.M)
    assert fate is not None and fate.groups() == ("12", "0"), out
