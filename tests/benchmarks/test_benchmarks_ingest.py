"""Smoke runs of `benchmarks.ingest` and `benchmarks.baseline` at a tiny size: each runs end to
end with its worker processes on a real server and prints its table. The figures are the
benchmarks' to report; only what lastword guarantees whatever the load is asserted."""

from __future__ import annotations

import re

import pytest

from benchmarks import baseline, ingest

pytestmark = pytest.mark.timeout(40)


def test_ingest_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    sizes = ["--messages", "300", "--users", "30", "--concurrency", "4", "--repeat", "1"]
    ingest.main([*sizes, "--durability", "fast"])
    out = capsys.readouterr().out

    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("processes"))
    columns = re.split(r"\s{2,}", header.strip())
    rows = [
        dict(zip(columns, re.split(r"\s{2,}", line.strip()), strict=True))
        for line in lines
        if re.match(r"\d+\s+(lastword|raw EVALSHA)\s", line)
    ]
    assert {row["design"] for row in rows} == {"lastword", "raw EVALSHA"}, out
    # One command per message for the store's ingest at the default durability (the
    # durable levels may pipeline a wait after it), as the round trips benchmark says.
    fast = [r for r in rows if r["design"] == "lastword" and r.get("durability", "fast") == "fast"]
    assert fast and all(r["commands sent/msg"] == "1.00" for r in fast), out


def test_baseline_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    args = baseline.parse_args(
        [
            "--users", "6",
            "--bursts", "1",
            "--spread-s", "0.5",
            "--burst-s", "0.3",
            "--llm-ms", "50",
            "--quiet-ms", "400",
            "--max-wait-ms", "1200",
            "--settle-s", "1.5",
        ]
    )  # fmt: skip
    deliveries, outcomes = baseline.run(args)
    baseline.report(deliveries, outcomes, args)
    out = capsys.readouterr().out

    assert "naive" in out and "lastword" in out
    lastword = next(o for o in outcomes if o.design == "lastword")
    assert (lastword.lost, lastword.duplicate) == (0, 0), lastword
    assert lastword.replies == lastword.bursts
