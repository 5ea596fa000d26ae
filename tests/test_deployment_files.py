"""Static checks of the deployment files: docker-compose.yml, Dockerfile, .dockerignore.

No Docker engine is needed. The compose file is validated against the Compose
specification's JSON schema, its service graph and secrets are checked, and every command
it runs (service commands, healthchecks, the Dockerfile's CMD) must resolve to a real
entry point of this project or of the image that runs it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

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
APP_SERVICES = {"migrate", "worker", "beat", "flower", "api"}  # built from this repository
ONE_SHOT = {"migrate"}
# Opt-in with `docker compose --profile NAME`: a plain `up` starts none of them.
PROFILE_SERVICES = {
    "rabbitmq": "rabbitmq",
    "pgbouncer": "pgbouncer",
    "prometheus": "observability",
    "grafana": "observability",
}
EXPECTED_SERVICES = {"redis", "postgres", *APP_SERVICES, *PROFILE_SERVICES}
HEALTHY = "service_healthy"
COMPLETED = "service_completed_successfully"
EXPECTED_DEPENDS_ON = {
    "migrate": {"postgres": HEALTHY},
    "worker": {"redis": HEALTHY, "postgres": HEALTHY, "migrate": COMPLETED},
    "beat": {"redis": HEALTHY, "postgres": HEALTHY, "migrate": COMPLETED},
    "flower": {"redis": HEALTHY},
    "api": {"redis": HEALTHY, "postgres": HEALTHY, "migrate": COMPLETED},
    "pgbouncer": {"postgres": HEALTHY},
    "grafana": {"prometheus": HEALTHY},
}
# Programs of the third-party images, by service (the app image's are resolved below).
THIRD_PARTY_PROGRAMS = {
    "redis": {"sh", "redis-server", "redis-cli"},
    "postgres": {"postgres", "pg_isready"},
    "rabbitmq": {"rabbitmq-diagnostics"},
    "pgbouncer": {"pg_isready"},
    "prometheus": {"wget"},
    "grafana": {"wget"},
}
# Values for the required variables when interpolating the file as Compose would.
TEST_ENV = {"FLOWER_BASIC_AUTH": "admin:pw-for-tests"}
SECRETS_DIR = "/run/secrets/"
LOCK_FILE = ROOT / "requirements.lock"
DIGEST_PINNED = re.compile(r"[a-z0-9._/-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}")
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
    while words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]  # VAR=value before the program: the program's environment
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
    worker = {
        k: interpolate(v, {**TEST_ENV, "AGENTSTATE_DB_POOLER": "pgbouncer"})
        for k, v in environment(services()["worker"]).items()
    }
    assert worker["AGENTSTATE_DB_POOLER"] == "pgbouncer"
    # What the README tells operators to put in the secrets with both profiles on.
    for key in [k for k in os.environ if k.startswith("AGENTSTATE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AGENTSTATE_BROKER_URL", "amqp://rabbitmq:5672//")
    monkeypatch.setenv("AGENTSTATE_DATABASE_URL", "postgresql+psycopg2://a:b@pgbouncer:5432/a")
    monkeypatch.setenv("AGENTSTATE_DB_POOLER", worker["AGENTSTATE_DB_POOLER"])
    settings = Settings()
    assert isinstance(broker_for(settings), QuorumAmqpBroker)
    assert settings.db_pooler == DbPooler.PGBOUNCER


# Where the project tells people how to start it: the README and the docs pages.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def docs_text() -> str:
    return "\n".join(path.read_text() for path in DOCS)


def readme_compose_commands() -> list[str]:
    """Each shell command of the README and the docs (in their code blocks, continuation
    lines joined, and in their inline code) that runs ``docker compose``."""
    text = docs_text()
    blocks = re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    lines += re.findall(r"`([^`\n]*docker compose[^`\n]*)`", text)
    return [line.split("#")[0] for line in lines if "docker compose" in line]


def test_every_variable_a_readme_compose_command_sets_is_read_by_the_compose_file() -> None:
    commands = readme_compose_commands()
    assert len(commands) >= 2, commands  # the plain start and the production profiles
    read = {m.group("name") for text in walk_strings(compose()) for m in _VARIABLE.finditer(text)}
    read.discard(None)
    for command in commands:
        words = shlex.split(command)
        assigned = []
        for word in words[: words.index("docker")]:
            assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word), f"README: {command!r}"
            assigned.append(word.split("=", 1)[0])
        unread = [name for name in assigned if name not in read]
        assert not unread, f"README sets {unread}, which docker-compose.yml never reads"
        profiles = [words[i + 1] for i, word in enumerate(words) if word == "--profile"]
        assert set(profiles) <= set(PROFILE_SERVICES.values()), profiles
    # The secret files the README writes are ones the compose file declares.
    written = re.findall(r">\s*secrets/([\w-]+)", docs_text())
    assert written and set(written) <= set(declared_secrets()), written


def test_the_readme_production_profiles_command_reaches_rabbitmq_and_pgbouncer(
    secret_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from config.brokers import QuorumAmqpBroker, broker_for
    from config.settings import DbPooler

    secret_files = Path(shutil.copytree(secret_files, tmp_path / "secrets"))
    (command,) = [c for c in readme_compose_commands() if "--profile rabbitmq" in c]
    words = shlex.split(command.replace('"$(cat secrets/postgres_password)"', "pw"))
    variables = dict(w.split("=", 1) for w in words[: words.index("docker")])
    (secret_files / "broker_url").write_text("amqp://rabbitmq:5672//\n")  # as the README does
    monkeypatch.setitem(TEST_ENV, "APP_DATABASE_SECRET", variables["APP_DATABASE_SECRET"])
    monkeypatch.setitem(TEST_ENV, "AGENTSTATE_DB_POOLER", variables["AGENTSTATE_DB_POOLER"])
    settings, _ = container_settings("worker", secret_files, monkeypatch)
    assert isinstance(broker_for(settings), QuorumAmqpBroker)
    assert settings.db_pooler == DbPooler.PGBOUNCER
    assert "@pgbouncer:5432/" in settings.database_url
    assert "@redis:6379/" in settings.redis_url  # locks and cache stay on Redis
    migrate, _ = container_settings("migrate", secret_files, monkeypatch)
    assert "@postgres:5432/" in migrate.database_url  # the schema goes to Postgres directly
    assert interpolate(environment(services()["pgbouncer"])["DB_PASSWORD"], variables) == "pw"


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


def test_api_serves_with_keys_on_the_port_it_publishes_and_checks() -> None:
    api = services()["api"]
    argv = as_argv(api["command"])
    assert argv[:2] == ["agentstate", "serve"]
    port = argv[argv.index("--port") + 1]
    host = argv[argv.index("--host") + 1]
    published = [interpolate(str(p), {}) for p in api.get("ports", [])]
    assert published == [f"127.0.0.1:{port}:{port}"], "publish on localhost unless told"
    test = " ".join(healthcheck_argv(api["healthcheck"]["test"]))
    assert f"localhost:{port}/readyz" in test
    # Listening on every address of the container needs keys (serve refuses otherwise).
    assert host == "0.0.0.0"
    assert environment(api)["AGENTSTATE_API_KEYS_FILE"] == f"{SECRETS_DIR}api_keys"
    assert "api_keys" in mounted_secrets(api)
    from tasks.server.app import create_app

    assert {"/readyz", "/healthz"} <= set(create_app().openapi()["paths"])


def test_api_settings_hold_the_operator_key_from_its_secret(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _ = container_settings("api", secret_files, monkeypatch)
    assert list(settings.api_key_users.values()) == ["*"]
    from tasks.server.serve import check_host

    check_host("0.0.0.0", settings)  # keys are set: every address is allowed


def declared_secrets() -> dict[str, dict[str, Any]]:
    return compose().get("secrets") or {}


def mounted_secrets(service: dict[str, Any]) -> set[str]:
    return {
        item if isinstance(item, str) else item["source"] for item in service.get("secrets", [])
    }


def test_no_secret_is_committed() -> None:
    for name, service in services().items():
        if name in PROFILE_SERVICES:
            continue  # opt-in profiles: their operator sets their credentials (see compose)
        for key, value in environment(service).items():
            if key.endswith("_FILE"):
                continue  # a path to a secret file (checked below)
            if re.search(r"PASSWORD|SECRET|TOKEN|BASIC_AUTH|_URL$", key):
                assert re.fullmatch(r"\$\{[A-Za-z_]+:\?[^}]*\}", value), (
                    f"{name}.{key} must come from a secret file or a required variable"
                )
    for text in walk_strings(compose()):
        assert not re.search(r"://[^:/@\s]*:[^@\s]*@", text), f"a URL with a password: {text!r}"
        assert "--requirepass" not in text, "a password on a command line shows in ps"
    # Without the variables, interpolation fails instead of using a default.
    for variable in TEST_ENV:
        env = {k: v for k, v in TEST_ENV.items() if k != variable}
        with pytest.raises(KeyError, match=variable):
            for text in walk_strings(services()):
                interpolate(text, env)


def test_secrets_are_files_outside_git_and_the_image() -> None:
    assert declared_secrets(), "no top-level secrets"
    gitignore = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    for name, secret in declared_secrets().items():
        path = Path(str(secret.get("file", "")))
        assert path.parts[:2] == (".", "secrets") or path.parts[0] == "secrets", (name, path)
        assert dockerignored(path.as_posix().removeprefix("./")), f"{path} would enter the image"
        assert any(line.strip().strip("/") == "secrets" for line in gitignore), ".gitignore"
    choices = [TEST_ENV, {**TEST_ENV, "APP_DATABASE_SECRET": "pgbouncer_database_url"}]
    for name, service in services().items():
        mounted = mounted_secrets(service)
        assert mounted <= set(declared_secrets()), f"{name} mounts undeclared secrets"
        for key, raw in environment(service).items():
            if not key.endswith("_FILE"):
                continue
            for env in choices:  # whichever secret a variable picks is mounted
                value = interpolate(raw, env)
                assert value.startswith(SECRETS_DIR), f"{name}.{key}: {value}"
                assert value.removeprefix(SECRETS_DIR) in mounted, f"{name}.{key} not mounted"


@pytest.fixture(scope="module")
def secret_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What scripts/make-secrets.sh creates (as an operator would, once)."""
    folder = tmp_path_factory.mktemp("secrets")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "make-secrets.sh"), str(folder)],
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return folder


