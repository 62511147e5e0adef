"""The command line: `lastword run`, `status`, `doctor`, `settings`, `migrate-shards` and
`forget-user` (and `python -m bot ...`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config.secrets import secrets_of
from bot.config.settings import (
    ConfigError,
    Settings,
    load_settings,
)
from bot.masking import Scrub, store_url
from bot.ops import unit
from bot.service import logs
from bot.store.embedded import EmbeddedError

if TYPE_CHECKING:
    from bot.store.connect import Client

DESCRIPTION = (
    "lastword: a DM chatbot that waits for the user's last word and answers once, "
    "with one reply covering everything unanswered."
)


def version() -> str:
    """The installed package's version (a source tree that was never installed has none)."""
    try:
        return metadata.version("lastword")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


UNIT_HELP = (
    "Read the settings as this systemd unit's process would see them (e.g. lastword@1, or "
    "lastword): its Environment= lines, EnvironmentFile=s, credentials (LoadCredential=, "
    "SetCredential=), StateDirectory= and WorkingDirectory=, through `systemctl show` where "
    "systemd runs, else from the unit files. They replace this shell's LASTWORD_* variables."
)


def add_unit_view(command: argparse.ArgumentParser) -> None:
    """--unit, --root and --env-file: check a deployment as it runs, not the caller's shell."""
    command.add_argument("--unit", metavar="UNIT", help=UNIT_HELP)
    command.add_argument(
        "--root",
        metavar="DIR",
        type=Path,
        help="with --unit: read the unit files (etc/systemd/system, run/systemd/system, "
        "usr/lib/systemd/system, lib/systemd/system, templates and drop-ins) under DIR, as "
        "`systemctl --root` does; the env files, credentials (etc/credstore, ...), "
        "StateDirectory (var/lib/...) and WorkingDirectory named there are taken under DIR too",
    )
    command.add_argument(
        "--env-file",
        metavar="PATH",
        type=Path,
        action="append",
        default=[],
        help="read PATH as systemd reads an EnvironmentFile= (KEY=VALUE lines, quotes, "
        "comments, no `export`), after the unit's own; repeatable, later files win",
    )


# Under every help screen: where the settings are, rather than all of them (a hundred lines
# that pushed the commands off the screen).
SETTINGS_POINTER = (
    "settings: environment variables (LASTWORD_*, '__' between a group and its setting), "
    "./.env, systemd credentials or a TOML file. `lastword settings` lists every one with its "
    "default and meaning; docs/settings.md says where each is read from and which wins; "
    "`lastword doctor` checks them."
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="lastword", description=DESCRIPTION, epilog=SETTINGS_POINTER)
    top.add_argument("--version", action="version", version=f"lastword {version()}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "run",
        help="start the bot (console chat, embedded store and echo model when unset)",
        description=DESCRIPTION
        + "\n\nStart the bot: on the console when no platform is set, with the embedded store "
        "when LASTWORD_REDIS_URL is unset and the echo model when no LLM is configured.",
        epilog=SETTINGS_POINTER,
    )
    status = commands.add_parser(
        "status",
        help="show replicas, role holders, waiting conversations and leases, from Redis "
        "(every primary of a cluster)",
        description="Show what the store says about a running deployment: its replicas, who "
        "holds each role (such as the platform's poller or gateway), the conversations waiting "
        "for a reply and the leases held, read from Redis (every primary of a cluster) or "
        "from the embedded store of a bot running here. Use --unit to read the store a "
        "systemd unit uses.",
    )
    status.add_argument("--json", action="store_true", help="the same, as JSON")
    add_unit_view(status)
    doctor = commands.add_parser(
        "doctor",
        help="check settings, Redis (one server, cluster or Sentinel), scripts, platform token "
        "and LLM; exit 1 on any failure",
        description="Check a deployment before (or while) it runs: the settings, the store "
        "(one server, a cluster or Sentinel's primary), that the scripts load, its memory "
        "policy and durability, that the platform accepts the token and that the LLM "
        "endpoint knows the model. One line per check, with the fix under a failed one; "
        "exit 1 on any failure. Use --unit to check what a systemd unit would run with.",
    )
    add_unit_view(doctor)
    commands.add_parser(
        "settings",
        help="list every setting with its default and meaning (no settings are read)",
        description="List every setting (the core's and each installed platform's) as its "
        "environment variable, with its default and what it means: the table of "
        "docs/settings.md. Nothing is read or checked; `lastword doctor` checks what is set.",
    )
    commands.add_parser(
        "migrate-shards",
        help="bring a store made by an earlier version up to this one: its 64 shards and "
        "stored format (stop every replica first); safe to run again",
        description="Move the conversations, indexes and usage counters of a store made "
        "before the 64 shards (the legacy 16-shard layout) to this version's shards, rewrite "
        "what an earlier version kept in this version's stored format, and record both. Stop "
        "every replica first; it refuses while one runs. Safe to run again: a store already "
        "so is left as it is.",
    )
    forget = commands.add_parser(
        "forget-user",
        help="erase everything kept about one person, memory included, without asking them "
        "(a deletion request); says what it erased",
        description="Erase one person everywhere, as their own /forget would but without "
        "asking them: the conversations and files of every place they wrote in, what they "
        "said in groups, the model and persona they picked, and what the bot remembers "
        "about them. Usage totals stay. It says what it erased.",
    )
    forget.add_argument("platform", help="the platform, as LASTWORD_PLATFORM names it")
    forget.add_argument("user", help="their user id on it")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    unit_name = getattr(args, "unit", None)
    env_files: list[Path] = getattr(args, "env_file", [])
    if getattr(args, "root", None) is not None and unit_name is None:
        return ended(2, "--root needs --unit (the unit to read under it)")
    if unit_name is None and not env_files:
        return command(args)
    try:
        view = unit.read_view(unit_name, args.root, env_files)
    except unit.UnitError as exc:
        return ended(2, str(exc))
    if args.command != "doctor":
        # Before the report: an operator must see what was checked.
        print(view.summary, file=sys.stderr, flush=True)
        with unit.applied(view):
            return command(args)
    # Doctor reports what keeps the unit from working as failed checks of its own, first.
    print(view.read, file=sys.stderr, flush=True)
    if view.problems:
        from bot.ops.doctor import render

        print(render(view.problems), flush=True)
    with unit.applied(view):
        code = command(args)
    return max(code, 1) if view.problems else code


