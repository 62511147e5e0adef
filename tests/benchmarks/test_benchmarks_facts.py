"""A smoke run of `benchmarks.facts` at a tiny size: both rows run end to end (the facts saved
with /remember, then the measured bursts) and its table says what memory added. The figures
are the benchmark's to report; only what holds whatever the load is asserted: every burst
answered, the facts' block in every request with memory on and in none with it off."""

from __future__ import annotations

import re

import pytest

from benchmarks import facts

pytestmark = pytest.mark.timeout(90)


def test_the_facts_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    facts.main(["--facts", "4", "--bursts", "1", "--quiet-ms", "400", "--model-s", "0.2"])
    out = capsys.readouterr().out
    rows = [
        re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("memory ")
    ]
    assert [row[0] for row in rows] == ["memory off"] * 2 + ["memory on (4 facts)"] * 2, out
    assert all(row[2] == "1" for row in rows), out
    block = [int(row[8]) for row in rows]
    assert block[:2] == [0, 0] and all(n > 0 for n in block[2:]), out
    assert "!" not in out, out
