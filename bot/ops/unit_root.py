"""Paths under `lastword doctor --root`, resolved and read as in a chroot.

With `--root`, doctor reads a unit from the files under a directory, as `systemctl --root`
does: the unit files, and the env files and credentials they name. Every path is resolved
under the root as in a chroot, part by part, symlinks included (an absolute target starts
again at the root); globs are matched there too. A path that would climb out of the root (by a
`..`, a link's too) or whose links loop is refused, never read, so that a unit file written to
do harm cannot make doctor show a file of the host. A file is read only if it is a regular one
of a sane size: a last symlink swapped in after the path was resolved is not followed, a FIFO
does not block.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from pathlib import Path

# The symlinks a path may pass through before it counts as a loop (Linux's MAXSYMLINKS).
SYMLINKS_MAX = 40
# What makes a path a glob(7) pattern.
_MAGIC = re.compile(r"[*?[]")


class _Refused(OSError):
    """A path not read: it leads out of the root, its links loop, or it is no regular file of a
    sane size. The message names the path."""


def under(root: Path, path: str) -> Path:
    """`path` (absolute) as it reads under `root`, nothing resolved: how a path is shown."""
    return root / path.lstrip("/")


def inside(root: Path, path: str) -> Path:
    """`path` (absolute, as the unit names it) resolved under `root` as in a chroot: each
    symlink followed there (an absolute target starts again at the root), `..` taken part by
    part. _Refused when a `..` would climb above the root (at `/` itself it stays, as the
    kernel has it) or the links loop. The last parts may be missing."""
    at_top = root.resolve() == Path("/")
    done: list[str] = []
    todo = path.split("/")[::-1]
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not done and not at_top:
                raise _Refused(f"{under(root, path)} leads out of {root}")
            done = done[:-1]
            continue
        here = root.joinpath(*done, part)
        try:
            link = stat.S_ISLNK(os.lstat(here).st_mode)
        except OSError:
            # Missing or unreachable: what opens it says so.
            link = False
        if not link:
            done.append(part)
            continue
        links += 1
        if links > SYMLINKS_MAX:
            raise _Refused(f"{under(root, path)}: too many levels of symbolic links")
        target = os.readlink(here)
        if target.startswith("/"):
            done = []
        todo += target.split("/")[::-1]
    return root.joinpath(*done)


def glob(root: Path, pattern: str) -> list[str]:
    """The paths (as the unit would name them) that the absolute `pattern` matches under
    `root`, sorted as glob(3) returns them: a part with `*`, `?` or `[` matches names in its
    folder (a leading dot only when the part has one), and only paths that exist match; a
    pattern without one is returned as it is, found or not. _Refused when a folder to list
    leads out of the root."""
    paths = [""]
    for part in pattern.split("/"):
        if not part:
            continue
        if not _MAGIC.search(part):
            paths = [f"{path}/{part}" for path in paths]
            continue
        matched: list[str] = []
        for path in paths:
            folder = inside(root, path or "/")
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            matched += [
                f"{path}/{name}"
                for name in names
                if fnmatch.fnmatchcase(name, part) and (part[0] == "." or name[0] != ".")
            ]
        paths = matched
    if not _MAGIC.search(pattern):
        return paths
    return sorted(path for path in paths if _found(root, path))


def _found(root: Path, path: str) -> bool:
    """Whether `path` exists under `root`; so does one that cannot be resolved, so that
    reading it says why."""
    try:
        return inside(root, path).exists()
    except OSError:
        return True


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, _Refused over `limit` bytes. A last symlink is not followed (one
    swapped in after the path was resolved), nor does a FIFO block."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused(f"{path} is not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise _Refused(f"{path} is over {limit:,} bytes")
    return data


def why_not_read(exc: OSError) -> str:
    """Why a path was not read, as one line that names it."""
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
