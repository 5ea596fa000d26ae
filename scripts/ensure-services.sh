#!/usr/bin/env bash
# Start Redis and PostgreSQL on localhost if they are not answering (CI and fresh machines).
set -euo pipefail

redis_up() { python3 - <<'PY'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", 6379), timeout=1)
    s.sendall(b"PING\r\n"); ok = s.recv(16).startswith(b"+PONG")
except OSError:
    ok = False
sys.exit(0 if ok else 1)
PY
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

if ! redis_up; then
  echo "starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  for _ in $(seq 1 50); do redis_up && break; sleep 0.1; done
fi
redis_up || { echo "Redis is not answering on 127.0.0.1:6379" >&2; exit 1; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    for _ in $(seq 1 100); do pg_up && break; sleep 0.1; done
  fi
fi
if pg_up; then
  echo "services: redis and postgres answering"
else
  echo "PostgreSQL is not answering on 127.0.0.1:5432: Postgres tests will fail in CI" >&2
fi
