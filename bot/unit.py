"""A systemd unit's own view of its settings, for `lastword doctor --unit` and `status --unit`.

Only systemd reads a unit's `EnvironmentFile=`s, credentials and `StateDirectory=`, so a
`lastword doctor` typed in an admin's shell checks the admin's shell, not the deployment. This
module rebuilds what systemd would hand the unit's process: its environment (`Environment=`
lines, then the env files, later ones winning), its credentials (copied into a private
`CREDENTIALS_DIRECTORY`, as systemd does), `STATE_DIRECTORY` and its working directory. It
reads the manager's own view through `systemctl show` where systemd runs, else the unit files
under a root directory (as `systemctl --root` does), templates and drop-ins included.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

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
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnitError(Exception):
    """The unit cannot be read or would not start; the message is one line for the operator."""


@dataclass
class UnitConfig:
    """What a unit says, specifiers expanded, paths as the unit names them."""

    name: str
    environment: dict[str, str] = field(default_factory=dict)
    env_files: list[tuple[str, bool]] = field(default_factory=list)  # (path, optional)
    load_credentials: list[tuple[str, str]] = field(default_factory=list)  # (ID, path or "")
    set_credentials: list[tuple[str, bytes]] = field(default_factory=list)
    state_directories: list[str] = field(default_factory=list)
    working_directory: str | None = None
    working_directory_optional: bool = False


@dataclass
class View:
    """What the unit's process would be given, ready to apply to this one."""

    environment: dict[str, str]
    credentials: dict[str, bytes]
    working_directory: Path | None
    summary: str


def service_name(name: str) -> str:
    """`lastword@1` -> `lastword@1.service`; a name with a suffix is kept."""
    return name if "." in name else f"{name}.service"


def _unescape_instance(text: str) -> str:
    # systemd-escape's inverse: "-" is "/", "\xNN" a byte.
    raw = text.replace("-", "/")
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda match: chr(int(match.group(1), 16)), raw)


def expand(text: str, unit: str) -> str:
    """The specifiers lastword's units use (%i %I %n %N %p %H %%); others are kept as written."""
    stem = unit.rsplit(".", 1)[0]
    prefix, _, instance = stem.partition("@")
    values = {
        "i": instance,
        "I": _unescape_instance(instance),
        "n": unit,
        "N": stem,
        "p": prefix,
        "H": socket.gethostname(),
        "%": "%",
    }
    return re.sub(r"%(.)", lambda match: values.get(match.group(1), match.group(0)), text)


def read_env_file(text: str) -> tuple[dict[str, str], list[str]]:
    """An `EnvironmentFile=` as systemd parses it (env-file.c): `KEY=VALUE` lines, `#`/`;`
    comments, single quotes literal, double quotes with backslash escapes, a backslash at the
    end of a line continuing it. Also the keys systemd ignores (`export X`, not a name)."""
    values: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in _env_assignments(text):
        if _NAME.fullmatch(key):
            values[key] = value
        else:
            ignored.append(key)
    return values, ignored


def _env_assignments(text: str) -> Iterator[tuple[str, str]]:
    state, key, value = "pre_key", "", ""
    # Where the trailing blanks of an unquoted value begin; they are not part of it.
    blank_from: int | None = None
    for char in text + "\n":
        newline = char in "\n\r"
        if state == "pre_key":
            if char in "#;":
                state = "comment"
            elif not char.isspace():
                state, key = "key", char
        elif state == "key":
            if newline:
                state = "pre_key"
            elif char == "=":
                state, key, value, blank_from = "pre_value", key.strip(), "", None
            else:
                key += char
        elif state == "comment":
            state = "pre_key" if newline else ("comment_escape" if char == "\\" else "comment")
        elif state == "comment_escape":
            state = "comment"
        elif state in ("pre_value", "value") and newline:
            yield key, value[:blank_from] if state == "value" else value
            state = "pre_key"
        elif state == "pre_value":
            if char in "'\"":
                state = "single" if char == "'" else "double"
            elif char == "\\":
                state = "value_escape"
            elif not char.isspace():
                state, value = "value", value + char
        elif state == "value":
            if char == "\\":
                state, blank_from = "value_escape", None
            else:
                if not char.isspace():
                    blank_from = None
                elif blank_from is None:
                    blank_from = len(value)
                value += char
        elif state == "value_escape":
            state, blank_from = "value", None
            if not newline:
                value += char
        elif state == "single":
            state, value = ("pre_value", value) if char == "'" else ("single", value + char)
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            state = "double"
            if char in '"\\`$':
                value += char
            elif not newline:
                value += "\\" + char
    if state in ("single", "double", "double_escape"):
        # An unclosed quote at the end of the file: systemd keeps what it read.
        yield key, value


