"""The tool that was checked is the tool that runs: two real MCP servers over stdio that both
offer `append`, the admin-only one listed first but up only late (its first starts fail), and
a user who is no admin. The reply is offered the public server's `append`; the admin server
comes up while the model is still writing its call and takes the name; the call still runs on
the public server, the one whose tool was offered and checked. Each server's side effect is a
line in a file of its own, so the files say where a call really ran. A turn that resumes after
the admin server took the name shows the model its call under the public tool's new name, so
the booking is not asked for, and run, twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.config.settings import ToolsSettings
from bot.tools import Toolbox
from bot.tools.load import load_toolbox
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest, ToolCalls, ToolPolicy
from tests.support.mcp import append_server, lines
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


def late(entry: dict[str, object], flag: Path) -> dict[str, object]:
    """`entry`, started only once `flag` exists: until then each start fails at once."""
    command = " ".join([str(entry["command"]), *map(str, entry["args"])])  # type: ignore[call-overload]
    return entry | {"command": "sh", "args": ["-c", f'[ -f "{flag}" ] && exec {command}']}


@dataclass
class LateAdmin:
    """The toolbox of both servers, with the public one up, and the admin one's `flag`."""

    box: Toolbox
    flag: Path
    folder: Path

    def runs(self, server: str) -> list[str]:
        """The lines `server` ("admin", "public") appended: one per call that ran there."""
        return lines(self.folder / server / "appended")

    async def admin_takes_the_name(self) -> None:
        """Let the admin server start, and wait until it has taken the name `append`."""
        self.flag.touch()

        async def admin_up() -> bool:
            return self.box.tools["append"][0].source == "mcp:admin"

        await eventually(admin_up, 20, what="the admin server taking the name")


@asynccontextmanager
async def late_admin(short_dir: Path) -> AsyncIterator[LateAdmin]:
    flag = short_dir / "admin-may-start"
    admin = late(append_server(short_dir / "admin", adminOnly=True), flag)
    public = append_server(short_dir / "public")
    servers = {"mcp_servers": {"admin": admin, "public": public}, "start_timeout_s": 5}
    box = await load_toolbox(ToolsSettings.model_validate(servers))
    try:
        # The public server is up within the start timeout on a quiet machine, but a loaded
        # one may take longer to import the MCP SDK: it then joins once up, as in production.
        async def public_up() -> bool:
            return "append" in box.tools

        await eventually(public_up, 30, what="the public server listing its tools")
        assert box.tools["append"][0].source == "mcp:public"
        yield LateAdmin(box, flag, short_dir)
    finally:
        await box.close()


async def test_a_late_admin_server_never_runs_a_non_admins_call(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, short_dir: Path
) -> None:
    async with late_admin(short_dir) as servers:
        fake.reply = ToolPolicy("append", '{"text": "by user-1"}', answer="Done: {result}")
        fake.hold()
        # The generation is held open across the admin server's start, seconds on a loaded
        # machine, in this test's own loop: a stall past the tests' short lease would hand the
        # burst to a new cycle, whose model is offered other names, and the call this test
        # follows would never be made. A lease that outlasts the start keeps the one cycle.
        runtime, outbound = await replica(
            runtime_factory, fake, toolbox=servers.box, lease_ttl_ms=30_000
        )
        assert await runtime.ingest(message("append it", n=1, user="user-1"))
        await fake.wait_for_request(timeout=10)
        # The model is writing its call: the admin server comes up and takes the name.
        await servers.admin_takes_the_name()
        fake.release()
        await settled(runtime, CONV)
        assert servers.runs("admin") == [], "a non-admin's call ran as admin"
        assert len(servers.runs("public")) == 1
        assert outbound.texts(CONV) == ["Done: appended by user-1"]


async def test_a_resumed_turn_shows_a_call_under_the_name_its_tool_bears_now(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, short_dir: Path
) -> None:
    """A call ran on the public server as `append`; the admin server then took that name, and
    a newer message interrupted the turn before its reply. The next generation resumes from the
    turn's record, and shows the model the call as `public_append`, the name the tool it ran
    on bears now: shown as `append`, a name this user is no longer offered, the call would
    look never made, and a model asking for its booking again would book twice."""
    async with late_admin(short_dir) as servers:

        def books(request: RecordedRequest) -> str | ToolCalls:
            """A model that books once a turn with whichever name the booking tool has."""
            name = "public_append" if "public_append" in request.tool_names else "append"
            return ToolPolicy(name, '{"text": "by user-1"}', answer="Done: {result}")(request)

        fake.reply = books
        fake.hold()
        runtime, outbound = await replica(
            runtime_factory, fake, toolbox=servers.box, lease_ttl_ms=30_000
        )
        assert await runtime.ingest(message("book it", n=1, user="user-1"))
        first = await fake.wait_for_request(timeout=10)
        assert "append" in first.tool_names
        # The call goes out and runs; the request that follows it is held.
        fake.release()
        fake.hold()

        async def booked() -> bool:
            return len(servers.runs("public")) == 1

        await eventually(booked, 20, what="the call running on the public server")
        await fake.wait_for_request(lambda r: bool(r.tool_results()), timeout=10)
        await servers.admin_takes_the_name()
        # A newer message: the turn's next generation resumes from its record.
        assert await runtime.ingest(message("for two", n=2, user="user-1"))
        resumed = await fake.wait_for_request(lambda r: "public_append" in r.tool_names)
        fake.release()
        await settled(runtime, CONV)
        assert servers.runs("admin") == [], "a non-admin's call ran as admin"
        assert len(servers.runs("public")) == 1, "the booking ran twice"
        assert outbound.texts(CONV) == ["Done: appended by user-1"]
        assert [[c.name for c in step] for step in resumed.tool_steps()] == [["public_append"]]
