"""Entry points are read once for an import path (`bot/plugins.py`): the settings check the
platform's name against them each time they are built, and each reading walks every
installed distribution's metadata."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from bot.plugins import entry_points


def test_a_group_is_read_once_for_a_path_and_again_when_a_folder_joins_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    read = importlib.metadata.entry_points

    def counted(*, group: str) -> importlib.metadata.EntryPoints:
        reads.append(group)
        return read(group=group)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    group = f"lastword.test-{tmp_path.name}"
    assert entry_points(group) == ()
    assert entry_points(group, "irc") == ()
    assert reads == [group]

    # A distribution installed in a folder that then joins the import path, as pip leaves one.
    site = tmp_path / "site"
    metadata = site / "lastword_irc-1.0.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: lastword-irc\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text(f"[{group}]\nirc = lastword_irc:PLUGIN\n")
    monkeypatch.syspath_prepend(str(site))
    assert [point.value for point in entry_points(group, "irc")] == ["lastword_irc:PLUGIN"]
    assert entry_points(group, "matrix") == ()
    assert [point.name for point in entry_points(group)] == ["irc"]
    assert reads == [group, group]
