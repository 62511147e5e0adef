"""Settings: one typed tree, read from the environment, credentials, `.env`, a TOML file and
defaults.

Priority, highest first: environment (`LASTWORD_` prefix, `__` for nesting), then systemd
credentials, then `.env`, then the TOML file (`$LASTWORD_CONFIG`, else `./lastword.toml` when
present), then OPENAI_API_KEY and OPENAI_BASE_URL (read from the environment, credentials and
`.env` alike), then the defaults below. A mapping (MCP servers, headers) is taken whole from
the highest source that gives it, never merged. Every error names the variable or key and where
it was given. The environment names are a contract with operators (see SPEC), so the field
names here must not change.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache, partial
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar
from urllib.parse import urlparse, urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    SerializeAsAny,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from bot.config import spelling
from bot.config.redis_url import parse_sentinel
from bot.log_lines import LogStyle
from bot.masking import MASK, masked_url, redact, store_url
from bot.plugins import entry_points
from bot.tokens import estimate

ENV_PREFIX = "LASTWORD_"
# The entry point group platforms register in (see adapters/__init__.py).
PLATFORMS = "lastword.adapters"


class ConfigError(ValueError):
    """A setting is wrong; the message names the setting so an operator can fix it."""


# A platform's own settings model, as its plug-in declares it.
PlatformModel = TypeVar("PlatformModel", bound=BaseModel)
# A platform's section of the settings as given (`LASTWORD_<PLATFORM>__*`, `[<platform>]`),
# replaced by its platform's model once validated, when that platform is the chosen one.
RawSection = dict[str, Any] | SerializeAsAny[BaseModel]


def _comma_separated(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# A list given in the environment as "a,b,c" (JSON works too, in a TOML file as a list).
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)]


def _no_blanks(values: list[str]) -> list[str]:
    # Ids and model patterns never hold spaces: one is two values missing a comma.
    for value in values:
        if any(char.isspace() for char in value):
            raise ValueError("expected comma-separated values without spaces")
    return values


# A comma-separated list of ids or patterns.
Names = Annotated[CommaList, AfterValidator(_no_blanks)]


def _web_url(
    value: str | None, schemes: tuple[str, ...] = ("http", "https"), *, credentials: bool = False
) -> str | None:
    if value is None or value == "":
        return None
    parts = urlparse(value)
    if parts.scheme not in schemes or not parts.hostname:
        wanted = " or ".join(f"{scheme}://" for scheme in schemes)
        raise ValueError(f"expected a URL starting with {wanted} and naming a host")
    if "@" in parts.netloc and not credentials:
        # The clients send their own Authorization header (the key, the token), and aiohttp
        # refuses to combine it with a URL's: every request would fail, not the start.
        raise ValueError(
            "expected a URL without a user or password in it: the credential has its own setting"
        )
    return value


def _listen_address(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    _host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected host:port, such as 127.0.0.1:9464")
    return value


# How the docs write a key or token to fill in (`sk-…`, `123456:ABC…`, `sk-...`): no real
# credential holds an ellipsis.
PLACEHOLDER = re.compile(r"…|\.\.\.")


def _secret_text(value: SecretStr | None) -> SecretStr | None:
    """`value` without the blanks around it, refused when it cannot be a credential: such a
    key or token would only fail at the first request, as an error that names a header or
    an encoding rather than the setting. No message quotes any of it."""
    if value is None:
        return None
    text = value.get_secret_value().strip()
    # A pasted key with a space or a newline inside.
    if any(c.isspace() for c in text):
        raise ValueError("expected one word without spaces or line breaks")
    if PLACEHOLDER.search(text):
        raise ValueError(
            "this is the README's placeholder (as in sk-… or 123456:ABC…), not a key or token: "
            "set your own"
        )
    if not text.isascii():
        # An HTTP header carries ASCII only: the client would fail at every request.
        at = next(i for i, c in enumerate(text) if not c.isascii()) + 1
        raise ValueError(
            f"character {at} is not ASCII, which no key or token holds (a typographic quote or "
            "dash picked up on the way?): paste it again"
        )
    return SecretStr(text) if text != value.get_secret_value() else value


def _ascii_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers an HTTP client can send: each value ASCII (the error names the header, never
    its value: it may be a credential)."""
    for name, value in headers.items():
        if not value.isascii():
            raise ValueError(
                f"the value of the header {name!r} is not ASCII, which no HTTP header carries"
            )
    return headers


def _required_secret(value: SecretStr) -> SecretStr:
    """A platform's token: `_secret_text`, and never empty (`LASTWORD_DISCORD__TOKEN=` left
    blank would be tried, and refused, at every retry)."""
    checked = _secret_text(value)
    if checked is None or not checked.get_secret_value():
        raise ValueError("expected the token, not an empty value")
    return checked


WebUrl = Annotated[str, AfterValidator(_web_url)]
# HTTP headers to send, as a JSON object of names and values.
Headers = Annotated[dict[str, str], AfterValidator(_ascii_headers)]
OptionalWebUrl = Annotated[str | None, AfterValidator(_web_url)]
# An MCP server's URL may carry basic auth: its client sends no credential of its own.
CredentialedWebUrl = Annotated[str | None, AfterValidator(partial(_web_url, credentials=True))]
ListenAddress = Annotated[str, AfterValidator(_listen_address)]
OptionalListenAddress = Annotated[str | None, AfterValidator(_listen_address)]
WebSocketUrl = Annotated[str, AfterValidator(partial(_web_url, schemes=("ws", "wss")))]
Secret = Annotated[SecretStr | None, AfterValidator(_secret_text)]
# A secret a platform cannot start without (its token): required when that platform is chosen.
RequiredSecret = Annotated[SecretStr, AfterValidator(_required_secret)]
# A model id: what the provider calls it, never blank.
ModelId = Annotated[str, Field(min_length=1, pattern=r"^\S+$")]


def _default_data_dir() -> Path:
    """`$STATE_DIRECTORY` under systemd (the unit's StateDirectory=), else
    `$XDG_STATE_HOME/lastword` (`~/.local/state/lastword`).

    Computed where lastword runs, so help and the docs show this text, not the value."""
    # Under systemd, StateDirectory= is the one writable place (ProtectSystem=strict).
    systemd_state = os.environ.get("STATE_DIRECTORY")
    if systemd_state:
        return Path(systemd_state.split(":", 1)[0])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "lastword"


def _default_replica_id() -> str:
    """`<hostname>-<pid>` of the process.

    Computed where lastword runs, so help and the docs show this text, not the value."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Group(BaseModel):
    """A group of settings. No number in it may be infinite or NaN: `inf` passes every lower
    bound, then overflows where it is used (a timeout of `inf` seconds at every request)."""

    model_config = ConfigDict(allow_inf_nan=False)


def _finite(value: object) -> object:
    """`value`, refused if a number anywhere in it is infinite or NaN: Python's JSON reader
    and TOML both read them, and no request can carry one."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("expected finite numbers only (NaN and Infinity are no JSON numbers)")
    inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in inner:
        _finite(item)
    return value


