"""The systemd units in systemd/: valid for systemd, hardened, and true to what lastword needs.

`systemd-analyze verify` insists that ExecStart= names an existing executable, and the units
name /opt/lastword/.venv/bin/lastword, where the README installs lastword but a test machine
has nothing. `--root=` would need a whole unit tree (sysinit.target and friends) under that
root, so instead each unit is verified as a copy in a temporary directory whose ExecStart=
points at this venv's real `lastword` script; every other line is checked as written, and a
separate test pins the ExecStart= of the files themselves. verify exits 0 even when it ignores
a key it cannot parse, so its output must also be free of complaints about the unit.

The other checks read the unit files and compare them with the settings lastword really has
(bot.config.settings), so a renamed setting or a new secret shows up here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

from bot.config.settings import ENV_PREFIX, PLATFORM_SECTIONS, Settings, settings_tree

# The settings with every installed platform's own, as its plug-in declares them.
TREE = settings_tree(PLATFORM_SECTIONS)

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
SINGLE = "lastword.service"
TEMPLATE = "lastword@.service"
UNITS = (SINGLE, TEMPLATE)
INSTALLED_EXEC = "/opt/lastword/.venv/bin/lastword"
MAX_EXPOSURE = 2.0
# Entries allowed to differ between the two units: what makes a replica a replica.
PER_INSTANCE_KEYS = {"Description", "StateDirectory", "Environment", "EnvironmentFile"}

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze is missing (Debian: apt-get install systemd); CI installs it",
)

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(text: str) -> Unit:
    """Sections to their (key, value) entries in order; repeated keys stay repeated."""
    unit: Unit = {}
    section: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"line continuations are not parsed here: {line}"
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], [])
            continue
        assert section is not None, f"entry outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        section.append((key.strip(), value.strip()))
    return unit


def load(name: str) -> Unit:
    return parse_unit((SYSTEMD_DIR / name).read_text())


def values(unit: Unit, key: str, section: str = "Service") -> list[str]:
    return [value for k, value in unit.get(section, []) if k == key]


def last(unit: Unit, key: str, section: str = "Service") -> str:
    """The effective value of a single-valued key: systemd keeps the last assignment."""
    found = values(unit, key, section)
    assert found, f"[{section}] {key}= is not set"
    return found[-1]


def environment(unit: Unit) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in values(unit, "Environment"):
        for item in line.split():
            name, _, value = item.partition("=")
            env[name] = value
    return env


def seconds(value: str) -> float:
    """A systemd time span such as "30", "10s", "10min" or "1min 30s", in seconds."""
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    assert total > 0 or value.strip() == "0", f"not a time span: {value!r}"
    return total


def _models(annotation: object) -> Iterator[type[BaseModel]]:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            yield candidate


def setting_for(env_name: str) -> object:
    """The annotation of the setting an environment variable (or credential) name sets; fails
    the test when lastword has no such setting."""
    assert env_name.startswith(ENV_PREFIX), env_name
    model: type[BaseModel] = TREE
    *parents, leaf = env_name.removeprefix(ENV_PREFIX).lower().split("__")
    for parent in parents:
        field = model.model_fields.get(parent)
        assert field is not None, f"{env_name}: lastword has no setting group {parent!r}"
        nested = list(_models(field.annotation))
        assert nested, f"{env_name}: {parent!r} is not a group of settings"
        model = nested[0]
    field = model.model_fields.get(leaf)
    assert field is not None, f"{env_name}: lastword has no such setting"
    return field.annotation


def secret_settings(model: type[BaseModel] = TREE, prefix: str = ENV_PREFIX) -> set[str]:
    """Environment names of every SecretStr setting, found by walking the settings tree."""
    found: set[str] = set()
    for name, field in model.model_fields.items():
        env_name = prefix + name.upper()
        annotation = field.annotation
        if annotation is SecretStr or SecretStr in typing.get_args(annotation):
            found.add(env_name)
        for nested in _models(annotation):
            found |= secret_settings(nested, env_name + "__")
    return found


def grace_period_s() -> float:
    field = Settings.model_fields.get("shutdown_grace_s")
    default = field.default if field is not None else None
    return float(default) if isinstance(default, int | float) else 8.0


def run_analyze(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )


def lastword_executable() -> str:
    script = Path(sys.executable).parent / "lastword"
    return str(script) if script.exists() else (shutil.which("lastword") or sys.executable)


def verifiable_copy(name: str, folder: Path, text: str | None = None) -> Path:
    """A copy of the unit, same file name, with ExecStart= on an executable that exists here."""
    text = (SYSTEMD_DIR / name).read_text() if text is None else text
    assert f"ExecStart={INSTALLED_EXEC} " in text
    copy = folder / name
    copy.write_text(
        text.replace(f"ExecStart={INSTALLED_EXEC} ", f"ExecStart={lastword_executable()} ")
    )
    return copy


def verify(copy: Path, target: str) -> list[str]:
    """Complaints of `systemd-analyze verify` about the unit (a template: about `target`, an
    instance of it), or a failing exit status."""
    result = run_analyze("verify", f"./{target}", cwd=copy.parent)
    output = (result.stdout + result.stderr).splitlines()
    stem = copy.name.split("@")[0].removesuffix(".service")
    complaints = [line for line in output if stem in line]
    if result.returncode != 0:
        complaints.append(f"exit status {result.returncode}: {output}")
    return complaints


# --- systemd's own checks --------------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize(
    ("name", "target"),
    [(SINGLE, SINGLE), (TEMPLATE, TEMPLATE), (TEMPLATE, "lastword@1.service")],
)
def test_systemd_analyze_verify_passes(name: str, target: str, tmp_path: Path) -> None:
    complaints = verify(verifiable_copy(name, tmp_path), target)
    hint = (
        " (ExecReload= needs /bin/kill: Debian package procps)"
        if not Path("/bin/kill").exists()
        else ""
    )
    assert complaints == [], f"{target}{hint}: {complaints}"


@needs_analyze
def test_verify_check_catches_what_systemd_only_warns_about(tmp_path: Path) -> None:
    # Guards the guard: systemd ignores a bad value with exit status 0.
    text = (SYSTEMD_DIR / SINGLE).read_text().replace("WatchdogSec=30", "WatchdogSec=soon")
    complaints = verify(verifiable_copy(SINGLE, tmp_path, text), SINGLE)
    assert any("soon" in line for line in complaints), complaints


@needs_analyze
@pytest.mark.parametrize("name", UNITS)
def test_offline_security_exposure_is_at_most_2(name: str, tmp_path: Path) -> None:
    result = run_analyze("security", "--offline=true", str(verifiable_copy(name, tmp_path)))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?) (\w+)", result.stdout)
    assert match, f"no overall exposure in: {result.stdout[-500:]} {result.stderr}"
    exposure, verdict = float(match.group(1)), match.group(2)
    assert exposure <= MAX_EXPOSURE, f"{name}: exposure {exposure} {verdict}\n{result.stdout}"
    assert verdict in ("OK", "SAFE")


def expand_filter_groups(listing: str) -> dict[str, set[str]]:
    """`systemd-analyze syscall-filter` output as group -> every system call, nested groups
    expanded."""
    direct: dict[str, list[str]] = {}
    group: list[str] | None = None
    for raw in listing.splitlines():
        line = raw.strip()
        if raw.startswith("#"):
            # A trailer (e.g. calls in no group), not part of the group above.
            group = None
            continue
        if not line or line.startswith("#"):
            continue
        if not raw.startswith(" ") and line.startswith("@"):
            group = direct.setdefault(line, [])
        elif group is not None:
            group.append(line)

    def expand(name: str) -> set[str]:
        calls: set[str] = set()
        for item in direct.get(name, [name]):
            calls |= expand(item) if item.startswith("@") and item != name else {item}
        return calls

    return {name: expand(name) for name in direct}


@needs_analyze
@pytest.mark.parametrize("name", UNITS)
def test_syscall_filter_allows_what_lastword_does(name: str) -> None:
    groups = expand_filter_groups(run_analyze("syscall-filter").stdout)
    assert "@system-service" in groups, "systemd-analyze syscall-filter listed no groups"

    def calls(items: str) -> set[str]:
        found: set[str] = set()
        for item in items.split():
            found |= groups[item] if item.startswith("@") else {item}
        return found

    lines = values(load(name), "SystemCallFilter")
    assert lines and not lines[0].startswith("~"), "expected an allow-list first"
    allowed: set[str] = set()
    for line in lines:
        if not line:
            allowed = set()  # an empty assignment resets the filter
        elif line.startswith("~"):
            allowed -= calls(line[1:])
        else:
            allowed |= calls(line)
    needed = {
        # The embedded store: fork+exec with PR_SET_PDEATHSIG, in its own process group.
        *("clone", "clone3", "execve", "prctl", "setpgid", "wait4", "kill", "pipe2", "dup3"),
        # Its unix socket and append-only file.
        *("socket", "bind", "listen", "accept4", "connect", "chmod", "fsync", "ftruncate"),
        *("rename", "unlink"),
        # asyncio, sockets and TLS to the platform, the LLM and Redis.
        *("epoll_create1", "epoll_ctl", "epoll_wait", "eventfd2", "getrandom", "sendmsg"),
        *("recvfrom", "sendto", "setsockopt", "getsockopt", "mmap", "mprotect", "madvise"),
        # Reading limits, e.g. the server sizing its client table.
        *("prlimit64", "getrlimit", "sched_getaffinity"),
    }
    assert needed - allowed == set()


# --- what the issue asks of the units --------------------------------------------------------


@pytest.mark.parametrize("name", UNITS)
def test_runs_lastword_as_a_notify_service_with_watchdog(name: str) -> None:
    unit = load(name)
    assert last(unit, "ExecStart") == f"{INSTALLED_EXEC} run"
    assert last(unit, "Type") == "notify"
    # The embedded store is a child: it must not be able to claim READY or feed the watchdog.
    assert last(unit, "NotifyAccess") == "main"
    assert seconds(last(unit, "WatchdogSec")) == 30
    assert last(unit, "ExecReload").endswith("-HUP $MAINPID")
    assert "multi-user.target" in last(unit, "WantedBy", "Install")


@pytest.mark.parametrize("name", UNITS)
def test_restarts_on_failure_with_back_off_and_stops_gracefully(name: str) -> None:
    unit = load(name)
    assert last(unit, "Restart") == "on-failure"
    restart_s = seconds(last(unit, "RestartSec"))
    assert restart_s >= 1
    interval_s = seconds(last(unit, "StartLimitIntervalSec", "Unit"))
    burst = int(last(unit, "StartLimitBurst", "Unit"))
    # Else restarts RestartSec apart never fill the window and a crash loop runs forever.
    assert burst >= 3 and interval_s > burst * restart_s
    # Status 2 is a configuration error (bot/service/cli.py): a restart cannot fix it.
    assert "2" in last(unit, "RestartPreventExitStatus").split()
    # SIGTERM only to lastword, which stops its embedded store after handing leases back.
    assert last(unit, "KillMode") == "mixed"
    assert seconds(last(unit, "TimeoutStopSec")) > grace_period_s() + 5


@pytest.mark.parametrize("name", UNITS)
def test_settings_come_from_env_file_and_real_setting_names(name: str) -> None:
    unit = load(name)
    assert "-/etc/lastword/lastword.env" in values(unit, "EnvironmentFile")
    assert all(path.startswith("-") for path in values(unit, "EnvironmentFile")), (
        "an env file must be optional: a fresh install has none"
    )
    env = environment(unit)
    assert env["LASTWORD_LOG_FORMAT"] == "logfmt"
    assert "LASTWORD_REPLICA_ID" in env
    for key in env:
        if key.startswith(ENV_PREFIX):
            setting_for(key)
    # One unit for every platform: a lease, not the unit, picks the replica that connects.
    assert "LASTWORD_PLATFORM" not in env
    for line in values(unit, "ExecStart") + values(unit, "Environment"):
        assert not re.search(r"telegram|discord", line, re.IGNORECASE), line


@pytest.mark.parametrize("name", UNITS)
def test_every_secret_can_come_from_a_credential_that_may_be_missing(name: str) -> None:
    unit = load(name)
    loaded = values(unit, "LoadCredential")
    ids = [entry.partition(":")[0] for entry in loaded]
    # A Redis URL may carry a password, so it is a secret too.
    assert secret_settings() | {"LASTWORD_REDIS_URL"} <= set(ids)
    for entry, credential_id in zip(loaded, ids, strict=True):
        # lastword reads $CREDENTIALS_DIRECTORY/<env name> as that setting.
        setting_for(credential_id)
        # A bare ID is searched in /etc/credstore and friends and skipped when missing; an
        # absolute source that is missing fails the start (systemd 252).
        assert ":" not in entry, f"{entry}: a missing source file would fail the unit"


@pytest.mark.parametrize("name", UNITS)
def test_sandbox_is_strict_but_leaves_lastword_its_network_and_state(name: str) -> None:
    unit = load(name)
    assert last(unit, "DynamicUser") == "yes" or values(unit, "User")
    assert last(unit, "StateDirectory")
    assert last(unit, "ProtectSystem") == "strict"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert last(unit, key) == "yes", key
    assert values(unit, "SystemCallFilter")
    assert last(unit, "SystemCallArchitectures") == "native"
    assert last(unit, "CapabilityBoundingSet") == ""
    assert last(unit, "UMask") == "0077"
    # Outbound TCP to the platform, the LLM and Redis; a unix socket for the embedded store.
    families = last(unit, "RestrictAddressFamilies").split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)
    assert values(unit, "PrivateNetwork") in ([], ["no"])
    assert values(unit, "IPAddressDeny") == []


def test_template_instances_get_their_own_identity_and_state() -> None:
    template, single = load(TEMPLATE), load(SINGLE)
    replica_id = environment(template)["LASTWORD_REPLICA_ID"]
    state = last(template, "StateDirectory")
    assert "%i" in replica_id and "%i" in state
    assert replica_id.replace("%i", "1") != replica_id.replace("%i", "2")
    assert "-/etc/lastword/lastword-%i.env" in values(template, "EnvironmentFile")
    # Shared settings first, so the instance's file overrides them.
    files = values(template, "EnvironmentFile")
    assert files.index("-/etc/lastword/lastword.env") < files.index(
        "-/etc/lastword/lastword-%i.env"
    )
    # With DynamicUser= the single unit's /var/lib/lastword is a symlink into /var/lib/private,
    # so a replica's state may not live below it.
    single_state = last(single, "StateDirectory")
    assert state.split("/")[0] != single_state.split("/")[0]


def test_both_units_share_everything_but_the_instance_parts() -> None:
    def service(unit: Unit) -> list[tuple[str, str]]:
        return [(k, v) for k, v in unit["Service"] if k not in PER_INSTANCE_KEYS]

    template, single = load(TEMPLATE), load(SINGLE)
    assert service(template) == service(single)
    assert [e for e in template["Unit"] if e[0] != "Description"] == [
        e for e in single["Unit"] if e[0] != "Description"
    ]
    assert template["Install"] == single["Install"]
    assert {k: v for k, v in environment(template).items() if k != "LASTWORD_REPLICA_ID"} == {
        k: v for k, v in environment(single).items() if k != "LASTWORD_REPLICA_ID"
    }
