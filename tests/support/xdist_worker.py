"""An xdist worker forked from the test zygote (`tests.support.forked`), not started afresh.

Each worker starts as `python -u -c <execnet's bootstrap>` and then imports pytest, its
plug-ins and every library the test modules import: about 4 s of its 7 s of CPU before the
first test, for each of the suite's workers. The zygote has imported those libraries
already, so `tests/conftest.py` names this module as the workers' interpreter, through the
stand-in `tests.support.zygote_child`:

    popen//python=<python> -m tests.support.zygote_child <zygote> tests.support.xdist_worker

execnet adds `-u -c <bootstrap>`, which this module runs as `python -u -c` would. Where the
zygote cannot be reached, the stand-in runs this module itself, and the worker starts as it
would have without it.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    """Run the code after `-c` as `python -c` runs it: as `__main__`, with `sys.argv` ['-c']."""
    code = argv[argv.index("-c") + 1]
    # The zygote imported `tests` and `tests.support` before pytest was there to register
    # the support modules for assert rewriting (tests/support/__init__.py): the worker
    # imports them again, under its own pytest, as a worker started afresh does.
    for name in [name for name in sys.modules if name == "tests" or name.startswith("tests.")]:
        del sys.modules[name]
    sys.argv = ["-c"]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main(sys.argv[1:])
