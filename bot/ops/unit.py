"""A systemd unit's own view of its settings, for `lastword doctor --unit` and `status --unit`.

Only systemd reads a unit's `EnvironmentFile=`s, credentials and `StateDirectory=`, so a
`lastword doctor` typed in an admin's shell checks the admin's shell, not the deployment. This
module rebuilds what systemd would hand the unit's process: its environment (`Environment=`
lines, then the env files, globs expanded, later ones winning), its credentials (copied into a
private `CREDENTIALS_DIRECTORY`, as systemd does), `STATE_DIRECTORY` and its working directory.
It reads the manager's own view through `systemctl show` where systemd runs, else the unit
files under a root directory (as `systemctl --root` does), templates and drop-ins included.

The unit files are read as systemd's own parser reads them (bot.ops.unit_syntax): a line systemd
ignores (an unbalanced quote, a credential ID that is no file name, a path with `..`) is
ignored here too, with a note. Every path is resolved under the root as in a chroot
(bot.ops.unit_root); one that leads out of the root is refused with a note, never read. Nothing is
written but the private credentials folder, which is gone when the command ends, on an error
or a SIGTERM too.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NamedTuple

from bot.config.settings import PLATFORM_SECTIONS, ConfigError, load_settings, written_in
from bot.ops.check import Check
from bot.ops.unit_root import glob, inside, read_regular, under, why_not_read
from bot.ops.unit_syntax import (
    ENV_NAME,
    BadSyntax,
    credential_name_valid,
    cunescape,
    expand,
    normalized,
    read_env_file,
    simplified,
    split_id,
    unit_lines,
    words,
)
from bot.plural import counted

# Where systemd looks for a credential named by its ID alone (systemd.exec(5), LoadCredential=).
CREDSTORES = ("etc/credstore", "run/credstore", "usr/lib/credstore")
# The system unit search path, highest priority first (systemd.unit(5)).
UNIT_DIRS = (
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
)
# `systemctl show` and `busctl` answer at once or the manager is stuck: never wait on one.
SYSTEMCTL_TIMEOUT_S = 5.0
# Of the caller's shell, what would change the settings read; a unit sees none of it.
SHELL_ONLY_PREFIXES = ("LASTWORD_", "OPENAI_API_KEY", "OPENAI_BASE_URL")
SHELL_ONLY = ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "XDG_STATE_HOME")
# A credential larger than systemd's own limit (CREDENTIAL_SIZE_MAX, 1 MiB) is not a setting.
CREDENTIAL_MAX_BYTES = 1024 * 1024
# A unit or env file this large is no configuration: doctor reads no more of one.
TEXT_MAX_BYTES = 4 * 1024 * 1024
# The signals whose default action ends the process without running `finally` blocks.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class UnitError(Exception):
    """The unit cannot be read or would not start; the message is one line for the operator."""


@dataclass
class UnitConfig:
    """What a unit says, specifiers expanded, paths as the unit names them; `notes` are the
    lines systemd would ignore, each with its file and line."""

    name: str
    environment: dict[str, str] = field(default_factory=dict)
    env_files: list[tuple[str, bool]] = field(default_factory=list)  # (path or glob, optional)
    load_credentials: list[tuple[str, str]] = field(default_factory=list)  # (ID, path or name)
    set_credentials: list[tuple[str, bytes]] = field(default_factory=list)
    state_directories: list[str] = field(default_factory=list)
    working_directory: str | None = None
    working_directory_optional: bool = False
    notes: list[str] = field(default_factory=list)

    def ignore(self, where: str, key: str, why: str, part: str = "this line") -> None:
        """Note that systemd ignores `part` of the `key=` line at `where` (file:line)."""
        self.notes.append(f"{where}: {key}= {why}: systemd ignores {part}")


@dataclass
class View:
    """What the unit's process would be given, ready to apply to this one."""

    environment: dict[str, str]
    credentials: dict[str, bytes]
    working_directory: Path | None
    # What was read, and the notes on what was not (one line each).
    read: str
    # Where each variable of `environment` was written, as a settings error names it after
    # the variable: " (in /etc/lastword/lastword.env)".
    origins: dict[str, str] = field(default_factory=dict)
    # Why the unit, given these, would not work as a service (`unit_checks`): ✗ lines of
    # `doctor --unit`, warnings of `status --unit`.
    problems: list[Check] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """What was read, then a `warning:` line per problem."""
        warnings = (f"\nwarning: {check.detail} ({check.fix})" for check in self.problems)
        return self.read + "".join(warnings)

    def __post_init__(self) -> None:
        # Each name becomes a file in the credentials folder: a name that is no plain file
        # name would put the file somewhere else.
        for name in self.credentials:
            if not credential_name_valid(name):
                raise ValueError(f"not a credential ID: {name!r}")


