"""The window settings that make `lastword run` speculate in the end-to-end tests."""

from __future__ import annotations

QUIET_MS = 1500


SPECULATE_MS = 200


SPECULATION = {
    "LASTWORD_DEBOUNCE__QUIET_MS": str(QUIET_MS),
    "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "6000",
    "LASTWORD_DEBOUNCE__SPECULATE_MS": str(SPECULATE_MS),
}
