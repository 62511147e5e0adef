"""The hexagon's walls, read from the source: the core knows no platform, and no platform
knows the store. Only the composition root (bot/app.py, bot/cli.py) sees both sides."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSITION_ROOT = {Path("bot/app.py"), Path("bot/cli.py")}
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
