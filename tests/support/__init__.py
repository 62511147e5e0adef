"""What the tests share: servers, fakes of the outside, builders, processes and waits.

No test module imports another test module; what two of them need lives here. Under pytest the
asserts of its modules are rewritten as a test module's are, so a failing check shows what it
compared; the processes started from here (`python -m tests.support.replica`) skip that.
"""

import sys

if "pytest" in sys.modules:
    import pkgutil

    sys.modules["pytest"].register_assert_rewrite(
        *(f"{__name__}.{module.name}" for module in pkgutil.iter_modules(__path__))
    )
