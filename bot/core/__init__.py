"""The conversation core, the same on every platform: the runtime that takes messages in
(`runtime`), a burst's cycle from its window to its one reply (`cycle`, `steps`, `race`,
`watch`, `timers`), the lease and roles replicas share (`lease`, `roles`, `heartbeat`), the
history a prompt is built from (`history`), groups (`groups`) and typing (`typing_signals`).
"""

__all__ = [
    "cycle",
    "groups",
    "heartbeat",
    "history",
    "lease",
    "race",
    "roles",
    "runtime",
    "steps",
    "timers",
    "typing_signals",
    "watch",
]