def command(args: argparse.Namespace) -> int:
    """Run the subcommand `args` names, with the environment as it is now."""
    if args.command == "settings":
        from bot.config import settings_list

        print(settings_list.render(), end="")
        return 0
    if args.command == "doctor":
        import adapters
        from bot.ops import doctor

        # Doctor reports a configuration error as one of its checks, so the platform's check
        # is picked once the settings are loaded.
        return doctor.main(adapters.check)
    settings: Settings | None = None
    try:
        settings = load_settings()
        if args.command == "status":
            return asyncio.run(show_status(settings, as_json=args.json))
        if args.command == "migrate-shards":
            return asyncio.run(migrate_shards(settings))
        if args.command == "forget-user":
            from bot.service.forget_user import forget_user

            code, said = asyncio.run(forget_user(settings, args.platform, args.user))
            return ended(code, said, settings) if code else printed(said)
    except ConfigError as exc:
        # Also what the store's first answer shows to be wrong (not Redis, no such DB index).
        return ended(2, f"configuration error: {exc}", settings)
    # On the console the chat and the logs share a terminal, so only warnings show by default.
    default_level = "WARNING" if settings.platform == "console" else "INFO"
    logs.setup(settings, default_level)
    from bot.service.app import StartupError, serve

    try:
        return asyncio.run(serve(settings))
    except ConfigError as exc:
        # A platform's refused token too.
        return ended(2, f"configuration error: {exc}", settings)
    except (StartupError, EmbeddedError) as exc:
        return ended(1, str(exc), settings)
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        # A bug, or a library's surprise: its traceback goes through the log (masked, each
        # line with its priority under journald), not raw to stderr, then the one line.
        logging.getLogger("lastword").critical("stopped by an unexpected error", exc_info=True)
        first = (str(exc).splitlines() or [""])[0]
        return ended(1, f"stopped by an unexpected error: {type(exc).__name__}: {first}", settings)


def printed(said: str) -> int:
    """0, once `said` is printed."""
    print(said)
    return 0