class ModelChoice(Group):
    """A model users may pick with /model."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,32}$")  # what users type and see
    model: ModelId  # the provider's model id
    # How much one of its tokens counts against a user's daily budget (a dearer model, more).
    cost: float = Field(default=1.0, gt=0, le=1000)


class LLMSettings(Group):
    # None means "not configured": openai when a base URL or key is given, else echo.
    provider: Literal["openai", "echo"] | None = Field(
        default=None,
        description=(
            "`openai` or `echo`; unset means `openai` if a base URL or key is set, else `echo`"
        ),
    )
    # Unset here, OPENAI_BASE_URL and OPENAI_API_KEY are used, as every OpenAI client does.
    base_url: OptionalWebUrl = Field(
        default=None,
        description=(
            "an OpenAI-compatible endpoint (OpenAI, Ollama, vLLM, LM Studio…), `http://` "
            "or `https://` (unset: `OPENAI_BASE_URL` if set)"
        ),
    )
    api_key: Secret = Field(
        default=None,
        description=(
            "the endpoint's key; never logged; `lastword doctor` says which variable it came from "
            "(unset: `OPENAI_API_KEY` if set)"
        ),
    )
    model: ModelId = Field(default="gpt-4o-mini", description="the provider's id of the model")
    # {date} and {time} become the current UTC date and time when each prompt is built.
    system_prompt: str = Field(
        default=(
            "You are a helpful assistant in a direct-message chat. Be concise. Today is {date}."
        ),
        description="the system prompt; `{date}` and `{time}` are filled in (UTC)",
    )
    timeout_s: float = Field(default=60.0, gt=0, description="per-request timeout")
    # Attempts after the first for transient failures, with jittered exponential backoff.
    retries: int = Field(
        default=3, ge=0, description="retries of a transient failure before apologising"
    )
    retry_base_s: float = Field(
        default=0.5, ge=0, description="first backoff; doubles each retry, jittered"
    )
    # The echo model's artificial thinking time; lets demos and tests see a generation in flight.
    echo_delay_ms: int = Field(
        default=0, ge=0, description="the echo model's thinking time, for demos"
    )
    # The echo model streams its answer a word at a time, this far apart, so the live draft
    # shows offline too (0: all at once).
    echo_word_ms: int = Field(
        default=40,
        ge=0,
        le=2000,
        description=(
            "the echo model streams its answer a word at a time, this far apart, so the "
            "live draft shows offline (`0`: at once)"
        ),
    )
    # Every attempt and backoff for one reply together end by this deadline, then apologise.
    deadline_s: float = Field(
        default=120.0,
        gt=0,
        description="every attempt and wait for one reply ends by then; then the apology",
    )
    # Cycles in a row whose reply could not be written (an error other than the provider's
    # own: a file, a command, a bug) before the burst is answered with an apology that says
    # so, committed like any reply, so that no input can silence a conversation for good.
    attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description=(
            "cycles in a row whose reply could not be written (any error but an outage of"
            " Redis or the platform) before the burst is answered with an apology that "
            "says what failed"
        ),
    )
    # Stream the completion, so a cancelled generation stops costing tokens at once.
    stream: bool = Field(
        default=True, description="stream completions, so an interrupt stops generation at once"
    )
    # Cancel a generation as soon as a newer message arrives, then wait for the window again.
    interrupt: bool = Field(
        default=True, description="cancel a generation when a newer message arrives"
    )
    # How often a generating replica looks for a newer message: one pipelined read of all
    # its generating conversations' versions. At 100 tokens/s, 50 ms is about 5 tokens.
    interrupt_poll_ms: int = Field(
        default=50,
        ge=10,
        le=250,
        description="how often a generating replica looks for a newer message, to interrupt",
    )
    # The model's context window in tokens: system prompt, history and the unanswered
    # messages must fit in it, with `max_tokens` left for the reply.
    context_tokens: int = Field(
        default=16_000, ge=256, description="the model's context window: prompt plus reply"
    )
    # The longest reply asked for; also the room kept free for it in the context.
    max_tokens: int = Field(
        default=1024, ge=16, description="longest reply asked for; kept free in the context"
    )
    temperature: float | None = Field(
        default=None, ge=0, le=2, description="sampling temperature; unset: the provider's default"
    )
    # Provider quirks: sent with every request (for example {"HTTP-Referer": "..."}, or
    # {"top_k": 40} for a server that takes it). JSON in the environment.
    extra_headers: Headers = Field(
        default_factory=dict,
        description=(
            "HTTP headers sent with every request, as a JSON object (e.g. OpenRouter's "
            "`HTTP-Referer`); every value is kept out of logs and errors, as a credential"
            " may be one"
        ),
    )
    extra_body: Annotated[dict[str, Any], AfterValidator(_finite)] = Field(
        default_factory=dict,
        description=(
            "fields added to every request's JSON body, for a provider's own options "
            '(e.g. `{"top_k": 40}`)'
        ),
    )
    # Tokens (prompt + completion) one user may spend per UTC day, across replicas; 0: no limit.
    daily_tokens_per_user: int = Field(
        default=0,
        ge=0,
        description=(
            "weighted tokens per person per UTC day, across replicas and every place they"
            " write in (their DM, every group and topic: one budget); each token times "
            "its model's `cost`, equal to tokens when every cost is 1"
        ),
    )
    # The longest /persona a user may set, in characters (their instructions, added to the
    # system prompt of their conversation); 0 turns /persona off.
    persona_chars: int = Field(
        default=1000,
        ge=0,
        le=10_000,
        description="the longest `/persona` a user may set; `0` turns the command off",
    )
    # Models users may pick with /model (JSON in the environment: [{"name": "smart",
    # "model": "gpt-4o", "cost": 10}, ...]); empty: everyone gets `model`.
    models: list[ModelChoice] = Field(
        default_factory=list,
        description=(
            'models users may pick with `/model`, JSON: `[{"name": "smart", "model": '
            '"gpt-4o", "cost": 10}]` (cost: how much each token counts against the daily '
            "budget)"
        ),
    )

    @model_validator(mode="after")
    def _room_for_the_prompt(self) -> LLMSettings:
        if self.max_tokens >= self.context_tokens // 2:
            raise ValueError(
                f"{ENV_PREFIX}LLM__MAX_TOKENS ({self.max_tokens}) must be less than half of "
                f"{ENV_PREFIX}LLM__CONTEXT_TOKENS ({self.context_tokens})"
            )
        # Half the context at most, so history and the new messages still fit beside it.
        prompt_tokens = estimate(self.system_prompt)
        if prompt_tokens > self.context_tokens // 2:
            raise ValueError(
                f"{ENV_PREFIX}LLM__SYSTEM_PROMPT: about {prompt_tokens} tokens, expected at most "
                f"half of {ENV_PREFIX}LLM__CONTEXT_TOKENS ({self.context_tokens})"
            )
        return self


class MediaSettings(Group):
    """Photos, files and voice notes folded into the turn (bot/llm/media.py)."""

    # Whether the model is shown images: auto (when llm.model matches one of vision_models),
    # on, off. A model that cannot see them is told what was sent instead.
    vision: Literal["auto", "on", "off"] = Field(
        default="auto", description="show images to the model: `auto`, `on`, `off`"
    )
    # Models that read images, as shell patterns matched against llm.model (comma-separated).
    # A setting, not a list in the code, so a new model needs no release.
    vision_models: Names = Field(
        default=[
            "gpt-4o*",
            "gpt-4.1*",
            "gpt-5*",
            "o3*",
            "o4*",
            "*claude*",
            "*gemini*",
            "*vision*",
            "*-vl*",
            "*llava*",
            "*pixtral*",
        ],
        description="models that read images (shell patterns, comma-separated), for `auto`",
    )
    # Images are scaled down to this longest edge and re-encoded as JPEG before they are sent
    # (1,568 px: the largest that vision models take without scaling down again themselves).
    max_edge_px: int = Field(
        default=1568,
        ge=64,
        le=8192,
        description="images are scaled to this longest edge and re-encoded",
    )
    jpeg_quality: int = Field(
        default=85,
        ge=30,
        le=95,
        description="the JPEG quality images are re-encoded at: lower is smaller and blurrier",
    )
    # Pixels an image may have once decoded (a JPEG is decoded at 1/2..1/8 of its size when
    # that still covers max_edge_px): past this it is refused before it is decoded. 24 MP is
    # a 6000x4000 photo or a long screenshot; a vision model is shown 1568 px at most anyway,
    # and a PNG of a few hundred kB can claim far more (each pixel costs 4 bytes decoded).
    max_image_pixels: int = Field(
        default=24_000_000,
        ge=1_000_000,
        le=100_000_000,
        description="pixels an image may decode to; larger ones are refused unread",
    )
    # PDF text and image encoding run in worker processes of the replica's own: this many at
    # once (the rest wait), each try killed past work_timeout_s (tried once more in a fresh
    # worker, then the file becomes a note), each worker within worker_memory_mb of address
    # space. workers needs a restart.
    workers: int = Field(
        default=2,
        ge=1,
        le=16,
        description="worker processes reading PDFs and images, per replica (restart to change)",
    )
    work_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "time for one try at reading a file; past it the worker is killed and the job"
            " tried once more in a fresh worker, then the file noted (not remembered)"
        ),
    )
    worker_memory_mb: int = Field(
        default=1024, ge=256, le=16384, description="address space of each worker"
    )
    # Bounds on what is fetched: per file (Telegram's bots may fetch up to 20 MB), files per
    # burst (later ones are noted, not read) and bytes per burst.
    max_file_bytes: int = Field(default=20 * 1024 * 1024, ge=1024, description="bytes per file")
    max_files: int = Field(
        default=10, ge=0, description="files read per burst; later ones are noted, not read"
    )
    max_burst_bytes: int = Field(default=50 * 1024 * 1024, ge=1024, description="bytes per burst")
    # Characters of a text file's or a PDF's text the model is shown; the rest is cut, noted.
    max_document_chars: int = Field(
        default=20_000, ge=100, description="characters of a file's, a PDF's or a transcript's text"
    )
    # One fetch, and one transcription, may take this long.
    fetch_timeout_s: float = Field(
        default=30.0, gt=0, description="time for one download of a user's file"
    )
    transcription_timeout_s: float = Field(
        default=60.0, gt=0, description="time for one transcription of a voice note or audio file"
    )
    # Voice notes and audio go to an OpenAI-compatible /audio/transcriptions endpoint: the
    # LLM's base URL and key unless these are set (a self-hosted Whisper server, say). Empty
    # model: voice is not transcribed, and the model is told a voice note came.
    transcription_model: Annotated[str, Field(pattern=r"^\S*$")] = Field(
        default="whisper-1", description="the speech-to-text model; empty: voice is not transcribed"
    )
    transcription_base_url: OptionalWebUrl = Field(
        default=None,
        description=(
            "another OpenAI-compatible endpoint for speech (unset: the LLM's); the key is"
            " never logged. The LLM's key goes with transcriptions only to the LLM's own "
            "origin (scheme, host and port): a transcription server elsewhere without a "
            "key of its own is sent none, and a warning at start says so"
        ),
    )
    transcription_api_key: Secret = Field(
        default=None,
        description=(
            "the key of `LASTWORD_MEDIA__TRANSCRIPTION_BASE_URL` (unset: the LLM's, sent "
            "only to the LLM's own origin); never logged"
        ),
    )


class DebounceSettings(Group):
    quiet_ms: int = Field(
        default=2000,
        ge=0,
        description="the window closes after this much quiet from the user (or at the cap)",
    )
    max_wait_ms: int = Field(
        default=8000,
        ge=0,
        description="the cap: the window closes this long after it opened at the latest",
    )
    # Speculation: once the user has been quiet this long, start generating although the
    # window is still open; the reply is held until the window closes on the server's clock,
    # and a newer message cancels it as any interrupt does. 0, or not below the quiet window
    # (learned or not): off, the generation starts when the window closes.
    speculate_ms: int = Field(
        default=400,
        ge=0,
        description=(
            "start generating once the user has been quiet this long, with the window "
            "still open; the reply waits for the window to close, and a newer message "
            "cancels it ([speculation](design.md#how-a-burst-becomes-one-reply)); needs "
            "`LASTWORD_LLM__INTERRUPT`; `0` turns it off"
        ),
    )
    # The quiet window learns the user: `floor_ms` for one whose last 16 messages had no
    # follow-up within `quiet_ms`, `quiet_ms` for anyone who followed up even once;
    # `max_wait_ms` caps it as always.
    learn: bool = Field(
        default=True,
        description=(
            "let the quiet window learn each user: `…__FLOOR_MS` for one whose last 16 "
            "messages had no follow-up, `…__QUIET_MS` for anyone who follows up"
        ),
    )
    floor_ms: int = Field(default=600, ge=0, description="the shortest window learning may reach")
    # Where the platform reports a user typing (Discord DMs, the console on a terminal), each
    # typing signal holds the window open this long (Discord's signal lasts about 10 s), until
    # the next message, and never past `max_wait_ms`; the window after a message is then the
    # floor from the first message on. 0: typing is ignored.
    typing_ms: int = Field(
        default=10_000,
        ge=0,
        description=(
            "Where the platform reports a user typing (Discord DMs, the console on a "
            "terminal), each typing signal holds the window open this long (Discord's "
            "signal lasts about 10 s), until the next message, and never past "
            "`max_wait_ms`; the window after a message is then the floor from the first "
            "message on. 0: typing is ignored."
        ),
    )

    @model_validator(mode="after")
    def _cap_covers_quiet(self) -> DebounceSettings:
        if self.max_wait_ms < self.quiet_ms:
            raise ValueError(
                f"{ENV_PREFIX}DEBOUNCE__MAX_WAIT_MS ({self.max_wait_ms}) must be at least "
                f"{ENV_PREFIX}DEBOUNCE__QUIET_MS ({self.quiet_ms})"
            )
        return self


class LeaseSettings(Group):
    ttl_ms: int = Field(
        default=30000, ge=300, description="lease lifetime; renewed every third of it"
    )


class ToolRule(Group):
    """What the configuration says of one tool, over what the tool says of itself."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    side_effects: bool | None = Field(default=None, alias="sideEffects")
    admin_only: bool | None = Field(default=None, alias="adminOnly")