def service_name(name: str) -> str:
    """`lastword@1` -> `lastword@1.service`; a name with a suffix is kept."""
    return name if "." in name else f"{name}.service"


def _environment_line(config: UnitConfig, value: str, where: str) -> None:
    try:
        for word in words(value, unquote=True, backslash="escape"):
            try:
                name, sep, text = expand(word.decode(), config.name).partition("=")
            except UnicodeDecodeError:
                sep = ""
            if sep and ENV_NAME.fullmatch(name):
                config.environment[name] = text
            else:
                config.ignore(where, "Environment", "has a word that is no NAME=VALUE", "it")
    except BadSyntax as exc:
        config.ignore(where, "Environment", f"has {exc}", "the rest of the line")


def _env_file_line(config: UnitConfig, value: str, where: str) -> None:
    path = expand(value, config.name)
    simple = simplified(path.removeprefix("-"))
    if simple is None:
        config.ignore(where, "EnvironmentFile", "names no absolute, normalized path")
    else:
        config.env_files.append((simple, path.startswith("-")))


def _load_credential_line(config: UnitConfig, value: str, where: str) -> None:
    try:
        raw, rest = split_id(value)
    except BadSyntax as exc:
        config.ignore(where, "LoadCredential", f"has {exc}")
        return
    ident = expand(raw, config.name)
    # The ID alone: a credential of that name, looked for in the credstores.
    source = expand(rest, config.name) if rest else ident
    if not credential_name_valid(ident):
        config.ignore(where, "LoadCredential", f"names the ID {ident!r}, no valid file name")
    elif not (normalized(source) if source.startswith("/") else credential_name_valid(source)):
        why = f"names the source {source!r}, no normalized path or credential name"
        config.ignore(where, "LoadCredential", why)
    else:
        others = [(i, path) for i, path in config.load_credentials if i != ident]
        config.load_credentials = [*others, (ident, source)]


def _set_credential_line(config: UnitConfig, value: str, where: str) -> None:
    try:
        raw, rest = split_id(value)
        data = cunescape(rest) if rest else None
    except BadSyntax as exc:
        config.ignore(where, "SetCredential", f"has {exc}")
        return
    ident = expand(raw, config.name)
    if data is None:
        config.ignore(where, "SetCredential", "has no ID:DATA")
    elif not credential_name_valid(ident):
        config.ignore(where, "SetCredential", f"names the ID {ident!r}, no valid file name")
    else:
        others = [(i, text) for i, text in config.set_credentials if i != ident]
        config.set_credentials = [*others, (ident, data)]


def _state_line(config: UnitConfig, value: str, where: str) -> None:
    try:
        for word in words(value, unquote=True, backslash="keep"):
            # "NAME:LINK" also links LINK to it; the process is told of NAME only.
            name = expand(word.decode().partition(":")[0], config.name)
            simple = simplified(name, absolute=False)
            if simple is None or simple.split("/")[0] == "private":
                why = f"names {name!r}, no relative, normalized path outside private/"
                config.ignore(where, "StateDirectory", why, "that name")
            else:
                config.state_directories.append(simple)
    except BadSyntax as exc:
        config.ignore(where, "StateDirectory", f"has {exc}", "the rest of the line")


def _working_directory_line(config: UnitConfig, value: str, where: str) -> None:
    if not value:
        config.working_directory = None
        return
    path = value.removeprefix("-")
    optional = value.startswith("-")
    simple = "~" if path == "~" else simplified(expand(path, config.name))
    if simple is not None:
        config.working_directory, config.working_directory_optional = simple, optional
    elif optional:
        config.ignore(where, "WorkingDirectory", "names no absolute, normalized path")
    else:
        raise UnitError(
            f"{where}: WorkingDirectory={path} is no absolute, normalized path "
            f"(systemd would not load {config.name})"
        )


