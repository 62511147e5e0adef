"""The README and docs/ stay true: the settings table is the settings model's, every shell
command in them is run by a test or visibly marked as not runnable here, every link lands,
and `lastword --version` is the changelog's newest entry.

Regenerate the settings table after changing a setting with
`LASTWORD_WRITE_DOCS=1 .venv/bin/pytest tests/test_docs.py -n 0`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import settings_table
from tests.support.running import clean_environ

PROJECT = Path(__file__).resolve().parent.parent
PAGES = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
SHELLS = ("sh", "bash", "console", "shell")
# A block the tests cannot run says so in its first line, and why.
NOT_RUN = "# not run by the tests:"
# Blocks run elsewhere, by (page, the block's first line): the test that runs them.
COVERED = {
    (
        "README.md",
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/lastword run",
    ): "its install is the test command's (.ci/run); `lastword run` on the console is run by "
    "test_the_readme_console_answers_a_burst_once",
    (
        "README.md",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pytest",
    ): ".ci/run, verbatim",
    ("README.md", "cat > .env <<'EOF'"): "tests/e2e/test_quickstart.py",
    ("README.md", "cat >> .env <<'EOF'"): "tests/e2e/test_quickstart.py",
    ("README.md", ".venv/bin/lastword doctor"): "tests/e2e/test_quickstart.py",
    ("README.md", ".venv/bin/pip install mcp-server-time"): "tests/e2e/test_quickstart.py",
    ("docs/operating.md", "sudo python3 -m venv /opt/lastword/.venv"): (
        "tests/e2e/test_install_walkthrough.py"
    ),
}
# Blocks this file runs itself, by (page, first line).
CONSOLE = ("README.md", "printf 'hi\\nare you there?\\nhello?\\n' | .venv/bin/lastword run")
VERSION = ("README.md", ".venv/bin/lastword --version")
RUN_HERE = {CONSOLE, VERSION}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    info: str
    text: str

    @property
    def first(self) -> str:
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")

    @property
    def key(self) -> tuple[str, str]:
        return (self.page, self.first)


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, indented ones (in lists) included."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^(\s*)```(\S*)(.*)$", lines[index])
        if opening is None:
            index += 1
            continue
        indent, start = opening.group(1), index
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index].removeprefix(indent))
            index += 1
        page = str(path.relative_to(PROJECT))
        info = (opening.group(2) + opening.group(3)).strip()
        found.append(Block(page, start + 1, info, "\n".join(body)))
        index += 1
    return found


def shell_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.info.split(" ")[0] in SHELLS]


def test_every_shell_command_is_run_by_a_test_or_marked_as_not_run() -> None:
    unaccounted = [
        f"{b.page}:{b.line}: {b.first}"
        for b in shell_blocks()
        if not b.first.startswith(NOT_RUN)
        and "norun" not in b.info.split()
        and b.key not in COVERED
        and b.key not in RUN_HERE
    ]
    assert not unaccounted, (
        "shell blocks neither run by a test nor marked: run each from a test (and list it in "
        f"COVERED or RUN_HERE in tests/test_docs.py), or start it with '{NOT_RUN} <why>':\n"
        + "\n".join(unaccounted)
    )


def test_every_block_said_to_be_run_exists() -> None:
    keys = {b.key for b in shell_blocks()}
    stale = sorted((set(COVERED) | RUN_HERE) - keys)
    assert not stale, f"no such block any more, drop it from tests/test_docs.py: {stale}"


def test_a_block_not_run_says_why() -> None:
    bare = [f"{b.page}:{b.line}" for b in shell_blocks() if b.first.strip() == NOT_RUN.rstrip(":")]
    assert not bare


def _shell(command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`command` as a reader runs it in the clone, with the tests' own venv as `.venv` and a
    data directory of its own, none of the developer's settings."""
    env = clean_environ() | {
        "LASTWORD_DATA_DIR": str(tmp_path / "data"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    venv = str(Path(sys.executable).parent.parent)
    return subprocess.run(
        ["bash", "-c", command.replace(".venv/", f"{venv}/")],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _block(key: tuple[str, str]) -> Block:
    [found] = [b for b in shell_blocks() if b.key == key]
    return found


def test_the_readme_console_answers_a_burst_once(tmp_path: Path) -> None:
    block = _block(CONSOLE)
    command, said = block.text.splitlines()
    result = _shell(command, tmp_path)
    assert result.returncode == 0, result.stderr
    # The block's comment is the reply it promises, one for the three lines.
    assert result.stdout.splitlines() == [said.removeprefix("# ")]


def test_the_readme_version_and_help_commands_run(tmp_path: Path) -> None:
    block = _block(VERSION)
    outputs = []
    for command in block.text.splitlines():
        result = _shell(command, tmp_path)
        assert result.returncode == 0, (command, result.stderr)
        outputs.append(result.stdout)
    assert outputs[0].startswith("lastword ")
    assert "LASTWORD_LLM__MODEL" in outputs[1]


def changelog_version() -> str:
    """The newest version the changelog describes (its first `## [x.y.z]` heading)."""
    text = (PROJECT / "CHANGELOG.md").read_text()
    found = re.search(r"^## \[(\d+\.\d+\.\d+)\]", text, re.M)
    assert found, "CHANGELOG.md has no '## [x.y.z] - date' entry"
    return found.group(1)


def test_the_version_is_the_changelogs_newest() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bot", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == f"lastword {changelog_version()}"


def test_the_licence_is_the_one_pyproject_names() -> None:
    licence = (PROJECT / "LICENSE").read_text()
    assert licence.startswith("MIT License")
    assert "the lastword authors" in licence
    assert re.search(r"^license = .*MIT", (PROJECT / "pyproject.toml").read_text(), re.M)


# The README is the front door, read top to bottom in a few minutes; the reference is docs/.
README_MOST_LINES = 300
FRONT_DOOR = ("## Try it", "## Quickstart", "## The commands users type", "## Documentation")


def test_the_readme_is_a_front_door_and_maps_every_page_of_docs() -> None:
    readme = (PROJECT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MOST_LINES
    headings = [line for line in readme.splitlines() if line.startswith("## ")]
    order = [next(i for i, h in enumerate(headings) if h.startswith(f)) for f in FRONT_DOOR]
    assert order == sorted(order), f"the README's sections, in order: {FRONT_DOOR}"
    mapped = set(re.findall(r"\(docs/([\w-]+\.md)\)", readme.split("## Documentation")[1]))
    assert mapped == {page.name for page in (PROJECT / "docs").glob("*.md")}


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings."""
    inside = False
    found = set()
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        heading = re.match(r"^#+ (.*)$", line)
        if heading and not inside:
            words = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            found.add(words.replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(PROJECT)))
def test_every_link_lands(page: Path) -> None:
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        goal = (page.parent / file).resolve() if file else page
        lost = anchor and goal.suffix == ".md" and anchor not in _anchors(goal)
        if not goal.exists() or lost:
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_the_settings_table_is_the_models() -> None:
    path = PROJECT / "docs" / "settings.md"
    page = path.read_text()
    if os.environ.get("LASTWORD_WRITE_DOCS") == "1":
        path.write_text(settings_table.rewritten(page))
        page = path.read_text()
    assert settings_table.current(page) == settings_table.table(page), (
        "docs/settings.md's table differs from the settings model; regenerate it with "
        "LASTWORD_WRITE_DOCS=1 .venv/bin/pytest tests/test_docs.py -n 0"
    )
    assert not settings_table.undescribed(page), "describe these settings in docs/settings.md"
