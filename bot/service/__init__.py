"""The running service: the command line (`cli`), the composition root that builds a replica
and runs it (`app`), its logs (`logs`), /metrics (`metrics`), the supervisor of its loops
(`supervisor`) and systemd's notifications (`systemd`). The top floor: nothing imports it.
"""

__all__ = ["app", "cli", "logs", "metrics", "supervisor", "systemd"]
