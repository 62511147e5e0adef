"""Fixtures of the settings tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.config.settings import (
    ENV_PREFIX,
)


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory and an environment without lastword settings (nor the
    OpenAI conventions and credentials that stand in for them)."""
    for name in list(os.environ):
        if name.startswith((ENV_PREFIX, "OPENAI_", "CREDENTIALS_DIRECTORY")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work
