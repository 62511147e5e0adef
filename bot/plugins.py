"""Installed plug-ins: the entry points of a group, read once for each import path.

Entry points are package metadata, and reading them walks every installed distribution (a few
milliseconds in a virtual environment of some 150 packages). The settings check the
platform's name against them each time they are built, and the tests build thousands. What
is installed is seen as the import path gives it: a folder added to `sys.path` is read then;
a package installed while a process runs is seen at its next start, as its code would be."""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from importlib.metadata import EntryPoint


def entry_points(group: str, name: str | None = None) -> tuple[EntryPoint, ...]:
    """The entry points of `group` (only those called `name`, when given)."""
    found = _read(group, tuple(sys.path))
    return found if name is None else tuple(point for point in found if point.name == name)


@functools.lru_cache(maxsize=32)
def _read(group: str, path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    """The group as `importlib.metadata` reads it from `sys.path` now; `path`, its value,
    is what the cache tells readings apart by."""
    return tuple(importlib.metadata.entry_points(group=group))
