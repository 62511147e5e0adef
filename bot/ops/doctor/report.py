"""What `lastword doctor` reports: a line per check (✓, ! or ✗, with its fix), and the exit code."""

from __future__ import annotations

from bot.ops.check import Check

# What a failed check's line adds about the checks that depend on it, rather than a ✗ line
# of their own each.
NOT_CHECKED_ON_STORE = "so the scripts, memory and durability were not checked"


NOT_CHECKED_TOOLS = "so whether it takes the tools was not checked"


class Caution(Check):
    """A check that passed with a warning (made with `ok` true): shown with `!` and its fix,
    and, being ok, never a reason for a non-zero exit. (`Check` has no warning level.)"""


def render(checks: list[Check]) -> str:
    """One line per check, ✓, ! (a warning) or ✗, with the fix indented under a failed one
    and a warning."""
    lines: list[str] = []
    for check in checks:
        warned = isinstance(check, Caution)
        mark = "!" if warned else "✓" if check.ok else "✗"
        lines.append(f"{mark} {check.name}: {check.detail}")
        if (warned or not check.ok) and check.fix:
            lines.append(f"    fix: {check.fix}")
    return "\n".join(lines)


# What `lastword doctor` exits with when the settings do not load: as `run` does, a
# configuration error.
CONFIG_ERROR = 2


def exit_code(checks: list[Check]) -> int:
    """0 when every check passed, 2 when the settings do not load (`run` would exit 2 too),
    else 1: what `lastword doctor` exits with."""
    if checks and checks[0].name == "settings" and not checks[0].ok:
        return CONFIG_ERROR
    return 0 if checks and all(check.ok for check in checks) else 1
