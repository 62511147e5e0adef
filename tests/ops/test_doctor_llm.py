"""`lastword doctor`'s diagnosis of the model endpoint, against loopback fakes through the real
OpenAI client: a base URL without its API prefix is named as such (with the providers'
examples), not as an unknown model; the model is checked to take the configured tools (the
Python tools of tests/plugins, one of them with a `"format": "date-time"` some providers
refuse), each one it refuses named, and not checked past a failed LLM check (said on its line,
not as a ✗ of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from bot.llm.tool_refusals import NO_TOOLS_FIX, TOOL_FIX
from bot.ops.check import Check
from bot.ops.doctor import BASE_URL_EXAMPLES, NOT_CHECKED_TOOLS, Caution, exit_code, render
from bot.tools.python import PythonTool
from tests.support.doctor import (
    API_KEY,
    NAMES,
    assert_no_secret,
    by_name,
    closed_port,
    llm_settings,
    run_checks,
)
from tests.support.factories import SettingsFactory
from tests.support.fakes.loopback import LoopbackServer
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI

pytestmark = pytest.mark.timeout(20)

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


async def remind(when: str) -> str:
    """Set a reminder."""
    return f"reminded at {when}"


# Found through tests/plugins/dated's entry point.
REMIND = PythonTool(
    function=remind,
    parameters={
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date-time"}},
    },
    side_effects=True,
)


class NotFound(LoopbackServer):
    """A web server with no OpenAI-compatible API where it is asked: 404 to everything, as
    Ollama's root answers ("404 page not found"); or, with `model_404`, a chat-only server
    that answers a chat request for a model it does not serve with OpenAI's 404."""

    def __init__(self, model_404: bool = False) -> None:
        super().__init__()
        self.model_404 = model_404

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{path:.*}", self._answer)

    async def _answer(self, request: web.Request) -> web.Response:
        if self.model_404 and request.path.endswith("/chat/completions"):
            error = {
                "message": "The model `fake-model` does not exist",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
            return web.json_response({"error": error}, status=404)
        return web.Response(status=404, text="404 page not found")


async def test_a_base_url_without_v1_is_named_with_the_fix(
    make_settings: SettingsFactory, openai_fake: FakeOpenAI
) -> None:
    # The classic Ollama mistake: http://localhost:11434 for http://localhost:11434/v1.
    settings = make_settings(llm=llm_settings(openai_fake, base_url=openai_fake.origin))
    checks = await run_checks(settings)
    llm = by_name(checks)["llm"]
    assert not llm.ok
    assert "does not know model" not in llm.detail
    assert llm.detail == (
        f"{openai_fake.origin} answers 404 to /models and /chat/completions, and "
        f"{openai_fake.base_url} answers: the base URL lacks its API prefix /v1"
    )
    assert llm.fix.startswith(f"set LASTWORD_LLM__BASE_URL to {openai_fake.base_url} (")
    assert BASE_URL_EXAMPLES in llm.fix
    for example in (
        "https://api.openai.com/v1",
        "http://localhost:11434/v1",
        "http://localhost:1234/v1",
        "https://openrouter.ai/api/v1",
    ):
        assert example in llm.fix
    assert exit_code(checks) == 1
    assert_no_secret(render(checks))


async def test_a_base_url_with_no_api_at_all_is_named_too(make_settings: SettingsFactory) -> None:
    async with NotFound() as server:
        values = {"provider": "openai", "base_url": server.origin, "api_key": API_KEY}
        llm = by_name(await run_checks(make_settings(llm=values | {"model": FAKE_MODEL_ID})))["llm"]
    assert not llm.ok
    assert "does not know model" not in llm.detail
    assert "the base URL has no API prefix" in llm.detail
    assert "http://localhost:11434/v1" in llm.fix and "LASTWORD_LLM__BASE_URL" in llm.fix


async def test_a_base_url_whose_path_serves_nothing_names_the_path_or_the_model(
    make_settings: SettingsFactory,
) -> None:
    async with NotFound() as server:
        values = {"provider": "openai", "base_url": server.origin + "/api", "api_key": API_KEY}
        llm = by_name(await run_checks(make_settings(llm=values | {"model": FAKE_MODEL_ID})))["llm"]
    assert not llm.ok
    assert llm.detail.endswith("the base URL's path or the model is wrong")
    assert BASE_URL_EXAMPLES in llm.fix and "LASTWORD_LLM__MODEL" in llm.fix


async def test_a_404_that_speaks_of_the_model_names_the_model(
    make_settings: SettingsFactory,
) -> None:
    async with NotFound(model_404=True) as server:
        values = {"provider": "openai", "base_url": server.origin + "/v1", "api_key": API_KEY}
        llm = by_name(await run_checks(make_settings(llm=values | {"model": FAKE_MODEL_ID})))["llm"]
    assert not llm.ok
    assert llm.detail.endswith(f"does not know model {FAKE_MODEL_ID}")
    assert "LASTWORD_LLM__MODEL" in llm.fix


# -- the model and the tools ------------------------------------------------------------------


@pytest.fixture
def tools_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo tools (shout, remember_this) and `remind`, whose schema has a date-time."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(PLUGINS / "dated"))


def tools_check(checks: list[Check]) -> Check:
    assert [check.name for check in checks] == [*NAMES, "llm tools"], render(checks)
    return checks[-1]


async def test_a_model_that_takes_the_tools_passes(
    make_settings: SettingsFactory, openai_fake: FakeOpenAI, tools_installed: None
) -> None:
    checks = await run_checks(make_settings(llm=llm_settings(openai_fake)))
    assert tools_check(checks) == Check(
        "llm tools", True, f"model {FAKE_MODEL_ID} takes the 3 tools"
    )
    [request] = openai_fake.requests
    assert sorted(request.tool_names) == ["remember_this", "remind", "shout"]
    assert request.body["max_tokens"] == 1
    assert exit_code(checks) == 0


async def test_a_model_that_takes_no_tools_is_a_failure_with_the_fix(
    make_settings: SettingsFactory, openai_fake: FakeOpenAI, tools_installed: None
) -> None:
    openai_fake.refuse_tools = True
    checks = await run_checks(make_settings(llm=llm_settings(openai_fake)))
    found = tools_check(checks)
    assert not found.ok
    assert found.detail.startswith(f"model {FAKE_MODEL_ID} does not take tools (")
    assert "does not support tools" in found.detail
    assert found.fix == NO_TOOLS_FIX
    assert exit_code(checks) == 1


async def test_a_tool_the_model_refuses_is_named(
    make_settings: SettingsFactory, openai_fake: FakeOpenAI, tools_installed: None
) -> None:
    openai_fake.refuse_format = "date-time"
    checks = await run_checks(make_settings(llm=llm_settings(openai_fake)))
    found = tools_check(checks)
    assert not found.ok
    assert found.detail.startswith(f"model {FAKE_MODEL_ID} refuses tool remind (")
    assert "date-time" in found.detail and "shout" not in found.detail
    assert found.fix == TOOL_FIX
    # Asked again without it: the other two are taken.
    [request] = openai_fake.requests
    assert sorted(request.tool_names) == ["remember_this", "shout"]


async def test_the_tools_are_not_checked_past_a_failed_llm_check(
    make_settings: SettingsFactory, tools_installed: None
) -> None:
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    values = {"provider": "openai", "base_url": base_url, "api_key": API_KEY}
    checks = await run_checks(make_settings(llm=values))
    assert [check.name for check in checks] == NAMES
    llm = by_name(checks)["llm"]
    assert llm.detail == f"cannot connect to {base_url} ({NOT_CHECKED_TOOLS})"
    assert render(checks).count("✗") == 1


async def test_a_tools_check_the_provider_did_not_answer_is_a_warning(
    make_settings: SettingsFactory, openai_fake: FakeOpenAI, tools_installed: None
) -> None:
    openai_fake.fail_next(FakeOpenAI.server_error())
    checks = await run_checks(make_settings(llm=llm_settings(openai_fake)))
    found = tools_check(checks)
    assert isinstance(found, Caution) and found.ok
    assert found.detail.startswith(f"could not check whether model {FAKE_MODEL_ID} takes the tools")
    assert "500" in found.detail
    assert exit_code(checks) == 0
