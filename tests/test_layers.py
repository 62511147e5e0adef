"""The hexagon's walls, read from the source: the core knows no platform, and no platform
knows the store. Only the composition root (bot/service/app.py, bot/service/cli.py) sees both sides."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSITION_ROOT = {Path("bot/service/app.py"), Path("bot/service/cli.py")}
# Each package, with the modules none of its files may import.
FORBIDDEN = {
    "bot": ("telegram", "discord", "adapters"),
    "adapters": ("redis", "bot.store"),
}


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module a file imports, anywhere in it, with the line: `from x import y` counts
    as both `x` and `x.y`, since y may be a module; relative imports are made absolute."""
    package = path.relative_to(ROOT).parent.parts
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            if module:
                yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}" if module else alias.name


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found: dict[tuple[Path, int], str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.relative_to(ROOT) in COMPOSITION_ROOT:
            continue
        for line, module in imported(path):
            if any(module == name or module.startswith(name + ".") for name in forbidden):
                # One report per import statement, naming the module it first matched.
                found.setdefault((path.relative_to(ROOT), line), module)
    return [f"{path}:{line} imports {module}" for (path, line), module in sorted(found.items())]


@pytest.mark.parametrize(("package", "forbidden"), FORBIDDEN.items(), ids=FORBIDDEN.keys())
def test_no_import_crosses_a_layer(package: str, forbidden: tuple[str, ...]) -> None:
    found = violations(package, forbidden)
    assert not found, f"{package}/ must not import {', '.join(forbidden)}:\n" + "\n".join(found)


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