class McpServer(Group):
    """One entry of `LASTWORD_TOOLS__MCP_SERVERS`, in the `mcpServers` shape MCP clients share
    (Claude Desktop, Cursor, VS Code): a command to start over stdio, or the URL of a server
    that speaks streamable HTTP. The camelCase keys are lastword's own additions."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: CredentialedWebUrl = None
    headers: Headers = Field(default_factory=dict)
    # Some clients name the transport; it follows from `command` or `url` all the same.
    type: Literal["stdio", "http", "streamable-http", "streamableHttp"] | None = None
    # Whether this server's tools change anything, overriding their `readOnlyHint` (None: the
    # hint decides, and a tool without one is taken to have side effects).
    side_effects: bool | None = Field(default=None, alias="sideEffects")
    # Only admins are offered this server's tools.
    admin_only: bool = Field(default=False, alias="adminOnly")
    # Per tool: {"<tool>": {"sideEffects": false, "adminOnly": true}}.
    tools: dict[str, ToolRule] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError('expected either "command" (stdio) or "url" (streamable HTTP)')
        return self


def _servers(value: object) -> object:
    # A whole MCP client configuration file pasted as it is: `{"mcpServers": {...}}`.
    if isinstance(value, dict) and set(value) == {"mcpServers"}:
        return value["mcpServers"]
    return value


class ToolsSettings(Group):
    # MCP servers, started once per replica: name -> McpServer.
    mcp_servers: Annotated[dict[str, McpServer], BeforeValidator(_servers)] = Field(
        default_factory=dict,
        description=(
            "MCP servers, in the `mcpServers` shape (see [Tools](tools.md)); a whole "
            '`{"mcpServers": …}` object is accepted too'
        ),
    )
    # Model steps in one reply that may call tools; the step after the last is asked for text.
    step_limit: int = Field(
        default=5, ge=1, le=50, description="model steps of one reply that may call tools"
    )
    # One call, from asking the tool to its result; past it, the model is told it timed out.
    call_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="one call, from asking the tool to its result"
    )
    # A result longer than this is cut, with a note saying so, before the model sees it.
    output_chars: int = Field(
        default=4000,
        ge=100,
        le=100_000,
        description="a result longer than this is cut, with a note",
    )
    # Starting an MCP server and listing its tools.
    start_timeout_s: float = Field(
        default=20.0, gt=0, le=300, description="starting an MCP server and listing its tools"
    )
    # One message from an MCP server over stdio (a line of JSON), in bytes: a server that
    # writes a longer one is stopped and started again, and the call it answered is an error.
    # Parsing a message holds the replica's loop up for about 5 ms a MiB, hence the maximum.
    max_message_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        le=8 * 1024 * 1024,
        description=(
            "one message from an MCP server (a line over stdio, a JSON answer or an event"
            " over HTTP); a longer one makes its call an error (a stdio server is also"
            " stopped and restarted)"
        ),
    )


# Where a memory provider declares its factory (bot/memory/__init__.py, which reads it).
MEMORY_PROVIDERS = "lastword.memory"


def installed(kind: str, value: str, names: set[str]) -> str:
    """`value` if it names one of the installed `names` (of a `kind` of plug-in), else a
    ValueError that lists them."""
    if value not in names:
        raise ValueError(
            f"no {kind} {value!r} is installed (installed: {', '.join(sorted(names))})"
        )
    return value


class TracesSettings(Group):
    # OpenTelemetry traces, one per burst across replicas (bot/traces/); where they go and how
    # they are sampled are the standard OTEL_* variables'.
    enabled: bool = Field(
        default=False,
        description=(
            "record one trace per burst and export it over OTLP (needs the `otel` extra; "
            "`OTEL_EXPORTER_OTLP_ENDPOINT` and the other `OTEL_*` variables say where and how); "
            "see [Traces](operating.md#traces)"
        ),
    )


class MemorySettings(Group):
    # Long-term memory per person (bot/memory/): facts they shared, kept across places,
    # replicas and /reset, shown only in requests that answer them.
    enabled: bool = Field(
        default=True,
        description=(
            "facts each person shares are kept and shown to the model in their requests; "
            "see [Memory](memory.md)"
        ),
    )
    facts: int = Field(default=50, ge=1, le=1000, description="the most facts kept per person")
    fact_chars: int = Field(
        default=300, ge=20, le=4000, description="the longest fact, in characters"
    )
    # The built-in one keeps facts in the store; another is a package's entry point in the
    # `lastword.memory` group (bot/memory/__init__.py).
    provider: str = Field(
        default="redis",
        description=(
            "where facts are kept: `redis` (built in: the store) or an installed provider "
            "(see [Memory](memory.md#another-provider))"
        ),
    )

    @field_validator("provider")
    @classmethod
    def _provider_installed(cls, value: str) -> str:
        # Entry points are package metadata: checking them imports no provider.
        names = {"redis", *(entry.name for entry in entry_points(group=MEMORY_PROVIDERS))}
        return installed("memory provider", value, names)


class OutboundSettings(Group):
    # How the platform's limits on what the bot sends are kept (bot/outbound/pacing.py): shared, one
    # budget every replica draws on, in the store; replica, each replica's own (as if it ran
    # alone: several replicas together may then break the limits); off, none kept (429s are
    # only waited out). The limits themselves are the platform's settings.
    budget: Literal["shared", "replica", "off"] = Field(
        default="shared",
        description=(
            "how the platform's limits on what the bot sends are kept: `shared`, one "
            "budget every replica draws on, in the store; `replica`, each replica's own "
            "(together they may break the limits); `off`, none (429s are only waited "
            "out). See [operating.md](operating.md#outbound-limits)"
        ),
    )
    # A reply still waiting for its turn this long after it was written (the platform holding
    # the bot after a 429, for hours) is dropped, with one log line, rather than sent that
    # late; a newer message from the user is answered as usual. 0: never dropped.
    max_reply_age_s: float = Field(
        default=86_400.0,
        ge=0,
        description=(
            "a reply still waiting for its turn this long after it was written (the "
            "platform holding the bot after a 429) is dropped, with one log line, rather "
            "than sent that late; `0`: never. See [operating.md](operating.md#outbound-"
            "limits)"
        ),
    )


# What the settings say of a user: an admin (always let in, whatever was changed in chat), or
# let in or refused by the allow-list. Admins' /allow and /deny, kept in the store, override
# the last two.
Verdict = Literal["admin", "allowed", "refused"]


class AccessSettings(Group):
    # Platform user ids allowed to talk to the bot (comma-separated); empty: everyone. The
    # starting point: admins change it in chat with /allow and /deny.
    allowed_users: Names = Field(
        default=[],
        description=(
            "comma-separated platform user ids allowed to talk to the bot; others get one"
            " polite refusal a day and never reach the model; admins change it in chat "
            "(`/allow`, `/deny`) (empty: everyone)"
        ),
    )
    # Platform user ids that may use /allow, /deny, /budget and /stats in a DM.
    admins: Names = Field(
        default=[],
        description=(
            "comma-separated platform user ids that may use `/allow`, `/deny`, `/budget` "
            "and `/stats` in a DM; always let in (empty: none)"
        ),
    )
    # Messages one user may send per minute; more are dropped with one notice. 0: no limit.
    rate_per_minute: int = Field(
        default=30,
        ge=0,
        description=(
            "messages per person per minute, counted in Redis across replicas and every "
            "place they write in (their DM, every group and topic); more are dropped with"
            " one notice (`0`: no limit)"
        ),
    )


class GroupsSettings(Group):
    # The groups the bot answers in: platform group ids (Telegram's negative chat ids; a
    # Discord channel or thread id), comma-separated, or * for every group it is added to.
    # Empty: none (DMs only). Admins also /allow or /deny a group from inside it.
    allowed: Names = Field(
        default=[],
        description=(
            "The groups the bot answers in: platform group ids (Telegram's negative chat "
            "ids; a Discord channel or thread id), comma-separated, or * for every group "
            "it is added to. Empty: none (DMs only). Admins also /allow or /deny a group "
            "from inside it."
        ),
    )
    # Words that address the bot in a group as a mention does (whole words, any case).
    wake_words: Names = Field(
        default=[],
        description=(
            "Words that address the bot in a group as a mention does (whole words, any case)."
        ),
    )
    # Messages said in a group's room (topic) to others, kept as the model's context: at most
    # this many. 0: none kept. The prompt shows the newest that fit in a quarter of its budget
    # (bot.llm.prompt.ROOM_SHARE); the bounds keep the whole room, read at every reply, within a
    # quarter of a large model's context (100 x 1,000 characters: 25,000 tokens of English).
    context_messages: int = Field(
        default=30,
        ge=0,
        le=100,
        description=(
            "Messages said in a group's room (topic) to others, kept as the model's "
            "context: at most this many, each cut to context_chars, none older than "
            "context_minutes. 0: none kept. A request shows the newest of them that fit "
            "in a quarter of its prompt budget, after the person's own history."
        ),
    )
    # Each message in a room's context is cut to this many characters.
    context_chars: int = Field(
        default=500,
        ge=50,
        le=1000,
        description="Each message in a room's context is cut to this many characters.",
    )
    # A room's context holds no message older than this many minutes.
    context_minutes: int = Field(
        default=60,
        ge=1,
        le=7 * 24 * 60,
        description="A room's context holds no message older than this many minutes.",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
        allow_inf_nan=False,
    )

    # A platform installed in the `lastword.adapters` entry point group: console, telegram,
    # discord or a plug-in's. Which ones are installed is only known where they are loaded,
    # so a name none answers to is refused there, naming those that are.
    platform: str = Field(
        default="console",
        description=(
            "an installed platform: built in are `console`, `telegram` and `discord` "
            "(others: [Writing an adapter](platforms.md#writing-an-adapter))"
        ),
    )
    # redis:// or rediss:// (a cluster when the node named has cluster mode on), unix://, or
    # redis+sentinel://host:port[,host:port...]/<primary name> (rediss+sentinel: TLS); unset:
    # the embedded store. See bot/store/connect.py.
    redis_url: str | None = Field(
        default=None,
        description=(
            "`redis://…`, `rediss://…` or `unix://…` (a Redis Cluster node is detected "
            "and used as a cluster); "
            "`redis+sentinel://[user:pw@]host:port[,host:port…]/<master-name>` (or "
            "`rediss+sentinel://`) follows a Sentinel-watched primary; unset starts the "
            "embedded server. See [Scaling out](operating.md#scaling-out)"
        ),
    )
    # Where the embedded store keeps its socket and append-only file.
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="the embedded server's socket and append-only file",
    )
    llm: LLMSettings = LLMSettings()
    media: MediaSettings = MediaSettings()
    debounce: DebounceSettings = DebounceSettings()
    lease: LeaseSettings = LeaseSettings()
    access: AccessSettings = AccessSettings()
    tools: ToolsSettings = ToolsSettings()
    outbound: OutboundSettings = OutboundSettings()
    groups: GroupsSettings = GroupsSettings()
    memory: MemorySettings = MemorySettings()
    traces: TracesSettings = TracesSettings()
    # Entries (user messages and replies) kept per conversation; older ones fall off.
    history_cap: int = Field(default=200, ge=2, description="history entries kept per conversation")
    # A conversation idle for this long (no message, no reply) expires whole from Redis, and
    # its next message starts afresh. Fractions are allowed (tests use seconds).
    retention_days: float = Field(
        default=30.0,
        gt=0,
        description=(
            "a conversation idle this long (no message, no reply) expires whole from "
            "Redis; its next message starts afresh"
        ),
    )
    # Longer messages are cut, with a note, before they are stored.
    max_message_chars: int = Field(
        default=8000, ge=100, description="longer messages are cut, with a note"
    )
    # The starvation guard: once the oldest unanswered message has waited this long, the next
    # reply goes out even if newer messages arrived while it was generated (0: off). Well
    # above max_wait plus a generation, so a user typing at a human pace is never answered
    # mid-thought; see docs/guarantees.md.
    starvation_age_ms: int = Field(
        default=30_000,
        ge=0,
        description=(
            "once the oldest unanswered message has waited this long, the next reply goes"
            " out even if newer ones arrived (`0`: off)"
        ),
    )
    # Its backstop: replies discarded in a row as stale before the next one goes out anyway.
    starvation_limit: int = Field(
        default=10,
        ge=0,
        description=(
            "the guard's backstop: stale replies discarded in a row before one goes out anyway"
        ),
    )
    # How often each replica scans the durable due-index for orphaned conversations.
    sweep_interval_ms: int = Field(
        default=1000, ge=50, description="how often each replica sweeps the due-index"
    )
    # Unset: INFO, or WARNING on the console where logs share the terminal with the chat.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = Field(
        default=None, description="log level; unset: `INFO` (`WARNING` on the console)"
    )
    # text for a terminal; logfmt or json for the journal and log collectors: one line per
    # event, with the replica and the conversation on every line of a cycle.
    log_format: LogStyle = Field(
        default="text",
        description=(
            "`text`, `logfmt` or `json`: one line per event, with the replica and the conversation"
        ),
    )
    # Names this process in logs, leases and `lastword status`; unique per replica.
    replica_id: str = Field(
        default_factory=_default_replica_id,
        pattern=r"^[A-Za-z0-9._@:-]+$",
        description="names this replica in logs, leases and `lastword status`",
    )
    # On SIGTERM, a cycle that is generating may finish within this; then its conversation is
    # handed back (lease released, messages kept) for another replica.
    shutdown_grace_s: float = Field(
        default=8.0,
        ge=0,
        le=60,
        description=(
            "on SIGTERM, how long generating cycles may take to finish before they are handed back"
        ),
    )
    # host:port serving /healthz and /metrics (Prometheus); unset: off.
    metrics_listen: OptionalListenAddress = Field(
        default=None, description="`host:port` serving `/healthz` and `/metrics` (unset: off)"
    )
    # What the platform is told "stored" after, and a reply waits for before it goes out
    # (bot/store/durability.py): fast (no wait: up to ~1 s of acknowledged writes lost in a
    # crash with appendfsync everysec), local (the AOF fsynced), replicated (and one replica).
    durability: Literal["fast", "local", "replicated"] = Field(
        default="fast",
        description=(
            "what ingest, acquire, pre-send and commit wait for before the platform is "
            "acknowledged or a reply goes out: `fast`, `local` (the AOF fsync) or "
            "`replicated` (and one replica); see [Scaling out](operating.md#scaling-out)"
        ),
    )
    # How long a step waits for that fsync or replica before it counts as a store outage (as
    # bot.store.durability.DEFAULT_WAIT_MS). At least 100 ms: WAIT and WAITAOF with 0 never
    # time out, and much less refuses writes on a sound disk. At most 4 s: under the Redis
    # client's 5 s command timeout, so the wait's own answer arrives rather than a timeout.
    durability_wait_ms: int = Field(
        default=2000,
        ge=100,
        le=4000,
        description=(
            "the longest a durable step waits for the fsync or the replica; "
            "one that falls short is an outage, and the message is delivered again"
        ),
    )

    @field_validator("platform")
    @classmethod
    def _platform_installed(cls, value: str) -> str:
        # Entry points are package metadata: checking them imports no platform library.
        names = {entry.name for entry in entry_points(group=PLATFORMS)}
        # None installed (a broken environment): the platform's loading says so.
        return installed("platform", value, names) if names else value

    @field_validator("data_dir")
    @classmethod
    def _a_directory(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError("expected a directory (or a path to create one at), not a file")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlparse(value)
        split = urlsplit(value)
        if "@" in split.path + split.query + split.fragment:
            # redis-py would read the password's tail as the host, path or query.
            raise ValueError(
                "an '@' after the host: percent-encode a password's /, ?, # and @ "
                "(as %2F, %3F, %23 and %40)"
            )
        if parts.scheme in ("redis+sentinel", "rediss+sentinel"):
            parse_sentinel(value)  # its errors never quote the URL
            return value
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                "expected a URL starting with redis://, rediss://, unix://, redis+sentinel:// "
                "or rediss+sentinel://"
            )
        try:
            parts.port  # noqa: B018 (parsing the port is the check)
        except ValueError:
            # The message must not echo the URL: it may carry a password.
            raise ValueError("the port must be a number from 0 to 65535") from None
        return value

    @model_validator(mode="after")
    def _platform_section(self) -> Settings:
        """The chosen platform's own settings, validated by the model its plug-in declares;
        the other installed platforms' sections stay as given (their names are checked, see
        `load_settings`, their values are not: no adapter reads them)."""
        model = platform_model(self.platform)
        if model is None or self.platform not in PLATFORM_SECTIONS:
            return self
        try:
            setattr(self, self.platform, model.model_validate(getattr(self, self.platform)))
        except ValidationError as exc:
            raise _within(self.platform, exc) from None
        return self

    def section(self, model: type[PlatformModel]) -> PlatformModel:
        """The chosen platform's settings, as its plug-in declared them (`model`)."""
        found = getattr(self, self.platform, None)
        if not isinstance(found, model):
            raise ConfigError(f"{ENV_PREFIX}PLATFORM: {self.platform} has no {model.__name__}")
        return found

    @property
    def key_source(self) -> str | None:
        """Where the LLM's API key was read from, for `lastword doctor`; None when unset."""
        if self.llm.api_key is None:
            return None
        return given_as(("llm", "api_key"))

    @property
    def base_url_source(self) -> str:
        """Where the LLM's base URL was read from (as `given_as` names it), for the errors
        about it: `OPENAI_BASE_URL` when that is what gave it."""
        return given_as(("llm", "base_url"))

    @property
    def llm_provider(self) -> Literal["openai", "echo"]:
        if self.llm.provider is not None:
            return self.llm.provider
        configured = self.llm.base_url is not None or self.llm.api_key is not None
        return "openai" if configured else "echo"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_toml_file()[0])
        lower = (CredentialsSource(settings_cls), dotenv_settings, toml)
        conventions = OpenAIConventions(settings_cls)
        replacing = tuple(Replacing(settings_cls, source) for source in lower)
        return (init_settings, env_settings, *replacing, conventions)


