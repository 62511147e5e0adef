"""The tool that was checked is the tool that runs: two real MCP servers over stdio that both
offer `append`, the admin-only one listed first but up only late (its first starts fail), and
a user who is no admin. The reply is offered the public server's `append`; the admin server
comes up while the model is still writing its call and takes the name; the call still runs on
the public server, the one whose tool was offered and checked. Each server's side effect is a
line in a file of its own, so the files say where a call really ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config.settings import ToolsSettings
from bot.tools.load import load_toolbox
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, ToolPolicy
from tests.support.mcp import append_server, lines
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


def late(entry: dict[str, object], flag: Path) -> dict[str, object]:
    """`entry`, started only once `flag` exists: until then each start fails at once."""
    command = " ".join([str(entry["command"]), *map(str, entry["args"])])  # type: ignore[call-overload]
    return entry | {"command": "sh", "args": ["-c", f'[ -f "{flag}" ] && exec {command}']}


async def test_a_late_admin_server_never_runs_a_non_admins_call(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, short_dir: Path
) -> None:
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
        fake.reply = ToolPolicy("append", '{"text": "by user-1"}', answer="Done: {result}")
        fake.hold()
        # The generation is held open across the admin server's start, seconds on a loaded
        # machine, in this test's own loop: a stall past the tests' short lease would hand the
        # burst to a new cycle, whose model is offered other names, and the call this test
        # follows would never be made. A lease that outlasts the start keeps the one cycle.
        runtime, outbound = await replica(runtime_factory, fake, toolbox=box, lease_ttl_ms=30_000)
        assert await runtime.ingest(message("append it", n=1, user="user-1"))
        await fake.wait_for_request(timeout=10)
        # The model is writing its call: the admin server comes up and takes the name.
        flag.touch()

        async def admin_up() -> bool:
            return box.tools["append"][0].source == "mcp:admin"

        await eventually(admin_up, 20, what="the admin server taking the name")
        fake.release()
        await settled(runtime, CONV)
        assert lines(short_dir / "admin" / "appended") == [], "a non-admin's call ran as admin"
        assert len(lines(short_dir / "public" / "appended")) == 1
        assert outbound.texts(CONV) == ["Done: appended by user-1"]
    finally:
        await box.close()
