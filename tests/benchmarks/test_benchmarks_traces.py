"""`benchmarks.traces` needs Arize Phoenix, which is not among the test dependencies (about 140
packages): without it, the script says how to install it, and starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import traces


def test_without_phoenix_it_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        traces.main(["--phoenix", str(tmp_path / "no-such-phoenix")])
    assert stopped.value.code == traces.NOT_INSTALLED
    assert "pip install arize-phoenix" in str(stopped.value.code)
