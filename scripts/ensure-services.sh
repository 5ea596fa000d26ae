#!/usr/bin/env bash
# Start Redis and PostgreSQL on this machine when the configured ones are local and not
# answering (CI and fresh machines). Which URLs depends on who asks:
#   app   (make demo)  AGENTSTATE_REDIS_URL, AGENTSTATE_BROKER_URL and AGENTSTATE_DATABASE_URL
#                      (or their *_FILE variables): the app's own services, nothing else;
#   test  (make test)  the suite's AGENTSTATE_TEST_REDIS_URL, AGENTSTATE_TEST_BROKER_URL and
#                      AGENTSTATE_TEST_PG_SERVER;
#   bench (make bench) AGENTSTATE_BENCH_REDIS_URL, AGENTSTATE_BENCH_BROKER_URL and
#                      AGENTSTATE_BENCH_PG_SERVER.
# The defaults are Redis and Postgres on 127.0.0.1 (the app's database: a SQLite file).
# A remote service is neither probed nor started here, and no password is ever printed.
set -euo pipefail

mode=${1:-app}
case "$mode" in
  app|test|bench) ;;
  *) echo "usage: $0 [app|test|bench]" >&2; exit 2 ;;
esac

# One line per service to check: "redis|postgres <variable> <host> <port> <credentials>".
services() { python3 - "$mode" <<'PY'
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

def value(name, default):
    path = os.environ.get(f"{name}_FILE")
    if not path:
        return os.environ.get(name) or default
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return "unreadable:"  # reported as a bad URL below

def app():
    redis_url = value("AGENTSTATE_REDIS_URL", "redis://localhost:6379/0")
    return [
        ("AGENTSTATE_REDIS_URL", redis_url),
        ("AGENTSTATE_BROKER_URL", value("AGENTSTATE_BROKER_URL", redis_url)),
        ("AGENTSTATE_DATABASE_URL", value("AGENTSTATE_DATABASE_URL", "sqlite:///agentstate.db")),
    ]

def suite(prefix, redis_db, broker_db):
    server = "postgresql+psycopg2://postgres@127.0.0.1:5432"
    return [
        (f"{prefix}_REDIS_URL", os.environ.get(f"{prefix}_REDIS_URL", f"redis://127.0.0.1:6379/{redis_db}")),
        (f"{prefix}_BROKER_URL", os.environ.get(f"{prefix}_BROKER_URL", f"redis://127.0.0.1:6379/{broker_db}")),
        (f"{prefix}_PG_SERVER", os.environ.get(f"{prefix}_PG_SERVER", server)),
    ]

urls = {
    "app": app,
    "test": lambda: suite("AGENTSTATE_TEST", 13, 14),
    "bench": lambda: suite("AGENTSTATE_BENCH", 11, 12),
}[sys.argv[1]]()
seen = set()
for variable, url in urls:
    for one in url.split(";"):  # a broker URL may list fail-over brokers
        try:
            parts = urlsplit(one)
            scheme = parts.scheme.split("+")[0]
            kind = {"redis": "redis", "rediss": "redis", "postgresql": "postgres", "postgres": "postgres"}.get(scheme)
            port = parts.port or (6379 if kind == "redis" else 5432)
            host = parts.hostname or ""
        except ValueError:
            kind = "bad"
        if kind == "bad" or not parts.scheme:
            print(f"bad {variable} - 0 -")  # agentstate itself says what is wrong
            continue
        if kind and host and (kind, host, port) not in seen:
            seen.add((kind, host, port))
            print(kind, variable, host, port, "yes" if parts.password or parts.username else "no")
PY
}

is_local() { case "$1" in localhost|127.*|::1) return 0 ;; *) return 1 ;; esac; }

# Any reply to PING counts: a Redis that wants a password answers "-NOAUTH ...".
redis_answers() { python3 - "$1" "$2" <<'PY'
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1) as s:
        s.sendall(b"PING\r\n")
        sys.exit(0 if s.recv(16)[:1] in (b"+", b"-") else 1)
except OSError:
    sys.exit(1)
PY
}

postgres_answers() { python3 - "$1" "$2" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(1)
PY
}

ensure_redis() {  # variable host port has_credentials
  local variable=$1 host=$2 port=$3 credentials=$4
  if ! is_local "$host"; then
    echo "Redis for $variable is on $host: not managed here"
    return 0
  fi
  redis_answers "$host" "$port" && return 0
  if [ "$credentials" = yes ]; then
    echo "Redis for $variable (127.0.0.1:$port) is not answering; it needs a password," \
      "so start it yourself" >&2
    return 1
  fi
  echo "starting redis-server on 127.0.0.1:$port (for $variable)"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    >/dev/null
  for _ in $(seq 1 50); do redis_answers 127.0.0.1 "$port" && return 0; sleep 0.1; done
  echo "Redis is not answering on 127.0.0.1:$port" >&2
  return 1
}

ensure_postgres() {  # variable host port
  local variable=$1 host=$2 port=$3
  if ! is_local "$host"; then
    echo "PostgreSQL for $variable is on $host: not managed here"
    return 0
  fi
  postgres_answers "$host" "$port" && return 0
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "starting PostgreSQL (for $variable)"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    for _ in $(seq 1 100); do postgres_answers "$host" "$port" && return 0; sleep 0.1; done
  fi
  if [ "$mode" = app ]; then
    echo "PostgreSQL for $variable ($host:$port) is not answering: start it first" >&2
    return 1
  fi
  echo "PostgreSQL for $variable ($host:$port) is not answering: Postgres tests will fail" \
    "in CI" >&2
}

failed=0
while read -r kind variable host port credentials; do
  case "$kind" in
    redis) ensure_redis "$variable" "$host" "$port" "$credentials" || failed=1 ;;
    postgres) ensure_postgres "$variable" "$host" "$port" || failed=1 ;;
    bad) echo "$variable is not a valid URL (run agentstate to see why)" >&2; failed=1 ;;
  esac
done < <(services)
[ "$failed" = 0 ] && echo "services ($mode): redis and postgres checked"
exit "$failed"
