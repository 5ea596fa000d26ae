# agentstate image: one image for every role (worker, beat, flower, migrate); the role is
# the command (see docker-compose.yml). Default: a Celery worker.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Unprivileged runtime user (fixed uid/gid so volume permissions are predictable).
RUN groupadd --system --gid 10001 agentstate \
    && useradd --system --uid 10001 --gid agentstate --create-home \
        --home-dir /home/agentstate --shell /usr/sbin/nologin agentstate

WORKDIR /app

# Project metadata first: the dependency layer below is rebuilt only when it changes.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the packages (and alembic.ini, for running Alembic by hand) and the project itself.
COPY config/ config/
COPY state/ state/
COPY tasks/ tasks/
COPY alembic.ini ./
RUN pip install --no-cache-dir .

# Source stays root-owned and read-only for the runtime user; Celery beat keeps its
# schedule under the temp dir (/tmp), which is writable.
USER agentstate

CMD ["celery", "-A", "tasks", "worker", "--loglevel=INFO"]
