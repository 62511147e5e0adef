"""Fixtures of the console's terminal tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console import server_pids


@pytest.fixture
def data_dir(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "data"
    yield path
    # A bot killed by a failing test takes its server down with it, though not at once.
    deadline = time.monotonic() + 5
    while server_pids(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_pids(path) == [], "an embedded server outlived its test"
