"""Code hygiene is part of the test suite: ruff (lint and format) and mypy must be clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# mypy without its cache (a fresh clone's, CI's) takes about 40 s of CPU, and beside two busy
# loops and the suite's other workers it gets a small share of two cores: bounded as its run is.
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
