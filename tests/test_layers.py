"""The house's shape, read from the source:

- the layers hold: `lint-imports` runs the contracts in `pyproject.toml` (each layer imports
  only those below it, the core knows no platform, platforms know no Redis, no import cycle
  among a package's modules), indirect imports included;
- docs/design.md's table of layers is the tree's and the contract's, so it cannot go stale;
- no module sits in `bot/` itself but the ground floor's and `__main__`;
- the core names no platform, even in a string;
- no module under tests/ imports a test module: what two of them share is in tests/support/
  (fixtures in a conftest.py).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"


def contract(name: str) -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [found] = [c for c in config["contracts"] if c["id"] == name]
    return dict(found)


def layers() -> list[set[str]]:
    """The layers contract's layers, top first, each the set of its packages or modules."""
    raw = contract("layers")["layers"]
    assert isinstance(raw, list)
    return [{part.strip() for part in re.split(r"[|:]", layer)} for layer in raw]


def test_the_layers_hold() -> None:
    result = subprocess.run(
        # import-linter's own command, installed beside this Python.
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def test_the_ground_floor_is_all_bot_holds_itself() -> None:
    ground = layers()[-1]
    modules = {path.stem for path in (ROOT / "bot").glob("*.py")} - {"__init__", "__main__"}
    assert modules == ground


def test_every_package_of_bot_is_a_layer() -> None:
    packages = {path.parent.name for path in (ROOT / "bot").glob("*/__init__.py")}
    assert packages == set().union(*layers()[:-1])


def design_table() -> list[tuple[int, str]]:
    """docs/design.md's table of layers: (layer, what its package column names)."""
    rows = re.findall(r"^\| (\d+) \| `bot/([\w/]*)`[^|]*\|", DESIGN.read_text(), re.M)
    return [(int(layer), package.strip("/")) for layer, package in rows]


def test_the_design_table_is_the_tree() -> None:
    table = design_table()
    numbers = sorted({layer for layer, _ in table})
    rows = [{package or "ground" for layer, package in table if layer == n} for n in numbers]
    assert rows == [*layers()[:-1], {"ground"}]
    # The ground floor's row lists its modules.
    [row] = [line for line in DESIGN.read_text().splitlines() if "(the ground floor)" in line]
    assert set(re.findall(r"`(\w+)\.py`", row)) == layers()[-1]


# The platforms that ship with lastword; the core must not know them, nor any other.
PLATFORMS = ("telegram", "discord")


def docstrings(tree: ast.AST) -> set[int]:
    """The lines of prose, which may give a platform as an example: where a docstring (a
    string that is a statement of its own) starts, and every line of a setting's
    `description=` (what `lastword settings` and docs/settings.md show)."""
    lines = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.keyword)
            and node.arg == "description"
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            lines.update(range(node.value.lineno, (node.value.end_lineno or node.lineno) + 1))
    return lines


def platform_names(path: Path) -> Iterator[tuple[int, str]]:
    """Every name and string in a file's code (comments and docstrings aside) that names a
    platform, with its line."""
    source = path.read_text()
    prose = docstrings(ast.parse(source, filename=str(path)))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.NAME, tokenize.STRING) or token.start[0] in prose:
            continue
        if any(platform in token.string.lower() for platform in PLATFORMS):
            yield token.start[0], token.string


def test_the_core_names_no_platform() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in sorted((ROOT / "bot").rglob("*.py"))
        for line, text in platform_names(path)
    ]
    assert not found, "bot/ must not name a platform in code:\n" + "\n".join(found)


def test_the_check_sees_a_platform_named_in_code(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        '"""Telegram, in prose."""\n'
        "# discord, in a comment\n"
        "def f(settings: object) -> object:\n"
        '    """The Discord token."""\n'
        "    return getattr(settings, 'discord')\n"
        "telegram_token = 1\n"
        "token: str = Field(\n"
        '    description=("the bot token from Telegram\'s "\n'
        '    "@BotFather"),\n'
        '    alias="telegram")\n'
    )
    assert list(platform_names(source)) == [
        (5, "'discord'"),
        (6, "telegram_token"),
        (10, '"telegram"'),
    ]


def imported_test_modules(path: Path) -> Iterator[tuple[int, str]]:
    """The test modules (`test_*`) the module at `path` imports, with the line of each import:
    `import tests.x.test_y`, `from tests.x.test_y import ...`, `from tests.x import test_y`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "tests" and name.split(".")[-1].startswith("test_"):
                yield node.lineno, name


def test_no_test_module_imports_another() -> None:
    """Each test module stands on its own: helpers live in tests/support/, shared fixtures in
    the nearest conftest.py, so that a test module can be moved, split or deleted alone."""
    tests = ROOT / "tests"
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted(tests.rglob("*.py"))
        if "plugins" not in path.relative_to(tests).parts
        for line, name in imported_test_modules(path)
    ]
    assert not found, "a module under tests/ imports a test module:\n" + "\n".join(found)
