#!/usr/bin/env bash
# Create the secret files docker-compose.yml mounts (./secrets/, never committed):
# random passwords for Postgres and Redis, the URLs agentstate reads with them
# (AGENTSTATE_*_URL_FILE), percent-escaped as URLs require, and an operator key for the
# HTTP API (AGENTSTATE_API_KEYS_FILE). Existing files are kept, and missing ones added
# (run it again after an upgrade that mounts a new secret).
#
#   scripts/make-secrets.sh [DIR]      # default: ./secrets next to docker-compose.yml
set -euo pipefail
dir=${1:-"$(cd "$(dirname "$0")/.." && pwd)/secrets"}
mkdir -p "$dir"
chmod 700 "$dir"  # the files must be readable by the containers' users; the folder is not
python3 - "$dir" <<'PY'
import secrets
import sys
from pathlib import Path
from urllib.parse import quote

folder = Path(sys.argv[1])

def secret(name: str, make) -> str:
    path = folder / name
    if not path.exists():
        path.write_text(make() + "\n", encoding="utf-8")
        path.chmod(0o644)
        print(f"created {path}")
    return path.read_text(encoding="utf-8").strip()

# Redis reads its password from a config line: keep it to URL-safe characters.
postgres = secret("postgres_password", lambda: secrets.token_urlsafe(32))
redis = secret("redis_password", lambda: secrets.token_urlsafe(32))
def database_url(host: str) -> str:
    return f"postgresql+psycopg2://agentstate:{quote(postgres, safe='')}@{host}:5432/agentstate"

secret("database_url", lambda: database_url("postgres"))
secret("pgbouncer_database_url", lambda: database_url("pgbouncer"))  # --profile pgbouncer
redis_url = secret("redis_url", lambda: f"redis://:{quote(redis, safe='')}@redis:6379/0")
# The broker: Redis too, unless you write another URL here (amqp://rabbitmq:5672//).
secret("broker_url", lambda: redis_url)
# The api service's keys (AGENTSTATE_API_KEYS_FILE): one operator key; add key:user_id
# lines for your users' keys.
secret("api_keys", lambda: f"{secrets.token_urlsafe(32)}:*")
PY
