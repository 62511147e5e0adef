"""Operations: `lastword doctor` (`doctor`, with `check` for what a check reports),
`lastword status` (`status`) and the systemd unit files (`unit`, `unit_syntax`, `unit_root`).
Each reads the layers below; nothing on the message path imports it.
"""

__all__ = ["check", "doctor", "status", "unit", "unit_root", "unit_syntax"]
