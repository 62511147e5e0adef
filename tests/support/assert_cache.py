"""Write pytest's cache of the test modules with their asserts rewritten, as pytest itself
writes it where bytecode may be written. Run as ``python -m tests.support.assert_cache FILE...`` by
the controller (tests/conftest.py) before the workers start.

Why: where `PYTHONDONTWRITEBYTECODE` is set (as on CI's machines) pytest reads this cache but
never writes it, so every xdist worker rewrites every test module at collection, ~7 s of CPU
each. Written once here, each worker reads it instead.

It uses pytest's own rewriting and its own file format (a pyc checked against the source's
hash, so a file changed since is rewritten by the worker as before). Should a pytest release
change these internals, this exits with an error and writes nothing, and the workers rewrite
the modules themselves: slower, never wrong.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _pytest.assertion import rewrite


def write(source: Path) -> None:
    """The rewritten module of `source`, where pytest looks for it; nothing if it is there."""
    pyc = rewrite.get_cache_dir(source) / (source.name[:-3] + rewrite.PYC_TAIL)
    if rewrite._read_pyc(source, pyc) is not None:
        return
    # No config: pytest's only use of it here is the assertion pass hook, which is off.
    source_hash, code = rewrite._rewrite_test(source, None)  # type: ignore[arg-type]
    pyc.parent.mkdir(exist_ok=True)
    # Atomic, as pytest writes it: a worker reading meanwhile sees no file or a whole one.
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    with open(partial, "wb") as out:
        rewrite._write_pyc_fp(out, source_hash, code)
    os.replace(partial, pyc)


def main(paths: list[str]) -> int:
    for path in paths:
        write(Path(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
