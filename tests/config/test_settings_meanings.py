"""Each setting means one thing, said once: the table of docs/settings.md gives each row a
meaning of its own (from its field's description), and `lastword settings` prints the same
meanings, with the commands of `lastword --help` on its first screen.

The command line runs as the installed script in a process of its own, with a clean
environment, as an operator meets it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from adapters.discord import DiscordSettings
from tests.support import forked, settings_table
from tests.support.console import clean_env

PROJECT = Path(__file__).resolve().parents[2]
PAGE = PROJECT / "docs" / "settings.md"
COMMANDS = ("run", "status", "doctor", "settings", "migrate-shards", "forget-user")


def lastword(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lastword` to completion (bounded, forked from the zygote), in a clean environment."""
    return forked.run(*args, env=clean_env(None), cwd=cwd, timeout=30)


def test_no_two_settings_share_a_meaning() -> None:
    page = PAGE.read_text()
    assert settings_table.current(page) == settings_table.table(page), "regenerate the table"
    assert settings_table.shared_meanings(page) == []


def test_the_check_finds_two_settings_that_read_alike() -> None:
    page = PAGE.read_text()
    rows = settings_table.meanings(page)
    quality = rows["LASTWORD_MEDIA__JPEG_QUALITY"]
    # The slip the table once had: the quality described as the longest edge.
    slipped = page.replace(quality, rows["LASTWORD_MEDIA__MAX_EDGE_PX"] + ".", 1)
    assert settings_table.shared_meanings(slipped) == [
        ("LASTWORD_MEDIA__MAX_EDGE_PX", "LASTWORD_MEDIA__JPEG_QUALITY")
    ]


def test_every_setting_of_lastword_itself_has_a_meaning_of_its_own() -> None:
    """The meanings are generated from the models, the core's and every built-in platform's:
    each field describes itself."""
    variables = [variable for variable, _field in settings_table.settings()]
    # The walk covers the built-in platforms, or this would pass with them left out.
    for platform in ("TELEGRAM", "DISCORD"):
        assert any(v.startswith(f"LASTWORD_{platform}__") for v in variables), platform
    assert settings_table.undescribed_settings() == []


def test_a_setting_without_a_description_is_refused_with_a_draft(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A built-in platform's setting that loses its description stops the table, which names
    it and quotes what the page says of it, rather than keeping a meaning the code lacks."""
    page = PAGE.read_text()
    said = settings_table.meanings(page)["LASTWORD_DISCORD__GATEWAY_URL"]
    monkeypatch.setattr(DiscordSettings.model_fields["gateway_url"], "description", None)
    assert settings_table.undescribed_settings() == ["LASTWORD_DISCORD__GATEWAY_URL"]
    with pytest.raises(settings_table.Undescribed) as refused:
        settings_table.table(page)
    assert "LASTWORD_DISCORD__GATEWAY_URL" in str(refused.value)
    assert repr(said) in str(refused.value)


def test_settings_lists_every_setting_with_its_default_and_meaning(short_dir: Path) -> None:
    result = lastword("settings", cwd=short_dir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = {line.split()[0]: i for i, line in enumerate(lines) if line.startswith("LASTWORD_")}
    page = settings_table.meanings(PAGE.read_text())
    for variable, _field in settings_table.settings():
        assert variable in rows, variable
        # Its meaning, wrapped under it, up to the next setting.
        at = rows[variable] + 1
        below = []
        while at < len(lines) and lines[at].startswith(" "):
            below.append(lines[at].strip())
            at += 1
        words = " ".join(below).split()
        assert words, f"{variable}: no meaning printed"
        assert words[:4] == page[variable].replace("`", "").split()[:4], variable
    assert "default: 2000" in lines[rows["LASTWORD_DEBOUNCE__QUIET_MS"]]
    assert "default: 30000" in lines[rows["LASTWORD_LEASE__TTL_MS"]]


def test_a_computed_default_says_how_not_this_machines_value(short_dir: Path) -> None:
    first = lastword("settings", cwd=short_dir)
    second = lastword("settings", cwd=short_dir)
    # Two processes, two pids: a default shown as this process's value would differ.
    assert first.stdout == second.stdout
    line = next(x for x in first.stdout.splitlines() if x.startswith("LASTWORD_REPLICA_ID "))
    assert line == "LASTWORD_REPLICA_ID  default: computed: <hostname>-<pid> of the process"
    data = next(x for x in first.stdout.splitlines() if x.startswith("LASTWORD_DATA_DIR "))
    assert "computed: $STATE_DIRECTORY under systemd" in data
    assert str(Path.home()) not in first.stdout


def test_help_shows_the_commands_and_where_the_settings_are(short_dir: Path) -> None:
    result = lastword("--help", cwd=short_dir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # One screen: every command, then the pointer, and no list of settings burying them.
    assert len(lines) <= 40, result.stdout
    listed = [line.split()[0] for line in lines if line.startswith("    ") and line.split()]
    assert [name for name in listed if name in COMMANDS] == list(COMMANDS)
    assert "LASTWORD_DEBOUNCE__QUIET_MS" not in result.stdout
    text = " ".join(result.stdout.split())
    assert "`lastword settings` lists every one with its default and meaning" in text
    assert "docs/settings.md" in text
    run_help = lastword("run", "--help", cwd=short_dir)
    assert "lastword settings" in " ".join(run_help.stdout.split())
    assert "LASTWORD_LEASE__TTL_MS" not in run_help.stdout