def ended(code: int, message: str, settings: Settings | None = None) -> int:
    """`code`, once the line that says why the command ends with it is written
    (`logs.fatal`: one line, at error priority under journald, in the log's format), masked
    by every secret of the settings when they loaded. Settings that did not load still say
    the format the unit asks for (`LASTWORD_LOG_FORMAT=logfmt` in the shipped units), if
    they say it right."""
    if settings is not None:
        scrub = Scrub(secrets_of(settings))
        logs.fatal(message, scrub, settings.log_format, settings.replica_id)
        return code
    logs.fatal(message, style=logs.style_named(os.environ.get("LASTWORD_LOG_FORMAT", "")))
    return code


async def _open(url: str, where: str) -> Client:
    """A client for the store at `url` (`where` names it for the operator): one server, a
    cluster (every primary is read) or Sentinel's primary. A server that answers but is no
    Redis lastword can use (an HTTP port, a refused password, no such DB) is a
    `ConfigError`; one that cannot be reached is `StoreUnavailable`."""
    from bot.store import reaching_redis
    from bot.store.connect import NotRedis, open_client

    try:
        with reaching_redis():
            return await open_client(url)
    except NotRedis as exc:
        raise ConfigError(f"{where}: {exc}") from None


async def show_status(settings: Settings, *, as_json: bool) -> int:
    """Print `lastword status`: what Redis says about every replica of the deployment."""
    from bot.ops.status import render
    from bot.store import StoreUnavailable
    from bot.store.census import collect
    from bot.store.embedded import EmbeddedRedis, store_dir

    embedded = EmbeddedRedis(store_dir(settings))
    if not settings.redis_url and not embedded.socket.exists():
        return ended(
            1,
            f"no bot is running with its embedded store in {store_dir(settings)}; status reads "
            "the store of a running bot (set LASTWORD_REDIS_URL for a shared one)",
        )
    url = settings.redis_url or embedded.url
    where = "LASTWORD_REDIS_URL=" + store_url(url) if settings.redis_url else url
    try:
        client = await _open(url, where)
        try:
            status = await collect(client)
        finally:
            await client.aclose()
    except StoreUnavailable as exc:
        return ended(1, f"cannot read the status from Redis at {where}: {exc}", settings)
    if as_json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        print(render(status), end="")
    return 0


async def migrate_shards(settings: Settings) -> int:
    """`lastword migrate-shards`: move the conversations of the legacy 16-shard layout to
    this version's (`bot.store.migrate`), with every replica stopped. The embedded store is
    started for it, as `run` would (and refused if a bot runs on it)."""
    from bot.store import StoreUnavailable, reaching_redis
    from bot.store.embedded import EmbeddedRedis, store_dir
    from bot.store.format import FORMAT, FormatError
    from bot.store.migrate import SHARDS, LayoutError, migrate

    embedded: EmbeddedRedis | None = None
    if settings.redis_url:
        url = settings.redis_url
        where = "LASTWORD_REDIS_URL=" + store_url(url)
    else:
        embedded = EmbeddedRedis(store_dir(settings))
        try:
            url = where = embedded.start()
        except EmbeddedError as exc:
            return ended(1, str(exc), settings)
    try:
        client = await _open(url, where)
        try:
            with reaching_redis():
                done = await migrate(client, lambda line: print(line, file=sys.stderr))
        finally:
            await client.aclose()
    except (LayoutError, FormatError) as exc:
        return ended(1, str(exc), settings)
    except StoreUnavailable as exc:
        return ended(1, f"cannot migrate the store at {where}: {exc}", settings)
    finally:
        if embedded is not None:
            embedded.stop()
    upgraded = done.upgraded
    rewrote = upgraded.histories or upgraded.outboxes
    if done.nothing and not rewrote:
        print(
            f"nothing to migrate: the store is laid out in {SHARDS} shards, in stored format "
            f"{FORMAT} (recorded)"
        )
    if not done.nothing:
        print(
            f"migrated {done.conversations} conversations ({done.keys} keys), "
            f"{done.index_entries} index entries and {done.usage_keys} usage keys "
            f"to the {SHARDS} shards; the layout is recorded"
        )
    if rewrote:
        print(
            f"rewrote {upgraded.histories} histories and {upgraded.outboxes} outboxes in "
            f"stored format {FORMAT}; the format is recorded"
        )
    for key in done.skipped:
        print(f"left in place, not understood: {key}", file=sys.stderr)
    return 0