# How each line systemd hands the process something is read.
_LINES: dict[str, Callable[[UnitConfig, str, str], None]] = {
    "Environment": _environment_line,
    "EnvironmentFile": _env_file_line,
    "LoadCredential": _load_credential_line,
    "SetCredential": _set_credential_line,
    "StateDirectory": _state_line,
    "WorkingDirectory": _working_directory_line,
}
# The lists these lines add to, by key: an empty value resets one.
_LISTS = {
    "Environment": "environment",
    "EnvironmentFile": "env_files",
    "LoadCredential": "load_credentials",
    "SetCredential": "set_credentials",
    "StateDirectory": "state_directories",
}


def apply_line(config: UnitConfig, key: str, value: str, where: str) -> None:
    """One `[Service]` line (at `where`, file:line) into `config`, as systemd merges them: an
    empty value resets a list, a later `WorkingDirectory=` wins, a later credential of the
    same ID replaces the earlier, and a line (or the part of one) that systemd ignores is
    ignored with a note. UnitError for one that stops systemd loading the unit."""
    parse = _LINES.get(key)
    if parse is None:
        return
    if not value and key in _LISTS:
        getattr(config, _LISTS[key]).clear()
    else:
        parse(config, value, where)


def _unit_file(root: Path, path: str) -> Path | None:
    found = inside(root, path)
    return found if found.is_file() else None


def unit_files(root: Path, unit: str) -> list[Path]:
    """The unit's file and its drop-ins (`<unit>.d/*.conf`, the template's too), in the order
    systemd applies them, resolved under `root`; UnitError when there is none, or when one
    leads out of the root."""
    names = [unit]
    if "@" in unit:
        prefix, _, rest = unit.partition("@")
        names.append(f"{prefix}@.{rest.rsplit('.', 1)[1]}")
    try:
        candidates = (
            _unit_file(root, f"/{folder}/{name}") for name in names for folder in UNIT_DIRS
        )
        fragment = next((path for path in candidates if path is not None), None)
        if fragment is None:
            where = ", ".join(f"{root / folder}" for folder in UNIT_DIRS)
            raise UnitError(f"no unit {' or '.join(names)} in {where}")
        dropins: dict[str, Path] = {}
        # A drop-in of the same file name in a folder of higher priority hides the others.
        for name in reversed(names):
            for folder in reversed(UNIT_DIRS):
                for found in glob(root, f"/{folder}/{name}.d/*.conf"):
                    path = _unit_file(root, found)
                    if path is not None:
                        dropins[found.rsplit("/", 1)[1]] = path
    except OSError as exc:
        raise UnitError(why_not_read(exc)) from None
    return [fragment, *(dropins[name] for name in sorted(dropins))]


def from_files(root: Path, name: str) -> UnitConfig:
    """What the unit files under `root` say of the unit `name`."""
    unit = service_name(name)
    if unit.split(".")[0].endswith("@"):
        raise UnitError(f"{unit} is a template: name an instance, e.g. {unit.replace('@', '@1')}")
    config = UnitConfig(unit)
    for path in unit_files(root, unit):
        try:
            text = read_regular(path, TEXT_MAX_BYTES).decode(errors="replace")
        except OSError as exc:
            raise UnitError(why_not_read(exc)) from None
        for number, key, value in unit_lines(text):
            apply_line(config, key, value, f"{path}:{number}")
    return config


def systemd_runs() -> bool:
    """Whether this machine was booted with systemd (sd_booted(3)) and `systemctl` exists."""
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise UnitError(
            f"`{' '.join(command[:2])}` gave no answer within {SYSTEMCTL_TIMEOUT_S:g} s"
        ) from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[0]
        raise UnitError(f"`{' '.join(command[:2])} {command[-1]}`: {reason}")
    return done.stdout


def bus_path(unit: str) -> str:
    """The unit's D-Bus object path: every byte but [A-Za-z0-9] as _xx (sd_bus_path_encode)."""
    encoded = "".join(
        char if char.isascii() and char.isalnum() else "".join(f"_{b:02x}" for b in char.encode())
        for char in unit
    )
    return f"/org/freedesktop/systemd1/unit/{encoded}"


