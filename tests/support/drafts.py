"""Live drafts as the fake Telegram records them, and the settings that make them quick to see."""

from __future__ import annotations

from tests.support.fakes.telegram_server import (
    FakeTelegram,
    RecordedCall,
)

FAST_DRAFTS = {"LASTWORD_TELEGRAM__DRAFT_INTERVAL_MS": "200"}


# Drafting from the generation's start, as a fixed window has it; a speculative generation's
# drafts wait for its window (tests/e2e/test_speculation_e2e.py).
FIXED_WINDOW = {"LASTWORD_DEBOUNCE__SPECULATE_MS": "0"}


ANSWER = " ".join(f"word{i}" for i in range(60))


def drafts(telegram: FakeTelegram) -> list[RecordedCall]:
    return telegram.calls_to("sendMessageDraft")


def draft_text(call: RecordedCall) -> str:
    return str(call.params.get("text") or "")
