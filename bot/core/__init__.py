"""The conversation core, the same on every platform: the runtime that takes messages in
(`runtime`), a burst's cycle from its window to its one reply (`cycle`, `steps`, `race`,
`watch`, `timers`), the lease and roles replicas share (`lease`, `roles`, `heartbeat`), a
lease given back once the store is back (`hand_backs`), the history a prompt is built from
(`history`), what a reply remembers of its person (`remembering`), who may be heard
(`admission`), groups (`groups`), typing (`typing_signals`) and settings reloaded (`reload`).
"""

__all__ = [
    "admission",
    "cycle",
    "groups",
    "hand_backs",
    "heartbeat",
    "history",
    "lease",
    "race",
    "reload",
    "remembering",
    "roles",
    "runtime",
    "steps",
    "timers",
    "typing_signals",
    "watch",
]
