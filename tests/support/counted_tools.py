"""Tools whose runs a test counts, for the tools tests in process."""

from __future__ import annotations

import asyncio

from bot.tools import Toolbox
from bot.tools.python import PythonRunner, PythonTool

TEXT = {"type": "object", "properties": {"text": {"type": "string"}}}


SLOW_S = 0.8


class Counted:
    """Tools whose runs the test counts: `echo` (looks), `book` (admin-only, changes
    things), `broken` (raises)."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def toolbox(self) -> Toolbox:
        box = Toolbox()
        declared = (
            PythonTool(function=self.echo, parameters=TEXT, side_effects=False),
            PythonTool(function=self.book, parameters=TEXT, side_effects=True, admin_only=True),
            PythonTool(function=self.broken, parameters=TEXT, side_effects=False),
            PythonTool(function=self.slow, parameters=TEXT, side_effects=False),
            PythonTool(function=self.note, parameters=TEXT, side_effects=True),
            PythonTool(function=self.big, parameters=TEXT, side_effects=False),
        )
        box.offer([[(tool.tool("python:test"), PythonRunner(tool)) for tool in declared]])
        return box

    async def big(self, text: str) -> str:
        """A page of text: 4,000 characters, the most a result may be by default."""
        self.runs.append(f"big {text}")
        return text * 4000

    async def note(self, text: str) -> str:
        """Write a note down (a side effect anyone may ask for)."""
        self.runs.append(f"note {text}")
        return "noted"

    async def echo(self, text: str) -> str:
        """Say the text back."""
        self.runs.append(f"echo {text}")
        return f"echo: {text}"

    async def book(self, text: str) -> str:
        """Book a table."""
        self.runs.append(f"book {text}")
        return "booked"

    async def slow(self, text: str) -> str:
        """Takes its time."""
        self.runs.append(f"slow {text}")
        await asyncio.sleep(SLOW_S)
        return f"slow: {text}"

    async def broken(self, text: str) -> str:
        """Always fails."""
        self.runs.append(f"broken {text}")
        raise ValueError("the database is on fire")
