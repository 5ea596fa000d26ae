"""Static checks of the deployment files: docker-compose.yml, Dockerfile, .dockerignore.

No Docker engine is needed. The compose file is validated against the Compose
specification's JSON schema, its service graph and secrets are checked, and every command
it runs (service commands, healthchecks, the Dockerfile's CMD) must resolve to a real
entry point of this project or of the image that runs it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SHARED_SCHEMA = Path(__file__).resolve().parents[2] / "shared" / "schemas" / "compose-spec.json"
BUNDLED_SCHEMA = Path(__file__).resolve().parent / "data" / "compose-spec.json"

IMAGE = "agentstate:latest"
APP_SERVICES = {"migrate", "worker", "beat", "flower"}  # built from this repository
ONE_SHOT = {"migrate"}
# Opt-in with `docker compose --profile NAME`: a plain `up` starts none of them.
PROFILE_SERVICES = {"rabbitmq": "rabbitmq", "pgbouncer": "pgbouncer"}
EXPECTED_SERVICES = {"redis", "postgres", *APP_SERVICES, *PROFILE_SERVICES}
HEALTHY = "service_healthy"
COMPLETED = "service_completed_successfully"
EXPECTED_DEPENDS_ON = {
    "migrate": {"postgres": HEALTHY},
    "worker": {"redis": HEALTHY, "postgres": HEALTHY, "migrate": COMPLETED},
    "beat": {"redis": HEALTHY, "postgres": HEALTHY, "migrate": COMPLETED},
    "flower": {"redis": HEALTHY},
    "pgbouncer": {"postgres": HEALTHY},
}
# Programs of the third-party images, by service (the app image's are resolved below).
THIRD_PARTY_PROGRAMS = {
    "redis": {"redis-server", "redis-cli"},
    "postgres": {"pg_isready"},
    "rabbitmq": {"rabbitmq-diagnostics"},
    "pgbouncer": {"pg_isready"},
}
# Values for the required variables when interpolating the file as Compose would.
TEST_ENV = {"POSTGRES_PASSWORD": "pw-for-tests", "FLOWER_BASIC_AUTH": "admin:pw-for-tests"}
SHELL_OPERATORS = {">", ">>", "2>", "2>&1", "|", "||", "&&", ";"}
HELP_TIMEOUT_S = 60


# -- loading -------------------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def compose_schema_path() -> Path:
    """The shared schema when this checkout sits next to it, else the bundled copy."""
    return SHARED_SCHEMA if SHARED_SCHEMA.is_file() else BUNDLED_SCHEMA


def schema_validator(path: Path) -> jsonschema.protocols.Validator:
    """A validator of the draft the schema declares (its ``$schema``)."""
    schema = json.loads(path.read_text(encoding="utf-8"))
    declared = schema["$schema"]
    # The Compose schema spells Draft 7 as https://json-schema.org/draft-07/schema; the
    # metaschema's own id is http://json-schema.org/draft-07/schema#.
    canonical = declared.replace("https://", "http://", 1).rstrip("#") + "#"
    cls = jsonschema.validators.validator_for({"$schema": canonical}, default=None)
    assert cls is not None, f"{path}: unknown $schema {declared!r}"
    cls.check_schema(schema)
    return cls(schema)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued instruction"
    return instructions


def dockerfile_cmd() -> list[str]:
    cmds = [args for keyword, args in dockerfile_instructions() if keyword == "CMD"]
    assert cmds, "the Dockerfile has no CMD"
    cmd = json.loads(cmds[-1])  # exec form: signals reach Celery directly
    assert isinstance(cmd, list) and all(isinstance(part, str) for part in cmd)
    return cmd


# -- compose helpers ---------------------------------------------------------------------


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation (enough of it for this file)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        current = env.get(name)
        unset_or_empty = not current
        if op in (":-", "-"):
            use_default = unset_or_empty if op == ":-" else current is None
            return arg if use_default else str(current)
        if op in (":?", "?"):
            missing = unset_or_empty if op == ":?" else current is None
            if missing:
                raise KeyError(f"required variable {name} is missing: {arg}")
            return str(current)
        if op in (":+", "+"):
            present = not unset_or_empty if op == ":+" else current is not None
            return arg if present else ""
        return current or ""

    return _VARIABLE.sub(replace, value)


def walk_strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(key)
            yield from walk_strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk_strings(item)


def as_argv(command: str | list[str]) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def healthcheck_argv(test: str | list[str]) -> list[str]:
    """The program a healthcheck runs (shell redirections and operators cut off)."""
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    kind, *rest = test
    assert kind in ("CMD", "CMD-SHELL"), f"healthcheck test must be CMD or CMD-SHELL: {test}"
    if kind == "CMD":
        return rest
    (script,) = rest
    words = shlex.split(script)
    for index, word in enumerate(words):
        if word in SHELL_OPERATORS or word.startswith((">", "2>")):
            return words[:index]
    return words


def commands() -> list[tuple[str, list[str]]]:
    """Every (where, argv) the deployment runs."""
    found = [("Dockerfile CMD", dockerfile_cmd())]
    for name, service in services().items():
        if "command" in service:
            found.append((f"{name}.command", as_argv(service["command"])))
        test = (service.get("healthcheck") or {}).get("test")
        if test and test != ["NONE"]:
            found.append((f"{name}.healthcheck", healthcheck_argv(test)))
    return found


def seconds(duration: str | int) -> float:
    """A Compose duration ("1m30s", "500ms", "10s") in seconds."""
    if isinstance(duration, int):
        return duration / 1e9  # bare integers are nanoseconds
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


# -- the compose file --------------------------------------------------------------------


def test_compose_validates_against_the_compose_spec() -> None:
    data = compose()
    assert "version" not in data, "the Compose spec has no top-level version: key"
    validator = schema_validator(compose_schema_path())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_bundled_schema_copy_also_validates() -> None:
    """A clean clone without ../shared falls back to tests/data/compose-spec.json."""
    assert BUNDLED_SCHEMA.is_file(), f"missing {BUNDLED_SCHEMA}"
    errors = list(schema_validator(BUNDLED_SCHEMA).iter_errors(compose()))
    assert not errors, [e.message for e in errors]


def test_services_and_shared_image() -> None:
    assert set(services()) == EXPECTED_SERVICES
    for name in APP_SERVICES:
        service = services()[name]
        build = service.get("build")
        context = build.get("context") if isinstance(build, dict) else build
        assert context in (".", "./"), f"{name} must build from the repository root"
        assert service.get("image") == IMAGE, f"{name} must use the shared image {IMAGE}"
    assert services()["redis"]["image"].startswith("redis:7")
    assert services()["postgres"]["image"].startswith("postgres:15")
    # Quorum queues and their at-least-once dead lettering (delayed delivery): 3.10+.
    assert re.match(r"rabbitmq:(3\.1[0-9]|[4-9]\.)", services()["rabbitmq"]["image"])
    assert "pgbouncer" in services()["pgbouncer"]["image"]


def test_production_profiles_are_opt_in_and_switch_the_app_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from config.brokers import QuorumAmqpBroker, broker_for
    from config.settings import DbPooler, Settings

    for name, service in services().items():
        expected = [PROFILE_SERVICES[name]] if name in PROFILE_SERVICES else None
        assert service.get("profiles") == expected, f"{name}.profiles"
    bouncer = environment(services()["pgbouncer"])
    assert bouncer["POOL_MODE"] == "transaction" and bouncer["DB_HOST"] == "postgres"
    # What the README tells operators to set with both profiles on.
    chosen = {
        **TEST_ENV,
        "AGENTSTATE_BROKER_URL": "amqp://rabbitmq:5672//",
        "AGENTSTATE_DB_HOST": "pgbouncer",
        "AGENTSTATE_DB_POOLER": "pgbouncer",
    }
    env = {k: interpolate(v, chosen) for k, v in environment(services()["worker"]).items()}
    for key in [k for k in os.environ if k.startswith("AGENTSTATE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.broker_url.startswith("amqp://rabbitmq:")
    assert isinstance(broker_for(settings), QuorumAmqpBroker)
    assert "@pgbouncer:5432/" in settings.database_url
    assert settings.db_pooler == DbPooler.PGBOUNCER


def test_depends_on_names_real_services_with_the_right_conditions() -> None:
    all_services = services()
    for name, service in all_services.items():
        depends_on = service.get("depends_on") or {}
        assert isinstance(depends_on, dict), f"{name}: use the long depends_on form"
        for dependency, spec in depends_on.items():
            assert dependency in all_services, f"{name} depends on unknown {dependency!r}"
            assert dependency != name, f"{name} depends on itself"
            condition = (spec or {}).get("condition")
            target = all_services[dependency]
            if dependency in ONE_SHOT:
                assert condition == COMPLETED, f"{name} -> {dependency}: wait for it to finish"
            else:
                assert condition == HEALTHY, f"{name} -> {dependency}: wait until healthy"
                assert target.get("healthcheck"), f"{dependency} has no healthcheck to wait for"
        expected = EXPECTED_DEPENDS_ON.get(name, {})
        actual = {dep: (spec or {}).get("condition") for dep, spec in depends_on.items()}
        assert actual == expected, f"{name}.depends_on"
    # No cycles: Compose could never start them.
    order: list[str] = []
    pending = dict.fromkeys(all_services)
    while pending:
        ready = [n for n in pending if set(all_services[n].get("depends_on") or {}).issubset(order)]
        assert ready, f"depends_on cycle among {sorted(pending)}"
        order += ready
        for n in ready:
            del pending[n]


def test_migrate_is_one_shot() -> None:
    migrate = services()["migrate"]
    assert as_argv(migrate["command"]) == ["agentstate", "db", "upgrade"]
    assert migrate.get("restart") == "no"
    assert "deploy" not in migrate or migrate["deploy"].get("replicas", 1) == 1


def test_worker_scales_horizontally() -> None:
    worker = services()["worker"]
    assert "container_name" not in worker, "container_name prevents --scale worker=N"
    assert "hostname" not in worker, "a fixed hostname gives every replica one node name"
    assert not worker.get("ports"), "a host port prevents --scale worker=N"
    assert as_argv(worker["command"])[:4] == ["celery", "-A", "tasks", "worker"]


def test_beat_runs_exactly_once() -> None:
    beat = services()["beat"]
    assert as_argv(beat["command"])[:4] == ["celery", "-A", "tasks", "beat"]
    replicas = (beat.get("deploy") or {}).get("replicas", 1)
    assert replicas == 1, "two beats run every periodic sweep twice"
    assert beat.get("scale", 1) == 1


def test_flower_auth_comes_from_the_environment() -> None:
    flower = services()["flower"]
    auth = environment(flower).get("FLOWER_BASIC_AUTH")
    assert auth is not None, "flower must set FLOWER_BASIC_AUTH"
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]*\}", auth), (
        f"FLOWER_BASIC_AUTH must be a required variable with no default, not {auth!r}"
    )
    with pytest.raises(KeyError):
        interpolate(auth, {})


def test_flower_port_matches_publish_and_healthcheck() -> None:
    flower = services()["flower"]
    argv = as_argv(flower["command"])
    assert argv[:4] == ["celery", "-A", "tasks", "flower"]
    ports = [a.split("=", 1)[1] for a in argv if a.startswith("--port=")]
    assert ports, "flower needs an explicit --port"
    port = ports[0]
    published = [interpolate(str(p), {}).rsplit(":", 1)[-1] for p in flower.get("ports", [])]
    assert port in published, f"flower listens on {port} but publishes {published}"
    test = " ".join(healthcheck_argv(flower["healthcheck"]["test"]))
    assert f"localhost:{port}/healthcheck" in test
    from flower.urls import handlers

    routes = [
        (h[0], h[1]) if isinstance(h, tuple) else (h.regex.pattern, h.target) for h in handlers
    ]
    assert any(
        re.fullmatch(pattern.rstrip("$"), "/healthcheck") and target.__name__ == "Healthcheck"
        for pattern, target in routes
    ), "this Flower serves no /healthcheck"


def test_no_secret_is_committed() -> None:
    for name, service in services().items():
        for key, value in environment(service).items():
            if re.search(r"PASSWORD|SECRET|TOKEN|BASIC_AUTH", key):
                assert re.fullmatch(r"\$\{[A-Za-z_]+:\?[^}]*\}", value), (
                    f"{name}.{key} must come from a required variable, not {value!r}"
                )
    for text in walk_strings(compose()):
        for match in re.finditer(r"://[^:/@\s]*:(?P<password>[^@\s]*)@", text):
            password = match.group("password")
            assert re.fullmatch(r"\$\{[A-Za-z_]+:\?[^}]*\}", password), (
                f"a URL carries a literal password: {text!r}"
            )
    # Without the variables, interpolation fails instead of using a default.
    for variable in TEST_ENV:
        env = {k: v for k, v in TEST_ENV.items() if k != variable}
        with pytest.raises(KeyError, match=variable):
            for text in walk_strings(services()):
                interpolate(text, env)


def test_environment_configures_agentstate_against_the_compose_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy.engine import make_url

    from config.settings import Settings

    fields = set(Settings.model_fields)
    postgres_env = {
        k: interpolate(v, TEST_ENV) for k, v in environment(services()["postgres"]).items()
    }
    for name in APP_SERVICES:
        env = {k: interpolate(v, TEST_ENV) for k, v in environment(services()[name]).items()}
        for key in env:
            if key.startswith("AGENTSTATE_"):
                assert key.removeprefix("AGENTSTATE_").lower() in fields, f"{name}: {key}?"
        # Settings read exactly what the container's environment holds.
        for key in [k for k in os.environ if k.startswith("AGENTSTATE_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = Settings()
        database = make_url(settings.database_url)
        assert database.drivername == "postgresql+psycopg2"
        assert database.host in services(), f"{name}: database host {database.host}"
        assert database.username == postgres_env["POSTGRES_USER"]
        assert database.password == postgres_env["POSTGRES_PASSWORD"]
        assert database.database == postgres_env["POSTGRES_DB"]
        assert (database.port or 5432) == 5432
        for url in {settings.redis_url, settings.broker_url}:
            host = re.match(r"redis://(?:[^@/]*@)?(?P<host>[^:/]+)", url)
            assert host and host.group("host") in services(), f"{name}: {url}"


def test_redis_is_private_and_disposable() -> None:
    redis = services()["redis"]
    assert not redis.get("ports"), "Redis has no password: do not publish its port"
    argv = as_argv(redis.get("command", ["redis-server"]))
    assert argv[0] == "redis-server"


def test_postgres_service() -> None:
    postgres = services()["postgres"]
    env = environment(postgres)
    assert env["POSTGRES_USER"] == "agentstate"
    assert env["POSTGRES_DB"] == "agentstate"
    volumes = [str(v).split(":", 1)[0] for v in postgres.get("volumes", [])]
    named = [v for v in volumes if v in (compose().get("volumes") or {})]
    assert named, "postgres data must live in a named volume"


def test_long_running_services_have_healthchecks() -> None:
    for name, service in services().items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), f"{name} disables its healthcheck"
        assert check.get("test") not in (None, ["NONE"]), f"{name} healthcheck runs nothing"
        interval, timeout = seconds(check["interval"]), seconds(check["timeout"])
        assert 0 < timeout <= interval, f"{name}: timeout {timeout}s, interval {interval}s"
        assert "start_period" in check, f"{name}: give it a start_period"
        # A healthcheck runs in the container: `$$` keeps a variable from being
        # interpolated by Compose on the host.
        for text in walk_strings(check["test"]):
            assert "$" not in text.replace("$$", ""), f"{name}: write $$VAR in {text!r}"
    worker_test = " ".join(walk_strings(services()["worker"]["healthcheck"]["test"]))
    assert "inspect ping" in worker_test
    assert "-d celery@$$HOSTNAME" in worker_test, "ping this worker, not any worker"


# -- commands resolve ----------------------------------------------------------------------


def celery_help(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    return subprocess.run(
        [sys.executable, "-m", "celery", *argv[1:], "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=False,
    )


def check_celery_command(where: str, argv: list[str]) -> None:
    import flower  # noqa: F401  (installed: it registers `celery flower`)
    from celery import Celery
    from celery.bin.celery import celery as celery_group
    from celery.worker.control import Panel

    import tasks

    assert argv[1:3] == ["-A", "tasks"], f"{where}: {argv} must load the app with -A tasks"
    assert isinstance(tasks.app, Celery), "tasks.app is not a Celery app"
    sub = argv[3]
    assert sub in celery_group.commands, f"{where}: no celery subcommand {sub!r}"
    if sub == "flower":
        # Flower hands its options to tornado, which --help does not check.
        from flower.options import options as flower_options

        for arg in argv[4:]:
            if arg.startswith("--"):
                name = arg[2:].split("=", 1)[0].replace("_", "-")
                assert name in flower_options._options, f"{where}: no flower option {arg}"
    if sub == "inspect":
        method = argv[4]
        assert method in Panel.meta and Panel.meta[method].type == "inspect", (
            f"{where}: no inspect command {method!r}"
        )
    result = celery_help([part.replace("$$HOSTNAME", "node") for part in argv])
    assert result.returncode == 0, f"{where}: {argv} --help failed:\n{result.stderr}"


def check_agentstate_command(where: str, argv: list[str]) -> None:
    import importlib

    from tasks.cli import build_parser

    target = pyproject()["project"]["scripts"].get("agentstate")
    assert target, "pyproject.toml has no [project.scripts] agentstate"
    module_name, _, function = target.partition(":")
    assert callable(getattr(importlib.import_module(module_name), function))
    args = build_parser().parse_args(argv[1:])
    assert hasattr(args, "handler"), f"{where}: {argv} names no command"


def check_python_command(where: str, argv: list[str]) -> None:
    assert argv[1] == "-c", f"{where}: only python -c is expected"
    compile(argv[2], where, "exec")


def app_commands() -> list[tuple[str, list[str]]]:
    return [
        (where, argv)
        for where, argv in commands()
        if where == "Dockerfile CMD" or where.split(".")[0] in APP_SERVICES
    ]


@pytest.mark.parametrize(
    ("where", "argv"), app_commands(), ids=[where for where, _ in app_commands()]
)
def test_app_commands_resolve_to_entry_points(where: str, argv: list[str]) -> None:
    program = argv[0]
    if program == "celery":
        dependencies = pyproject()["project"]["dependencies"]
        assert any(re.match(r"celery\b", dep) for dep in dependencies)
        check_celery_command(where, argv)
    elif program == "agentstate":
        check_agentstate_command(where, argv)
    elif program == "python":
        check_python_command(where, argv)
    else:
        pytest.fail(f"{where}: {program!r} is not a program of the agentstate image")


def test_third_party_commands_exist_in_their_images() -> None:
    for where, argv in commands():
        service = where.split(".")[0]
        if service in THIRD_PARTY_PROGRAMS:
            assert argv[0] in THIRD_PARTY_PROGRAMS[service], f"{where}: {argv[0]!r}?"
    assert healthcheck_argv(services()["postgres"]["healthcheck"]["test"]) == [
        "pg_isready",
        "-U",
        "agentstate",
        "-d",
        "agentstate",
    ]
    assert healthcheck_argv(services()["redis"]["healthcheck"]["test"]) == ["redis-cli", "ping"]


def run_beat_healthcheck(tmp_path: Path) -> int:
    code = healthcheck_argv(services()["beat"]["healthcheck"]["test"])[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    env["TMPDIR"] = str(tmp_path)  # where the app puts the beat schedule
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.returncode


def test_beat_healthcheck_follows_the_schedule_file(tmp_path: Path) -> None:
    import tasks

    name = Path(tasks.app.conf.beat_schedule_filename).name
    assert run_beat_healthcheck(tmp_path) == 1, "healthy without a schedule file"
    schedule = tmp_path / f"{name}.dat"
    schedule.write_bytes(b"")
    assert run_beat_healthcheck(tmp_path) == 0, "unhealthy with a fresh schedule file"
    stale = time.time() - 3600
    os.utime(schedule, (stale, stale))
    assert run_beat_healthcheck(tmp_path) == 1, "healthy with an hour-old schedule file"


# -- the Dockerfile ----------------------------------------------------------------------


def dockerignored(path: str) -> bool:
    """Whether .dockerignore drops ``path`` (Docker's rules, approximately: last match
    wins, ``!`` re-includes, a matched directory drops everything below it)."""
    if not DOCKERIGNORE.is_file():
        return False
    patterns = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            patterns.append((negate, line.lstrip("!").strip().strip("/")))
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negate, pattern in patterns:
        variants = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        if any(fnmatch.fnmatchcase(p, v) for p in prefixes for v in variants):
            ignored = not negate
    return ignored


def test_dockerfile_base_user_and_install() -> None:
    instructions = dockerfile_instructions()
    keywords = [keyword for keyword, _ in instructions]
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert froms and froms[-1].split()[0] == "python:3.11-slim"
    envs = " ".join(args for keyword, args in instructions if keyword == "ENV")
    assert re.search(r"\bPYTHONUNBUFFERED=1\b", envs)

    installs = [
        i
        for i, (keyword, args) in enumerate(instructions)
        if keyword == "RUN" and re.search(r"\bpip install\b[^&;|]*\s\.(\s|$)", args)
    ]
    assert installs, "the Dockerfile never runs `pip install .`"
    users = [i for i, keyword in enumerate(keywords) if keyword == "USER"]
    assert users, "the Dockerfile has no USER: the container would run as root"
    last_user = instructions[users[-1]][1].split(":")[0]
    assert last_user not in ("root", "0"), "the final USER is root"
    assert users[-1] > installs[-1], "switch to the unprivileged USER after installing"
    assert users[-1] < keywords.index("CMD")


def test_dockerfile_copies_what_the_build_needs() -> None:
    copies: list[tuple[int, list[str]]] = []
    for index, (keyword, args) in enumerate(dockerfile_instructions()):
        if keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            assert len(words) >= 2, f"{keyword} {args}"
            copies.append((index, words[:-1]))
    copied = {source.rstrip("/"): index for index, sources in copies for source in sources}

    for source in copied:
        path = ROOT / source
        assert path.exists(), f"COPY source {source} does not exist in the repository"
        assert not dockerignored(source), f".dockerignore drops COPY source {source}"
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            if file.is_file() and "__pycache__" not in file.parts:
                assert not dockerignored(relative), f".dockerignore drops {relative}"

    project = pyproject()
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed = {p.rstrip("*").rstrip(".") for p in packages} | {"pyproject.toml", "alembic.ini"}
    needed.add(project["project"]["readme"])
    assert needed <= set(copied), f"not copied: {sorted(needed - set(copied))}"
    # Metadata before the packages, so dependency layers survive code changes.
    assert copied["pyproject.toml"] < min(copied[p.rstrip("*").rstrip(".")] for p in packages)