def from_systemctl(name: str) -> UnitConfig:
    """The manager's view of the unit: `systemctl show` for its environment, env files, state
    and working directory; the credentials through `busctl`, since `systemctl show` prints
    their a(ss)/a(say) properties as "[unprintable]"."""
    unit = service_name(name)
    properties = [
        "LoadState",
        "Environment",
        "EnvironmentFiles",
        "StateDirectory",
        "WorkingDirectory",
    ]
    command = ["systemctl", "show", *(f"-p{prop}" for prop in properties), "--", unit]
    config = UnitConfig(unit)
    for line in _run(command).splitlines():
        key, _, value = line.partition("=")
        if key == "LoadState" and value == "not-found":
            raise UnitError(f"systemd knows no unit {unit}")
        if key == "Environment":
            # Space-separated, each quoted as a shell would need (shell_maybe_quote).
            for word in shlex.split(value):
                variable, _, text = word.partition("=")
                config.environment[variable] = text
        elif key == "EnvironmentFiles" and value:
            # One line per file: "PATH (ignore_errors=yes)".
            path, _, flag = value.rpartition(" (ignore_errors=")
            config.env_files.append((path, flag.startswith("yes")))
        elif key == "StateDirectory":
            config.state_directories = shlex.split(value)
        elif key == "WorkingDirectory" and value:
            # The manager marks a directory that may be missing with "!".
            config.working_directory = value.lstrip("!-") or None
            config.working_directory_optional = value[0] in "!-"
    for ident, source in _bus_pairs(unit, "LoadCredential"):
        if isinstance(source, str):
            config.load_credentials.append((ident, source))
    for ident, data in _bus_pairs(unit, "SetCredential"):
        if isinstance(data, list):
            config.set_credentials.append((ident, bytes(data)))
    return config


def _bus_pairs(unit: str, prop: str) -> list[tuple[str, object]]:
    """A unit's a(ss) or a(say) property as (ID, value) pairs, from `busctl --json=short`:
    {"type": "a(ss)", "data": [["ID", "PATH"], ...]}."""
    command = ["busctl", "--json=short", "get-property", "org.freedesktop.systemd1", bus_path(unit)]
    answer = json.loads(_run([*command, "org.freedesktop.systemd1.Service", prop]))
    data = answer.get("data") if isinstance(answer, dict) else None
    pairs = data if isinstance(data, list) else []
    return [
        (pair[0], pair[1])
        for pair in pairs
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
    ]


def _credential_source(root: Path, source: str) -> Path | None:
    """Where a `LoadCredential=` source is under `root`: an absolute path, else the first
    credstore holding that name; None when there is none (systemd skips the credential)."""
    if source.startswith("/"):
        candidates = [source]
    else:
        candidates = [f"/{store}/{source}" for store in CREDSTORES]
    for candidate in candidates:
        path = inside(root, candidate)
        if path.exists():
            return path
    return None


def _credential_folder(ident: str, folder: Path) -> dict[str, bytes]:
    """A directory source's credentials, as systemd loads one: each regular file below it (no
    symlink, no dot file) as "ID_FILE" ("ID_SUB_FILE" further down), by name. UnitError for a
    name that is no credential ID: systemd would not start the unit."""
    found: dict[str, bytes] = {}
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        name = f"{ident}_{entry.name}"
        if entry.name.startswith("."):
            continue
        # Below a name too long to be an ID, no file could have one.
        if entry.is_dir(follow_symlinks=False) and credential_name_valid(name):
            found |= _credential_folder(name, Path(entry.path))
        elif entry.is_file(follow_symlinks=False):
            if not credential_name_valid(name):
                raise UnitError(
                    f"LoadCredential={ident}: {entry.path} would be the credential {name!r}, "
                    "no valid ID (systemd would not start the unit)"
                )
            found[name] = read_regular(Path(entry.path), CREDENTIAL_MAX_BYTES)
    return found


def _credentials(config: UnitConfig, root: Path, notes: list[str]) -> dict[str, bytes]:
    """Each credential's bytes by the name the process sees. A loaded credential wins over a
    `SetCredential=` of the same ID (its fallback); a missing one is absent, as under
    systemd, so a unit may name every secret it could use. One that cannot be read (it leads
    out of the root, say) is absent too, with a note."""
    found: dict[str, bytes] = dict(config.set_credentials)
    for ident, source in config.load_credentials:
        try:
            path = _credential_source(root, source)
            if path is not None and path.is_dir():
                found |= _credential_folder(ident, path)
            elif path is not None:
                found[ident] = read_regular(path, CREDENTIAL_MAX_BYTES)
        except OSError as exc:
            notes.append(f"LoadCredential={ident}: {why_not_read(exc)}; not read")
    return found


class _EnvFile(NamedTuple):
    """A file to read for the environment, as the summary names it; with no `path`, `state`
    says why there is nothing to read ("no match", "not read") and `why` gives the reason."""

    shown: str
    path: Path | None
    optional: bool
    state: str = ""
    why: str = ""