def unit_lines(text: str, section: str = "Service") -> list[tuple[str, str]]:
    """The `Key=value` lines of one section of a unit file, continuation lines joined."""
    pairs: list[tuple[str, str]] = []
    current, pending = "", ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if pending and line[:1] in ("#", ";"):
            continue
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line:
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def apply_line(config: UnitConfig, key: str, value: str) -> None:
    """One `[Service]` line into `config`, as systemd merges them: an empty value resets a
    list, a later `WorkingDirectory=` wins."""
    unit = config.name
    if key == "Environment":
        if not value:
            config.environment.clear()
        for word in shlex.split(value):
            name, sep, text = expand(word, unit).partition("=")
            if sep and _NAME.fullmatch(name):
                config.environment[name] = text
    elif key == "EnvironmentFile":
        if not value:
            config.env_files.clear()
        else:
            path = expand(value, unit)
            config.env_files.append((path.removeprefix("-"), path.startswith("-")))
    elif key == "LoadCredential":
        if not value:
            config.load_credentials.clear()
        else:
            ident, _, path = expand(value, unit).partition(":")
            config.load_credentials.append((ident, path))
    elif key == "SetCredential":
        if not value:
            config.set_credentials.clear()
        else:
            ident, _, text = expand(value, unit).partition(":")
            # C escapes, as systemd's cunescape() reads them.
            config.set_credentials.append((ident, codecs.escape_decode(text.encode())[0]))
    elif key == "StateDirectory":
        if not value:
            config.state_directories.clear()
        config.state_directories += [expand(word, unit) for word in value.split()]
    elif key == "WorkingDirectory":
        path = expand(value, unit)
        config.working_directory = path.removeprefix("-") or None
        config.working_directory_optional = path.startswith("-")


def unit_files(root: Path, unit: str) -> list[Path]:
    """The unit's file and its drop-ins (`<unit>.d/*.conf`, the template's too), in the order
    systemd applies them; UnitError when there is none."""
    names = [unit]
    if "@" in unit:
        prefix, _, rest = unit.partition("@")
        names.append(f"{prefix}@.{rest.rsplit('.', 1)[1]}")
    fragment = next(
        (
            root / folder / name
            for name in names
            for folder in UNIT_DIRS
            if (root / folder / name).is_file()
        ),
        None,
    )
    if fragment is None:
        where = ", ".join(f"{root / folder}" for folder in UNIT_DIRS)
        raise UnitError(f"no unit {' or '.join(names)} in {where}")
    dropins: dict[str, Path] = {}
    # A drop-in of the same file name in a folder of higher priority hides the others.
    for name in reversed(names):
        for folder in reversed(UNIT_DIRS):
            for path in sorted((root / folder / f"{name}.d").glob("*.conf")):
                dropins[path.name] = path
    return [fragment, *(dropins[name] for name in sorted(dropins))]