class _NoSettings(BaseModel):
    """The section of a platform that declares no settings: any name in it is unknown."""


def _sections() -> tuple[str, ...]:
    """The installed platforms, each a section of the settings (a name the core settings
    already use cannot be one). Entry points are package metadata: no plug-in is loaded."""
    names = {entry.name for entry in entry_points(group=PLATFORMS)}
    return tuple(sorted(names - set(Settings.model_fields)))


PLATFORM_SECTIONS = _sections()


def with_platform_sections(core: type[Settings], names: tuple[str, ...]) -> type[Settings]:
    """`core` with a field for each installed platform's section, so that every source (the
    environment, .env, credentials, TOML) reads a section as it reads the core's groups. A
    platform's own model validates it when its plug-in is loaded (`platform_model`)."""
    sections: dict[str, Any] = {name: (RawSection, Field(default_factory=dict)) for name in names}
    return create_model("Settings", __base__=core, __module__=__name__, **sections)


# The settings as this installation reads them: what is constructed (`load_settings`, the
# tests); `Settings` is their type. The one place the installed platforms' sections join it.
InstalledSettings = with_platform_sections(Settings, PLATFORM_SECTIONS)


@cache
def platform_model(name: str) -> type[BaseModel] | None:
    """The settings model the platform `name` declares (`Platform(settings=...)`); None when
    it declares none or is not installed. Loads the plug-in, and so its library."""
    found = entry_points(group=PLATFORMS, name=name)
    if not found:
        return None
    try:
        plugin = next(iter(found)).load()
    except Exception as exc:  # a broken plug-in is a configuration problem to name
        raise ConfigError(
            f"{ENV_PREFIX}PLATFORM: the {name!r} platform cannot be loaded "
            f"({type(exc).__name__}: {exc})"
        ) from None
    model = getattr(plugin, "settings", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _within(section: str, exc: ValidationError) -> ValidationError:
    """`exc`, raised by a platform's own model, with each error under the platform's section,
    so that it names `LASTWORD_<PLATFORM>__<SETTING>`."""
    errors: list[InitErrorDetails] = []
    for error in exc.errors():
        loc = (section, *error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing":
            name = spelling.env_name(ENV_PREFIX, tuple(str(part) for part in loc))
            message = f"{name} is required when platform is {section}"
        errors.append(
            {
                "type": "value_error",
                "loc": loc,
                "input": error["input"],
                "ctx": {"error": ValueError(message)},
            }
        )
    return ValidationError.from_exception_data(exc.title, errors)


# The conventions every OpenAI client honours, each with the setting it stands in for when no
# source gives that setting: the lowest priority of all.
CONVENTIONS = {"OPENAI_API_KEY": ("llm", "api_key"), "OPENAI_BASE_URL": ("llm", "base_url")}
# Where a variable of this process's environment was written when a file wrote it rather than
# the shell: a unit's env file or `Environment=` line, as `doctor --unit` applies them. Errors
# name it; `written_in` sets it.
_WRITTEN_IN: dict[str, str] = {}


@contextmanager
def written_in(origins: Mapping[str, str]) -> Iterator[None]:
    """For the duration, each variable `origins` names counts as written where it says (`in
    /etc/lastword/lastword.env`), so that an error about it names that file."""
    saved = dict(_WRITTEN_IN)
    _WRITTEN_IN.clear()
    _WRITTEN_IN.update({name.upper(): where for name, where in origins.items()})
    try:
        yield
    finally:
        _WRITTEN_IN.clear()
        _WRITTEN_IN.update(saved)


class Variable(NamedTuple):
    """A variable given for the settings, with where it was given as an error puts it after
    the name: "" (the environment), " (in ./.env)", " (a credential)"."""

    name: str
    value: str
    where: str


def _credential_files() -> dict[str, str]:
    """systemd's credentials (`LoadCredential=` → `$CREDENTIALS_DIRECTORY`) named like a
    setting's variable or an OpenAI convention, by name. A trailing newline from `echo token >
    file` is not part of the secret."""
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder or not Path(folder).is_dir():
        return {}
    return {
        path.name: path.read_text().strip()
        for path in sorted(Path(folder).iterdir())
        if path.name.startswith((ENV_PREFIX, *CONVENTIONS)) and path.is_file()
    }


def _variables() -> list[Variable]:
    """Every `LASTWORD_*` variable and OpenAI convention given, highest priority first: the
    environment (each named by the file that wrote it, if one did), the credentials, `./.env`."""
    from dotenv import dotenv_values

    def wanted(name: str) -> bool:
        return name.upper().startswith((ENV_PREFIX, *CONVENTIONS))

    found = [
        Variable(name, value, _WRITTEN_IN.get(name.upper(), ""))
        for name, value in os.environ.items()
        if wanted(name)
    ]
    found += [Variable(n, v, " (a credential)") for n, v in _credential_files().items()]
    dotenv = dotenv_values(".env") if Path(".env").is_file() else {}
    found += [
        Variable(name, value, " (in ./.env)")
        for name, value in dotenv.items()
        if value is not None and wanted(name)
    ]
    return found


def _toml_file() -> tuple[Path, str]:
    """The TOML file read (it may not exist), and how errors name it."""
    chosen = os.environ.get(f"{ENV_PREFIX}CONFIG")
    if chosen:
        return Path(chosen), f"{ENV_PREFIX}CONFIG={chosen}"
    return Path("lastword.toml"), "./lastword.toml"


def _toml_table() -> dict[str, Any]:
    path, _where = _toml_file()
    return tomllib.loads(path.read_text()) if path.is_file() else {}


def _lookup(tree: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    """Whether the nested mapping `tree` has a value at `path`."""
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def given_as(path: tuple[str, ...], setting: tuple[str, ...] | None = None) -> str:
    """How an error names the value at `path` (within the setting at `setting`, by default
    `path` itself): by the source that gives that setting, the highest one. Its variable and,
    when it is not the environment's own, the file or credential
    (`LASTWORD_LLM__MODEL (in ./.env)`); its key in the TOML file (`./lastword.toml:
    llm.model`); the OpenAI convention standing in for it (`OPENAI_BASE_URL (in ./.env)`).
    The variable alone when no source gives it (a default)."""
    setting = setting or path
    name = spelling.env_name(ENV_PREFIX, setting)
    variables = _variables()
    for variable in variables:
        upper = variable.name.upper()
        if upper == name or upper.startswith(name + "__"):
            return spelling.env_name(ENV_PREFIX, path) + variable.where
    try:
        in_toml = _lookup(_toml_table(), setting)
    except (OSError, tomllib.TOMLDecodeError):
        in_toml = False
    if in_toml:
        return f"{_toml_file()[1]}: {'.'.join(path)}"
    for variable in variables:
        if CONVENTIONS.get(variable.name.upper()) == setting and variable.value.strip():
            return variable.name.upper() + variable.where
    return spelling.env_name(ENV_PREFIX, path)


def _takes_json(path: tuple[str, ...]) -> bool:
    """Whether the core setting at `path` is a mapping or list given as JSON text."""
    model: type[BaseModel] | None = Settings
    for name in path[:-1]:
        field = model.model_fields.get(name) if model is not None else None
        model = spelling._model_of(field.annotation) if field is not None else None
    found = model.model_fields.get(path[-1]) if model is not None and path else None
    return found is not None and _decoded_as_json(found)


class CredentialsSource(PydanticBaseSettingsSource):
    """systemd credentials (`LoadCredential=` → `$CREDENTIALS_DIRECTORY`): a file named like
    a setting's environment variable holds its value, e.g. `LASTWORD_TELEGRAM__TOKEN`. Secrets
    then never sit in the environment or in a unit file. A mapping or a list is JSON, as in
    the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ reads every credential at once.
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, text in _credential_files().items():
            if not name.startswith(ENV_PREFIX):
                continue
            path = tuple(name.removeprefix(ENV_PREFIX).lower().split("__"))
            node = values
            for parent in path[:-1]:
                node = node.setdefault(parent, {})
            node[path[-1]] = _json_or_text(text) if _takes_json(path) else text
        return values


def _json_or_text(text: str) -> Any:
    # Broken JSON is named by `load_settings`'s check; unchecked, validation refuses the text.
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


class OpenAIConventions(PydanticBaseSettingsSource):
    """OPENAI_API_KEY and OPENAI_BASE_URL, which every OpenAI client and most bots honour:
    the LLM's key and URL when no lastword setting gives them (the lowest priority). Read
    from every source a lastword setting is read from: the environment, the credentials and
    `./.env`, in that order."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ reads both at once.
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        llm: dict[str, str] = {}
        for variable in _variables():
            setting = CONVENTIONS.get(variable.name.upper())
            if setting and variable.value.strip():
                llm.setdefault(setting[1], variable.value.strip())
        return {"llm": llm} if llm else {}


class Replacing(PydanticBaseSettingsSource):
    """`source`, whose mappings (MCP servers, headers, a request body) yield whole to a
    higher source's: pydantic-settings merges mappings key by key across sources, which
    would add the TOML file's servers to the environment's, and read a pasted
    `{"mcpServers": ...}` beside them as one more server."""

    def __init__(self, settings_cls: type[BaseSettings], source: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ asks the source for all of its values.
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = self.source()
        for path in spelling._open_paths(Settings):
            if _lookup(self.current_state, path):
                values = _without(values, path)
        return values


def _without(tree: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """A copy of `tree` without the value at `path` (the source's own dicts are kept as
    they are: a TOML source returns the same ones at every call)."""
    if not path or path[0] not in tree:
        return tree
    if len(path) == 1:
        return {key: value for key, value in tree.items() if key != path[0]}
    inner = tree[path[0]]
    if not isinstance(inner, dict):
        return tree
    return {**tree, path[0]: _without(inner, path[1:])}


def load_settings() -> Settings:
    """Read settings, turning any problem into a `ConfigError` of one line that names the
    setting and where it was given, what was given (a secret masked) and what is expected. A
    name that is no setting is one too: it would otherwise be ignored without a word."""
    from pydantic_settings import SettingsError

    toml, where = _toml_file()
    if os.environ.get(f"{ENV_PREFIX}CONFIG") and not toml.is_file():
        raise ConfigError(f"{ENV_PREFIX}CONFIG: no such file: {toml}")
    try:
        table = _toml_table()
        tree = settings_tree(_mentioned(_given_names(), table))
        _check_names(tree, table, where)
        _check_json(tree)
        return InstalledSettings()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(_one_line(exc.errors()[0])) from None
    except SettingsError as exc:
        # What the checks above did not foresee, still on one line and without the value.
        raise ConfigError(str(exc).splitlines()[0]) from None


def _given_names() -> dict[str, list[str]]:
    """The `LASTWORD_*` names given, by where they were given (as an error says it)."""
    names: dict[str, list[str]] = {}
    for variable in _variables():
        if variable.name.upper().startswith(ENV_PREFIX):
            names.setdefault(variable.where, []).append(variable.name)
    return names


def _mentioned(given: dict[str, list[str]], table: Mapping[str, Any]) -> tuple[str, ...]:
    """The installed platforms that a variable, a credential or the TOML file gives settings
    of (or seems to: `LASTWORD_TELEGRAM_TOKEN`): chosen or not, their names are checked, so
    their models are loaded."""
    names = [name.upper() for names in given.values() for name in names]

    def named(platform: str) -> bool:
        variable = f"{ENV_PREFIX}{platform.upper()}"
        return platform in table or any(name.startswith(variable) for name in names)

    return tuple(platform for platform in PLATFORM_SECTIONS if named(platform))


@cache
def settings_tree(platforms: tuple[str, ...]) -> type[BaseModel]:
    """The settings with these platforms' sections as the models they declare: the tree that
    names are checked against and help lists (a section of no platform named stays a
    free-form value). Loads those platforms' plug-ins."""
    sections: dict[str, Any] = {
        name: (platform_model(name) or _NoSettings, None) for name in platforms
    }
    return create_model("Settings", __base__=InstalledSettings, __module__=__name__, **sections)


def _check_names(tree: type[BaseModel], table: Mapping[str, Any], where: str) -> None:
    """Refuse a variable, credential or TOML key that names no setting, naming the closest
    real one among every installed platform's too."""
    if _unknown(tree, table, where):
        everything = settings_tree(PLATFORM_SECTIONS)
        raise ConfigError(_unknown(everything, table, where) or _unknown(tree, table, where))


def _unknown(tree: type[BaseModel], table: Mapping[str, Any], where: str) -> str:
    """The first name given that `tree` does not have, as one line; empty when none."""
    for source, names in _given_names().items():
        unknown = spelling.unknown_variable(names, tree, ENV_PREFIX, source)
        if unknown:
            return unknown
    return spelling.unknown_key(table, tree, where) or ""


def _check_json(tree: type[BaseModel]) -> None:
    """A setting given as JSON in a variable (a mapping, a list of models) must parse;
    pydantic-settings would fail with a traceback that names only its group. The error names
    the variable and where it was given, and says where the text breaks and under which keys,
    never the text: a broken mapping of headers or of MCP servers holds credentials the
    reader cannot tell apart from the rest."""
    paths = {spelling.env_name(ENV_PREFIX, path): path for path in spelling.leaves(tree)}
    seen: set[str] = set()
    for variable in _variables():
        name = variable.name.upper()
        path = paths.get(name)
        if name in seen or path is None or not _decoded_as_json(_field(path, tree)):
            continue
        # Only the highest source's text is read.
        seen.add(name)
        example = '[{"name": "smart", "model": "gpt-4o"}]' if path[-1] == "models" else '{"key": 1}'
        try:
            json.loads(variable.value)
        except json.JSONDecodeError as exc:
            keys = _keys_at(exc.doc, exc.pos)
            under = f", under the key {'.'.join(keys)}" if keys else ""
            raise ConfigError(
                f"{name}{variable.where}: expected JSON such as {example}; {exc.msg} at line "
                f"{exc.lineno}, column {exc.colno}{under} (the text is not quoted: it may hold "
                "a credential)"
            ) from None
        except RecursionError:
            raise ConfigError(
                f"{name}{variable.where}: expected JSON such as {example}; nested too deeply"
            ) from None


# A key of a JSON setting as an error may name it: a header's, a variable's or a server's name.
KEY_SHAPE = re.compile(r"[\w.@:/+-]{1,64}")


def _keys_at(text: str, end: int) -> list[str]:
    """The keys, outermost first, of the JSON members that `text[:end]` stops inside (the
    text before a JSON error's position, which reads as JSON up to there). A key of another
    shape than a name is shown as `*`."""
    keys: list[str | None] = []
    last: str | None = None  # the string just read, a key if a colon follows
    i = 0
    while i < end:
        char = text[i]
        if char == '"':
            close = i + 1
            while close < len(text) and text[close] != '"':
                close += 2 if text[close] == "\\" else 1
            last, i = text[i + 1 : close], close + 1
            continue
        if char in "{[":
            keys.append(None)
        elif char in "}]" and keys:
            keys.pop()
        elif char == ":" and keys and last is not None:
            keys[-1] = last if KEY_SHAPE.fullmatch(last) else "*"
        elif char == "," and keys:
            keys[-1] = None
        if not char.isspace():
            last = None
        i += 1
    return [key for key in keys if key is not None]


def _field(path: tuple[str, ...], tree: type[BaseModel]) -> FieldInfo:
    model: Any = tree
    for name in path[:-1]:
        model = spelling._model_of(model.model_fields[name].annotation)
    field: FieldInfo = model.model_fields[path[-1]]
    return field


def _decoded_as_json(field: FieldInfo) -> bool:
    from typing import get_origin

    if any(meta is NoDecode or isinstance(meta, NoDecode) for meta in field.metadata):
        return False
    return get_origin(field.annotation) in (dict, list) or field.annotation in (dict, list)


def _setting(path: tuple[str, ...]) -> tuple[tuple[str, ...], FieldInfo | None]:
    """Of a path in the settings (an error's), the setting's own path and field: the path
    stops at a value, below which come a mapping's keys and a model's fields in it. No field
    for a path that names no setting (a whole group or section)."""
    tree = settings_tree(path[:1] if path[:1] and path[0] in PLATFORM_SECTIONS else ())
    model: type[BaseModel] | None = tree
    for depth, name in enumerate(path):
        field = model.model_fields.get(name) if model is not None else None
        if field is None:
            return path, None
        model = spelling._model_of(field.annotation)
        if model is None:
            return path[: depth + 1], field
    return path, None


def displayed(path: tuple[str, ...], value: object, limit: int = 200) -> str | None:
    """How an error line or `lastword doctor` may show `value`, given for the setting at
    `path`: the one rule for every setting that can hold a credential. A secret is `***`;
    the store's URL shows its scheme, host, port and database (`store_url`), an MCP
    server's its scheme, host and port (`masked_url`), any other URL all but its
    credentials (`redact`); within a mapping (headers, a request body, MCP servers: any
    value there may be a credential) nothing but the keys of an object. A long value is cut.
    None: nothing of it may be shown."""
    setting, field = _setting(path)
    if field is not None and "SecretStr" in str(field.annotation):
        # An empty one hides nothing, and showing it empty says what is wrong.
        given = value.get_secret_value() if isinstance(value, SecretStr) else value
        return MASK if given != "" else ""
    if field is not None and spelling._opens_keys(field.annotation):
        if path[-1] == "url" and setting == ("tools", "mcp_servers") and isinstance(value, str):
            text = masked_url(value)
        elif isinstance(value, dict):
            text = json.dumps(dict.fromkeys(map(str, value), MASK))
        else:
            return None
    elif setting == ("redis_url",) and isinstance(value, str):
        text = store_url(value)
    elif isinstance(value, str):
        text = redact(value) if "://" in value else value
    elif isinstance(value, int | float | bool) or value is None:
        text = str(value)
    else:
        return None
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(error: Any) -> str:
    """A pydantic error as `LASTWORD_X: expected ..., given ...` (what was given as `displayed`
    lets it be quoted)."""
    loc = list(error["loc"])
    # A list item's own fields (a model of /model) come after its position.
    item = next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))
    path = tuple(str(part) for part in loc[:item])
    message = str(error["msg"]).removeprefix("Value error, ")
    # Cross-field checks name their settings themselves.
    if message.startswith((ENV_PREFIX, "OPENAI_")):
        return message
    message = message.replace("Input should be ", "expected ").replace(
        "String should match pattern", "expected text matching"
    )
    setting = _setting(path)[0]
    name = given_as(path, setting) if path else "settings"
    if item < len(loc):
        name += f", item {int(loc[item]) + 1}" + "".join(f" {part}" for part in loc[item + 1 :])
    if path[:2] == ("tools", "mcp_servers") and len(path) > 2:
        # An MCP server's own entry: named by its key.
        name = f"{given_as(path[:2])}, server {path[2]!r}" + "".join(
            f" {part}" for part in path[3:]
        )
    given = error.get("input")
    text = displayed(path, given)
    if text is None:
        return f"{name}: {message}"
    # Text given is quoted, so that a space or an empty value shows.
    return f"{name}: {message}; given {repr(text) if isinstance(given, str) else text}"