def _unit_env_files(config: UnitConfig, root: Path) -> Iterator[_EnvFile]:
    """The files the unit's `EnvironmentFile=` lines name, in the order systemd reads them:
    line by line, each glob's matches sorted. One that leads out of the root is not read."""
    for pattern, optional in config.env_files:
        shown = str(under(root, pattern))
        try:
            matches = glob(root, pattern)
        except OSError as exc:
            yield _EnvFile(shown, None, optional, "not read", why_not_read(exc))
            continue
        if not matches:
            yield _EnvFile(shown, None, optional, "no match")
        for match in matches:
            try:
                path = inside(root, match)
            except OSError as exc:
                yield _EnvFile(
                    str(under(root, match)), None, optional, "not read", why_not_read(exc)
                )
            else:
                yield _EnvFile(str(path), path, optional)


def _env_file_text(file: _EnvFile) -> tuple[str | None, str, str]:
    """The file's text, or None; what the summary says of it ("read", "missing", "no match",
    "not read"); and for one not read, why."""
    if file.path is None:
        return None, file.state, file.why
    try:
        return read_regular(file.path, TEXT_MAX_BYTES).decode(errors="replace"), "read", ""
    except FileNotFoundError:
        return None, "missing", ""
    except OSError as exc:
        return None, "not read", why_not_read(exc)


# What stops the unit, by what the summary says of an env file that is not optional.
_NOT_READ = {"missing": "no such file", "no match": "matches no file"}


def build_view(config: UnitConfig | None, root: Path, env_files: list[Path]) -> View:
    """The environment, credentials and working directory of the unit's process (`config`,
    read under `root`), with `env_files` read after the unit's own; their summary, the notes
    (what was ignored or not read, and why) on lines of their own."""
    environment = dict(config.environment) if config else {}
    origins = dict.fromkeys(environment, f" (Environment= of {config.name})" if config else "")
    notes = list(config.notes) if config else []
    parts: list[str] = []
    read: list[str] = []
    ignored: list[str] = []
    files = list(_unit_env_files(config, root)) if config else []
    files += [_EnvFile(str(extra), extra, False) for extra in env_files]
    for file in files:
        text, state, why = _env_file_text(file)
        if text is None and not file.optional:
            raise UnitError(
                f"env file {file.shown}: {_NOT_READ.get(state) or why}"
                + (" (systemd would not start the unit)" if config else "")
            )
        read.append(f"{file.shown} ({state})")
        if why:
            notes.append(f"{why}; not read")
        if text is not None:
            values, skipped = read_env_file(text)
            environment.update(values)
            origins.update(dict.fromkeys(values, f" (in {file.shown})"))
            ignored += [f"{file.shown}: {key!r}" for key in skipped]
    parts.append(f"env files {', '.join(read)}" if read else "no env files")
    credentials = _credentials(config, root, notes) if config else {}
    if config:
        names = f" ({', '.join(sorted(credentials))})" if credentials else ""
        parts.append(counted(len(credentials), "credential") + names)
    states = _state_directories(config, root, notes) if config else []
    if states:
        environment["STATE_DIRECTORY"] = ":".join(states)
        parts.append(f"state {states[0]}")
    working = _working_directory(config, root, notes) if config else None
    if working is not None:
        parts.append(f"working directory {working}")
    if ignored:
        parts.append("ignored as systemd does (no `export`, not a name): " + ", ".join(ignored))
    what = f"reading {config.name} as systemd would" if config else "reading as these env files say"
    summary = f"{what}: {'; '.join(parts)}" + "".join(f"\nnote: {note}" for note in notes)
    view = View(environment, credentials, working, summary, origins)
    if config is not None:
        view.problems = unit_checks(view, config)
    return view