def test_make_secrets_creates_every_secret_once(secret_files: Path) -> None:
    assert {p.name for p in secret_files.iterdir()} == set(declared_secrets())
    assert (secret_files.stat().st_mode & 0o777) == 0o700
    before = {p.name: p.read_text() for p in secret_files.iterdir()}
    again = subprocess.run(
        ["bash", str(ROOT / "scripts" / "make-secrets.sh"), str(secret_files)],
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=True,
    )
    assert {p.name: p.read_text() for p in secret_files.iterdir()} == before, "overwritten"
    assert again.stdout == ""
    for text in before.values():
        assert text.strip() not in again.stdout + again.stderr


def container_settings(
    name: str, secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, dict[str, str]]:
    """Settings as the service's container reads them (its secrets at their paths)."""
    from config.settings import Settings, get_settings

    env = {k: interpolate(v, TEST_ENV) for k, v in environment(services()[name]).items()}
    for key in [k for k in os.environ if k.startswith("AGENTSTATE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        in_container = value.removeprefix(SECRETS_DIR) if key.endswith("_FILE") else None
        monkeypatch.setenv(key, str(secret_files / in_container) if in_container else value)
    get_settings.cache_clear()
    return Settings(), env


def test_environment_configures_agentstate_against_the_compose_services(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.engine import make_url

    from config.settings import Settings

    fields = set(Settings.model_fields)
    postgres_env = environment(services()["postgres"])
    postgres_password = (secret_files / "postgres_password").read_text().strip()
    redis_password = (secret_files / "redis_password").read_text().strip()
    for name in APP_SERVICES:
        settings, env = container_settings(name, secret_files, monkeypatch)
        for key in env:
            if key.startswith("AGENTSTATE_"):
                assert key.removeprefix("AGENTSTATE_").lower() in fields, f"{name}: {key}?"
        if name != "migrate":  # it upgrades the schema and needs nothing else
            redis = re.match(r"redis://:(?P<pw>[^@]*)@(?P<host>[^:/]+)", settings.broker_url)
            assert redis and redis.group("host") in services(), f"{name}: broker host"
            assert unquote(redis.group("pw")) == redis_password, f"{name}: broker password"
        if name == "flower":
            continue  # the broker only (see below)
        database = make_url(settings.database_url)
        assert database.drivername == "postgresql+psycopg2"
        assert database.host in services(), f"{name}: database host {database.host}"
        assert database.username == postgres_env["POSTGRES_USER"]
        assert database.password == postgres_password
        assert database.database == postgres_env["POSTGRES_DB"]
        assert (database.port or 5432) == 5432
        if name != "migrate":
            assert settings.redis_url == settings.broker_url, f"{name}: cache URL"


def test_flower_gets_the_broker_and_no_database_url(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flower = services()["flower"]
    assert "database_url" not in mounted_secrets(flower)
    assert not [key for key in environment(flower) if "DATABASE" in key]
    settings, _ = container_settings("flower", secret_files, monkeypatch)
    assert settings.database_url.endswith("/agentstate.db")  # the unused default


def test_redis_requires_the_password_from_its_secret() -> None:
    redis = services()["redis"]
    assert not redis.get("ports"), "Redis stays on the project network: publish no port"
    assert "redis_password" in mounted_secrets(redis)
    argv = as_argv(redis["command"])
    assert argv[:2] == ["sh", "-c"]
    script = interpolate(argv[2], {})
    assert script.startswith("exec redis-server ")
    # The password travels on stdin, as a config line read from the secret file.
    assert re.search(r'requirepass "\$\(cat /run/secrets/redis_password\)"', script), script
    head = shlex.split(script.splitlines()[0])
    assert head[-2:] == ["-", "<<EOF"], "redis-server must read its config from stdin"
    assert head[head.index("--save") + 1] == "" and head[head.index("--appendonly") + 1] == "no"
    assert redis.get("user") not in (None, "root", "0"), "redis-server must not run as root"
    test = " ".join(walk_strings(redis["healthcheck"]["test"]))
    assert 'REDISCLI_AUTH="$$(cat /run/secrets/redis_password)"' in test
    assert "grep -q PONG" in test, "an unauthenticated reply (NOAUTH) must count as unhealthy"


def test_redis_reads_a_password_from_stdin_as_compose_runs_it(tmp_path: Path) -> None:
    """The Redis command, run for real by sh against a local redis-server."""
    import redis as redis_py

    from tasks.worker.processes import free_port
    from tests.support import unavailable

    if shutil.which("redis-server") is None:
        unavailable("redis-server")
    password = "Zq7-" + "x" * 20
    (tmp_path / "redis_password").write_text(password + "\n")
    script = interpolate(as_argv(services()["redis"]["command"])[2], {})
    script = script.replace(SECRETS_DIR, f"{tmp_path}/")
    port = free_port()
    script = script.replace(
        "exec redis-server ", f"exec redis-server --port {port} --bind 127.0.0.1 "
    )
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, cwd=tmp_path)
    try:
        client = redis_py.Redis(port=port, password=password, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.ping()
                break
            except redis_py.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=port).ping()
        assert client.config_get("save")["save"] == ""
        assert password not in " ".join(Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0"))
    finally:
        proc.kill()
        proc.wait(timeout=10)


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

    from tasks.cli.main import build_parser

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
    assert froms and re.fullmatch(r"python:3\.11(\.\d+)?-slim@sha256:[0-9a-f]{64}", froms[-1])
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
    needed = {p.rstrip("*").rstrip(".") for p in packages}
    needed |= {"pyproject.toml", "alembic.ini", LOCK_FILE.name}
    needed.add(project["project"]["readme"])
    needed |= set(project["project"].get("license-files", []))  # the build reads them
    assert needed <= set(copied), f"not copied: {sorted(needed - set(copied))}"
    # Metadata before the packages, so dependency layers survive code changes.
    assert copied["pyproject.toml"] < min(copied[p.rstrip("*").rstrip(".")] for p in packages)


def test_the_image_carries_the_apps_own_package(tmp_path: Path) -> None:
    """Getting started says: put your agent's package in the build context's app/ folder.
    The Dockerfile copies that folder onto the image's PYTHONPATH, after the install (a
    change to it rebuilds that layer only); a package laid out as app/README.md says,
    placed as the Dockerfile places it, is then the agent of a process started anywhere."""
    instructions = dockerfile_instructions()
    copies = [
        (index, [w for w in shlex.split(args) if not w.startswith("--")])
        for index, (keyword, args) in enumerate(instructions)
        if keyword == "COPY"
    ]
    (index, words), *more = [(i, w) for i, w in copies if w[0].rstrip("/") == "app"]
    assert not more
    destination = words[-1].rstrip("/")
    assert (ROOT / "app" / "README.md").is_file() and not dockerignored("app")
    environment = " ".join(args for keyword, args in instructions[index:] if keyword == "ENV")
    path = re.search(r"\bPYTHONPATH=(\S+)", environment)
    assert path is not None and destination in path.group(1).split(":")
    installs = [
        i
        for i, (keyword, args) in enumerate(instructions)
        if keyword == "RUN" and "pip install" in args
    ]
    assert index > max(installs)
    started = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "`app/`" in started.split("## 6.", 1)[1]

    image_app = tmp_path / destination.lstrip("/")
    shutil.copytree(ROOT / "app", image_app)
    package = image_app / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(ROOT / "examples" / "shout_agent.py", package / "agent.py")
    elsewhere = tmp_path / "workdir"
    elsewhere.mkdir()
    probe = (
        "from state.agent import load_agent; agent = load_agent('myapp.agent'); "
        "print(agent.name, sorted(h for h, f in agent.handlers.items() if f))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": path.group(1).replace(destination, str(image_app))},
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("myapp.agent [")


def test_the_docs_say_compose_v2() -> None:
    # docker-compose 1.29 refuses the file (no `version:` line): say so where it is used.
    for page in ("docs/getting-started.md", "docs/operations/deployment.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert "Compose v2" in text and "`docker-compose` 1.x" in text, page
    assert "version" not in compose()


# -- pinned images and dependencies ------------------------------------------------------


def test_images_are_pinned_by_digest() -> None:
    for name, service in services().items():
        if name in APP_SERVICES:
            continue  # built here, from the pinned base image below
        image = service["image"]
        if name in PROFILE_SERVICES:
            # Opt-in profiles: pinned by the deployer (the compose file says so).
            assert ":" in image and not image.endswith(":latest"), f"{name}: name a version"
            continue
        assert DIGEST_PINNED.fullmatch(image), f"{name}: pin {image!r} as name:tag@sha256:..."
    froms = [args.split()[0] for keyword, args in dockerfile_instructions() if keyword == "FROM"]
    for image in froms:
        assert DIGEST_PINNED.fullmatch(image), f"Dockerfile FROM {image!r} is not pinned"


def lock_entries() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) from requirements.lock (pip's hash-checking format)."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = LOCK_FILE.read_text(encoding="utf-8").replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(
            r"([A-Za-z0-9._-]+)==([^\s;]+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line
        )
        assert match, f"requirements.lock: not an exact pin with hashes: {line!r}"
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        entries[name] = (match.group(2), re.findall(r"[0-9a-f]{64}", match.group(3)))
    return entries


def test_requirements_lock_pins_every_dependency_with_hashes() -> None:
    entries = lock_entries()
    project = pyproject()
    wanted = project["project"]["dependencies"] + project["build-system"]["requires"]
    # The image runs `agentstate serve` too (the api service): the server extra is locked.
    wanted += project["project"]["optional-dependencies"]["server"]
    for requirement in wanted:
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(?:\[[^]]*\])?==(\S+)", requirement)
        assert match, f"pyproject.toml: {requirement!r} is not an exact pin"
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        assert name in entries, f"requirements.lock lacks {name} (run make lock)"
        assert entries[name][0] == match.group(2), f"{name}: lock and pyproject differ"
    # Every locked package is what this checkout was tested with.
    from importlib.metadata import PackageNotFoundError, version

    for name, (pinned, hashes) in entries.items():
        assert hashes
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue
        if name != "setuptools":  # the venv's own; the image installs the locked one
            assert installed == pinned, f"{name}: tested {installed}, image gets {pinned}"


def test_dockerfile_installs_exactly_the_lock() -> None:
    instructions = dockerfile_instructions()
    runs = [(i, args) for i, (keyword, args) in enumerate(instructions) if keyword == "RUN"]
    hashed = [i for i, args in runs if re.search(r"pip install\b.*--require-hashes", args)]
    assert hashed, "the Dockerfile never installs with --require-hashes"
    assert re.search(rf"-r {LOCK_FILE.name}\b", instructions[hashed[0]][1])
    project = [i for i, args in runs if re.search(r"pip install\b[^&;|]*\s\.(\s|$)", args)]
    assert project and project[-1] > hashed[0]
    project_install = instructions[project[-1]][1]
    for flag in ("--no-deps", "--no-build-isolation", "--no-index"):
        assert flag in project_install, f"pip install . without {flag} could fetch unhashed code"
    other = [
        args for i, args in runs if "pip install" in args and i not in (hashed[0], project[-1])
    ]
    assert not other, f"an unpinned pip install: {other}"


# -- workers: concurrency, connections, memory, time limits ------------------------------


def worker_argv() -> list[str]:
    return as_argv(services()["worker"]["command"])


def option(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    assert values, f"{argv} has no explicit {name}"
    return values[-1]


def mebibytes(size: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])?[bB]?", str(size))
    assert match, f"bad memory size {size!r}"
    factor = {"k": 1 / 1024, "m": 1.0, "g": 1024.0}.get((match.group(2) or "m").lower(), 1.0)
    return float(match.group(1)) * factor


def test_schema_upgrades_run_in_migrate_only(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert as_argv(services()["migrate"]["command"]) == ["agentstate", "db", "upgrade"]
    for name in APP_SERVICES - {"migrate"}:
        settings, _ = container_settings(name, secret_files, monkeypatch)
        if name != "flower":
            assert settings.auto_migrate is False, f"{name} would upgrade the schema too"


def test_database_connections_stay_under_max_connections(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    postgres = as_argv(services()["postgres"]["command"])
    limit = int(postgres[postgres.index("-c") + 1].removeprefix("max_connections="))
    reserved = 3  # superuser_reserved_connections' default
    scaled = re.search(r"--scale worker=(\d+)", COMPOSE_FILE.read_text(encoding="utf-8"))
    total = 0
    for name in APP_SERVICES:
        service = services()[name]
        if "AGENTSTATE_DATABASE_URL_FILE" not in environment(service):
            continue
        settings, _ = container_settings(name, secret_files, monkeypatch)
        replicas = int((service.get("deploy") or {}).get("replicas", 1))
        argv = as_argv(service["command"])
        if name == "worker":
            replicas = max(replicas, int(scaled.group(1)) if scaled else 1)
            processes = int(option(argv, "--concurrency"))
        else:
            processes = 1
        per_engine = settings.db_pool_size + settings.db_max_overflow
        # Two engines per process (state.db.autocommit_engine); `db upgrade` uses one.
        per_process = 1 if argv[:3] == ["agentstate", "db", "upgrade"] else 2 * per_engine
        total += replicas * processes * per_process
    assert total <= limit - reserved, f"{total} connections > {limit} - {reserved}"
    stated = re.search(r"total\s+=\s*(\d+)\s*<=\s*(\d+)", COMPOSE_FILE.read_text())
    assert stated and (int(stated.group(1)), int(stated.group(2))) == (total, limit - reserved)


def test_every_service_has_a_memory_limit_that_fits_its_workers(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = {}
    for name, service in services().items():
        memory = ((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}
        assert memory.get("memory"), f"{name} has no memory limit"
        limits[name] = mebibytes(memory["memory"])
    settings, _ = container_settings("worker", secret_files, monkeypatch)
    children = int(option(worker_argv(), "--concurrency"))
    per_child = settings.worker_max_memory_per_child / 1024
    assert per_child > 0, "worker children are never replaced"
    main_process = 256
    assert limits["worker"] >= children * per_child + main_process, limits["worker"]


def test_workers_have_time_limits_above_the_phase_deadlines(
    secret_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from config.celery import celery_config

    settings, _ = container_settings("worker", secret_files, monkeypatch)
    conf = celery_config(settings)
    assert conf["task_time_limit"] == settings.task_time_limit
    assert conf["task_soft_time_limit"] == settings.task_soft_time_limit
    assert conf["worker_max_memory_per_child"] == settings.worker_max_memory_per_child
    assert settings.task_soft_time_limit < settings.task_time_limit
    assert settings.task_time_limit > max(settings.execution_timeout, settings.lock_timeout)
    assert conf["broker_transport_options"]["visibility_timeout"] > settings.task_time_limit
    assert option(worker_argv(), "--concurrency").isdigit()


# -- scripts/ensure-services.sh ------------------------------------------------------------


def run_ensure_services(
    mode: str, path: Path | None = None, **variables: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    env.update(variables)
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-services.sh"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=False,
    )


@pytest.fixture
def local_services() -> dict[str, str]:
    """The test suite's own services, named both as the app's and as the suite's: they
    must answer."""
    from tests.support import BROKER_URL, PG_SERVER, REDIS_URL, postgres_ok, redis_ok, unavailable

    if not (redis_ok(REDIS_URL) and postgres_ok()):
        unavailable("Redis and PostgreSQL on 127.0.0.1")
    return {
        "AGENTSTATE_REDIS_URL": REDIS_URL,
        "AGENTSTATE_BROKER_URL": BROKER_URL,
        "AGENTSTATE_DATABASE_URL": f"{PG_SERVER}/app",
        "AGENTSTATE_TEST_REDIS_URL": REDIS_URL,
        "AGENTSTATE_TEST_BROKER_URL": BROKER_URL,
        "AGENTSTATE_TEST_PG_SERVER": PG_SERVER,
    }


@pytest.mark.parametrize("mode", ["app", "test"])
def test_ensure_services_passes_when_everything_answers(
    local_services: dict[str, str], mode: str
) -> None:
    result = run_ensure_services(mode, **local_services)
    assert result.returncode == 0, result.stderr
    assert "starting" not in result.stdout


def test_ensure_services_starts_a_local_redis_that_is_not_answering(
    local_services: dict[str, str],
) -> None:
    import redis as redis_py

    from tasks.worker.processes import free_port

    port = free_port()
    try:
        result = run_ensure_services(
            "app", **{**local_services, "AGENTSTATE_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        )
        assert result.returncode == 0, result.stderr
        assert f"starting redis-server on 127.0.0.1:{port}" in result.stdout
        assert redis_py.Redis(port=port).ping()
    finally:
        with contextlib.suppress(redis_py.RedisError):
            redis_py.Redis(port=port).shutdown(nosave=True)


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[Path, Path]:
    """A folder whose ``redis-server`` and ``pg_ctlcluster`` write their arguments to a log
    (the Redis one then starts the real server, so a started service answers)."""
    folder, log = tmp_path / "bin", tmp_path / "calls.log"
    folder.mkdir()
    real_redis = shutil.which("redis-server")
    for name, then in (
        ("redis-server", real_redis and f'exec {real_redis} "$@"'),
        ("pg_ctlcluster", None),
    ):
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{then or "exit 0"}\n')
        script.chmod(0o755)
    return folder, log


def test_make_demo_checks_only_the_apps_own_services(
    local_services: dict[str, str], recorder: tuple[Path, Path]
) -> None:
    """The app's URLs answer, the suite's point at local ports where nothing listens: the
    demo's check starts nothing and names none of the suite's variables."""
    from tasks.worker.processes import free_port

    folder, log = recorder
    dead_redis, dead_postgres = free_port(), free_port()
    suite_elsewhere = {
        "AGENTSTATE_TEST_REDIS_URL": f"redis://127.0.0.1:{dead_redis}/13",
        "AGENTSTATE_TEST_BROKER_URL": f"redis://127.0.0.1:{dead_redis}/14",
        "AGENTSTATE_TEST_PG_SERVER": f"postgresql+psycopg2://postgres@127.0.0.1:{dead_postgres}",
    }
    result = run_ensure_services("app", folder, **{**local_services, **suite_elsewhere})
    assert result.returncode == 0, result.stderr
    assert not log.exists(), log.read_text()
    assert "AGENTSTATE_TEST" not in result.stdout + result.stderr
    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo:(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert demo is not None and "services" not in demo.group(1)
    assert "scripts/ensure-services.sh app" in demo.group(2)


def test_make_test_still_starts_the_suites_services(
    local_services: dict[str, str], recorder: tuple[Path, Path]
) -> None:
    import redis as redis_py

    from tasks.worker.processes import free_port

    folder, log = recorder
    dead_redis = free_port()
    suite = {
        "AGENTSTATE_TEST_REDIS_URL": f"redis://127.0.0.1:{dead_redis}/13",
        # Remote: looked at, not probed (a silent local one would be waited for).
        "AGENTSTATE_TEST_PG_SERVER": "postgresql+psycopg2://postgres@db.example:5432",
    }
    try:
        result = run_ensure_services("test", folder, **{**local_services, **suite})
        assert result.returncode == 0, result.stderr
        calls = log.read_text().splitlines()
        assert f"starting redis-server on 127.0.0.1:{dead_redis}" in result.stdout
        assert (
            [c for c in calls if c.startswith("redis-server ")]
            == [c for c in calls if f"--port {dead_redis} " in c]
            != []
        )
        assert "AGENTSTATE_TEST_PG_SERVER is on db.example: not managed here" in result.stdout
        assert redis_py.Redis(port=dead_redis).ping()
        assert re.search(r"^services:\n\t@scripts/ensure-services\.sh test$", makefile_text(), re.M)
    finally:
        with contextlib.suppress(redis_py.RedisError):
            redis_py.Redis(port=dead_redis).shutdown(nosave=True)


def makefile_text() -> str:
    return (ROOT / "Makefile").read_text()


def test_ensure_services_leaves_remote_services_alone_and_hides_passwords(
    local_services: dict[str, str], tmp_path: Path
) -> None:
    url_file = tmp_path / "database_url"
    url_file.write_text("postgresql+psycopg2://agent:Zq7Db%23pw@db.example:5432/app\n")
    app = {
        **local_services,
        "AGENTSTATE_REDIS_URL": "redis://agent:Zq7Cache%2Fpw@cache.example:6379/0",
    }
    del app["AGENTSTATE_DATABASE_URL"], app["AGENTSTATE_BROKER_URL"]
    result = run_ensure_services("app", **app, AGENTSTATE_DATABASE_URL_FILE=str(url_file))
    assert result.returncode == 0, result.stderr
    assert "AGENTSTATE_REDIS_URL is on cache.example: not managed here" in result.stdout
    assert "AGENTSTATE_DATABASE_URL is on db.example: not managed here" in result.stdout
    assert "Zq7" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://:Zq7pw@127.0.0.1:{port}/0", "it needs a password, so start it yourself"),
        ("redis://:Zq7/pw@127.0.0.1:{port}/0", "AGENTSTATE_REDIS_URL is not a valid URL"),
    ],
)
def test_ensure_services_refuses_what_it_cannot_start_without_showing_passwords(
    local_services: dict[str, str], url: str, message: str
) -> None:
    from tasks.worker.processes import free_port

    result = run_ensure_services(
        "app", **{**local_services, "AGENTSTATE_REDIS_URL": url.format(port=free_port())}
    )
    assert result.returncode == 1
    assert message in result.stderr
    assert "starting" not in result.stdout
    assert "Zq7" not in result.stdout + result.stderr
