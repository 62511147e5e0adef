"""A smoke run of `benchmarks.flood` at a tiny size: one `lastword run` on its webhook, the
fakes in processes of their own, the table printed. The figures are the benchmark's to report;
asserted is only what holds whatever the load: every message acknowledged, every conversation
answered, and the bot's event-loop lag read from its /metrics. Run traced (`--traces on`), as
the figures of what traces cost are made: its spans reach the receiver."""

from __future__ import annotations

import re

import pytest

from benchmarks import flood

pytestmark = pytest.mark.timeout(120)


def figure(out: str, name: str) -> str:
    """The value of the row `name` in the printed table."""
    for line in out.splitlines():
        if line.startswith(name):
            return line[len(name) :].strip()
    raise AssertionError(f"no row {name!r} in:\n{out}")


def test_a_small_flood_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    flood.main(
        ["--rate", "15", "--load-s", "2", "--users", "8", "--senders", "4", "--traces", "on"]
    )
    out = capsys.readouterr().out
    received = re.search(r"^  spans received: (\d+) in (\d+) exports$", out, re.M)
    assert received is not None, out
    assert int(received[1]) > int(received[2]) > 0, out
    sent, acknowledged = figure(out, "messages sent / acknowledged (200)").split(" / ")
    assert int(sent) > 0 and sent == acknowledged, out
    assert figure(out, "conversations not settled after the load") == "0", out
    # No ERROR in the bot's log, its stop included (the provider's connections closed).
    assert "! bot:" not in out, out
    # p50 and p99 as histogram bounds, and the recent lag as polled.
    lag = figure(out, "bot loop lag p50 / p99 / recent max ms")
    assert re.fullmatch(r"<= [\d.]+ / <= [\d.]+ / \d+", lag), out