def unit_checks(view: View, config: UnitConfig) -> list[Check]:
    """What would keep the unit `config` from working as a service though its settings are
    valid, each a failed check with its fix: it would run the console platform (nothing sets
    LASTWORD_PLATFORM; a service has no terminal), or it is an instance of a template with no
    LASTWORD_REDIS_URL (each replica would keep an embedded store of its own, and a person's
    messages would be split between them). None when the settings do not load: doctor says
    why."""
    try:
        with applied(view):
            settings = load_settings()
    except (ConfigError, OSError):
        return []
    # Where a fix goes: the unit's first env file, as the unit names it.
    env_file = config.env_files[0][0] if config.env_files else "an EnvironmentFile= of the unit"
    problems: list[Check] = []
    if settings.platform == "console":
        others = ", ".join(section for section in PLATFORM_SECTIONS if section != "console")
        problems.append(
            Check(
                "unit",
                False,
                f"{config.name} would run the console platform, which needs a terminal: "
                "nothing it reads sets LASTWORD_PLATFORM",
                f"set LASTWORD_PLATFORM in {env_file} to one of: {others}",
            )
        )
    template, at, instance = config.name.partition(".")[0].partition("@")
    if at and instance and settings.redis_url is None:
        problems.append(
            Check(
                "unit",
                False,
                f"{config.name} is one replica of {template}@.service, but nothing it reads "
                "sets LASTWORD_REDIS_URL: each replica would keep a store of its own, and a "
                "person's messages would be split between them",
                f"set LASTWORD_REDIS_URL in {env_file} to the Redis every replica shares (or "
                f"run {template}.service, one process with its embedded store)",
            )
        )
    return problems


def _state_directories(config: UnitConfig, root: Path, notes: list[str]) -> list[str]:
    """Each `StateDirectory=` as the process is told of it, resolved under the root (with
    DynamicUser=, /var/lib/NAME links into /var/lib/private)."""
    states: list[str] = []
    for name in config.state_directories:
        try:
            states.append(str(inside(root, f"/var/lib/{name}")))
        except OSError as exc:
            notes.append(f"StateDirectory={name}: {why_not_read(exc)}; not used")
    return states


def _working_directory(config: UnitConfig, root: Path, notes: list[str]) -> Path:
    """Where the process starts: the unit's WorkingDirectory=, else (or if missing and
    optional) the root directory, as for every system service."""
    if config.working_directory is None or config.working_directory == "~":
        return root
    try:
        path = inside(root, config.working_directory)
    except OSError as exc:
        why = why_not_read(exc)
    else:
        if path.is_dir():
            return path
        why = ""
    if config.working_directory_optional:
        if why:
            notes.append(f"WorkingDirectory=-{config.working_directory}: {why}; not used")
        return root
    raise UnitError(
        f"{config.name} would not start: WorkingDirectory={config.working_directory} "
        + (f"is not used: {why}" if why else "does not exist")
    )


def read_view(unit: str | None, root: Path | None, env_files: list[Path]) -> View:
    """The view `--unit`, `--root` and `--env-file` ask for: through systemd when it runs and
    no root is given, else from the unit files under the root (`/` by default)."""
    config: UnitConfig | None = None
    if unit is not None:
        if root is None and systemd_runs():
            config = from_systemctl(unit)
        else:
            config = from_files(root or Path("/"), unit)
    return build_view(config, root or Path("/"), env_files)


@contextmanager
def _private_folder() -> Iterator[Path]:
    """A new folder only this user may enter (mkdtemp), removed on leaving, and also when
    SIGTERM or SIGHUP ends the process meanwhile: their default action runs no `finally`.
    The signal then ends the process as it would have."""
    made: list[Path] = []

    def remove_then_end(signum: int, frame: FrameType | None) -> None:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    # Only the main thread may set handlers; a signal ignored (nohup) stays ignored.
    main = threading.current_thread() is threading.main_thread()
    caught = [sig for sig in ENDING_SIGNALS if main and signal.getsignal(sig) == signal.SIG_DFL]
    for sig in caught:
        signal.signal(sig, remove_then_end)
    try:
        made.append(Path(tempfile.mkdtemp(prefix="lastword-credentials-")))
        yield made[0]
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        for sig in caught:
            signal.signal(sig, signal.SIG_DFL)


@contextmanager
def applied(view: View) -> Iterator[None]:
    """This process as the unit's would be, for the duration: the caller's LASTWORD_* (and
    the like) replaced by the unit's environment, its credentials in a private
    CREDENTIALS_DIRECTORY (0700, removed afterwards, however the process ends but SIGKILL),
    its working directory; a settings error names the file that wrote the variable."""
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    with _private_folder() as folder, written_in(view.origins):
        try:
            for name in list(os.environ):
                if name.startswith(SHELL_ONLY_PREFIXES) or name in SHELL_ONLY:
                    del os.environ[name]
            os.environ.update(view.environment)
            for name, data in view.credentials.items():
                target = folder / name
                target.write_bytes(data)
                target.chmod(0o400)
            if view.credentials:
                os.environ["CREDENTIALS_DIRECTORY"] = str(folder)
            if view.working_directory is not None:
                os.chdir(view.working_directory)
            yield
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_environ)
