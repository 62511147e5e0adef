"""A smoke run of `benchmarks.memory` at a tiny size: it runs end to end on a real server and
prints its tables. The figures themselves are the benchmark's to report, not this test's."""

from __future__ import annotations

import pytest

from benchmarks import memory

pytestmark = pytest.mark.timeout(30)


def test_memory_benchmark_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    memory.main(
        [
            "--conversations", "3",
            "--big", "1",
            "--big-messages", "12",
            "--turns", "2",
            "--retention-s", "1",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out

    for title in ("## (a) idle after 2 turns", "## (b) a pending burst", "## (c) idle after 12"):
        assert title in out
    assert "## summary: bytes per conversation" in out
    # Every round of the tiny load is far shorter than the retention.
    assert "WARNING" not in out