def from_files(root: Path, name: str) -> UnitConfig:
    """What the unit files under `root` say of the unit `name`."""
    unit = service_name(name)
    if unit.split(".")[0].endswith("@"):
        raise UnitError(f"{unit} is a template: name an instance, e.g. {unit.replace('@', '@1')}")
    config = UnitConfig(unit)
    for path in unit_files(root, unit):
        for key, value in unit_lines(path.read_text(errors="replace")):
            apply_line(config, key, value)
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


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _credential_source(root: Path, ident: str, path: str) -> Path | None:
    if path.startswith("/"):
        found = _under(root, path)
        return found if found.exists() else None
    return next(
        (
            _under(root, store) / (path or ident)
            for store in CREDSTORES
            if (_under(root, store) / (path or ident)).exists()
        ),
        None,
    )


def _credentials(config: UnitConfig, root: Path) -> dict[str, bytes]:
    """Each credential's bytes by the name the process sees. A loaded credential wins over a
    `SetCredential=` of the same ID (its fallback); a missing one is absent, as under
    systemd, so a unit may name every secret it could use."""
    found: dict[str, bytes] = dict(config.set_credentials)
    for ident, path in config.load_credentials:
        source = _credential_source(root, ident, path)
        if source is None:
            continue
        if source.is_dir():
            # A directory source: each file in it becomes "ID_FILENAME".
            for item in sorted(source.iterdir()):
                if item.is_file():
                    found[f"{ident}_{item.name}"] = item.read_bytes()[:CREDENTIAL_MAX_BYTES]
        else:
            found[ident] = source.read_bytes()[:CREDENTIAL_MAX_BYTES]
    return found


def build_view(config: UnitConfig | None, root: Path, env_files: list[Path]) -> View:
    """The environment, credentials and working directory of the unit's process (`config`,
    read under `root`), with `env_files` read after the unit's own; their summary line."""
    environment = dict(config.environment) if config else {}
    parts: list[str] = []
    read: list[str] = []
    ignored: list[str] = []
    named = [
        (_under(root, path), optional) for path, optional in (config.env_files if config else [])
    ]
    for path, optional in [*named, *((extra, False) for extra in env_files)]:
        if not path.is_file():
            if not optional:
                raise UnitError(
                    f"env file {path}: no such file"
                    + (" (systemd would not start the unit)" if config else "")
                )
            read.append(f"{path} (missing)")
            continue
        values, skipped = read_env_file(path.read_text(errors="replace"))
        environment.update(values)
        ignored += [f"{path}: {key!r}" for key in skipped]
        read.append(f"{path} (read)")
    parts.append(f"env files {', '.join(read)}" if read else "no env files")
    credentials = _credentials(config, root) if config else {}
    if config:
        names = f" ({', '.join(sorted(credentials))})" if credentials else ""
        parts.append(counted(len(credentials), "credential") + names)
    if config and config.state_directories:
        states = [str(_under(root, f"/var/lib/{name}")) for name in config.state_directories]
        environment["STATE_DIRECTORY"] = ":".join(states)
        parts.append(f"state {states[0]}")
    working = _working_directory(config, root) if config else None
    if working is not None:
        parts.append(f"working directory {working}")
    if ignored:
        parts.append("ignored as systemd does (no `export`, not a name): " + ", ".join(ignored))
    what = f"reading {config.name} as systemd would" if config else "reading as these env files say"
    return View(environment, credentials, working, f"{what}: {'; '.join(parts)}")


def _working_directory(config: UnitConfig, root: Path) -> Path:
    """Where the process starts: the unit's WorkingDirectory=, else (or if missing and
    optional) the root directory, as for every system service."""
    if config.working_directory is None or config.working_directory == "~":
        return root
    path = _under(root, config.working_directory)
    if path.is_dir():
        return path
    if config.working_directory_optional:
        return root
    raise UnitError(
        f"{config.name} would not start: WorkingDirectory={config.working_directory} does not exist"
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
def applied(view: View) -> Iterator[None]:
    """This process as the unit's would be, for the duration: the caller's LASTWORD_* (and
    the like) replaced by the unit's environment, its credentials in a private
    CREDENTIALS_DIRECTORY (0700, removed afterwards), its working directory."""
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    folder = Path(tempfile.mkdtemp(prefix="lastword-credentials-"))
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
        shutil.rmtree(folder, ignore_errors=True)
