"""`lastword doctor`: check a deployment's configuration against the services it names.

Each check answers one question an operator has when the bot will not start or stays silent:
are the settings valid, is the store reachable and recent enough, do our Lua scripts load on
it, can it evict our keys when memory runs short, does the platform accept the token, and does
the LLM endpoint know the model, and does each MCP server start and list its tools. Every check
is bounded in time, so doctor itself never hangs on a black-holed address, and a failed check
says how to fix it. A warning (`Caution`, shown with `!`) is a check that passes, with advice:
it does not change the exit code.

Nothing a check reports may reveal a secret: details are written from what we know, not from
the libraries' own error text where that may quote a token (python-telegram-bot's does), and
every detail is scrubbed of the configured secrets before it is returned.

The platform's check is the one doctor does not know: it speaks the platform's library, so it
lives with the platform's adapter, and the caller (the composition root) hands it in.

The checks, one module a question: `settings`, `store`, `scripts` (and durability), `memory`,
`llm`, `mcp`, `tools`; `run` runs them in order and `report` renders them.
"""

from __future__ import annotations

from bot.ops.doctor.llm import BASE_URL_EXAMPLES
from bot.ops.doctor.memory import MemoryPolicy, memory_verdict
from bot.ops.doctor.report import (
    NOT_CHECKED_ON_STORE,
    NOT_CHECKED_TOOLS,
    Caution,
    exit_code,
    render,
)
from bot.ops.doctor.run import CHECK_TIMEOUT_S, main, run_checks
from bot.ops.doctor.scripts import durability_check, store_scripts

__all__ = [
    "BASE_URL_EXAMPLES",
    "CHECK_TIMEOUT_S",
    "NOT_CHECKED_ON_STORE",
    "NOT_CHECKED_TOOLS",
    "Caution",
    "MemoryPolicy",
    "durability_check",
    "exit_code",
    "main",
    "memory_verdict",
    "render",
    "run_checks",
    "store_scripts",
]
