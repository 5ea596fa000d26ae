# agentstate image: one image for every role (worker, beat, flower, migrate, api); the role
# is the command (see docker-compose.yml). Default: a Celery worker. The lock includes the
# server extra (FastAPI, uvicorn), so `agentstate serve` runs from this image too.
#
# The base image is pinned by digest (python:3.11.16-slim, multi-platform index, as the
# docker-library/repo-info records list it): a rebuild gets the same bytes. To move on,
# take the new digest from `docker buildx imagetools inspect python:3.11-slim`.
FROM python:3.11.16-slim@sha256:8203f8b7cc03e7a0b2da2a7bfebdb7e39d985983791e2aba5b01cc535bf36f53

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Unprivileged runtime user (fixed uid/gid so volume permissions are predictable).
RUN groupadd --system --gid 10001 agentstate \
    && useradd --system --uid 10001 --gid agentstate --create-home \
        --home-dir /home/agentstate --shell /usr/sbin/nologin agentstate

WORKDIR /app

# Every dependency, and the build backend, at the exact version and with the hashes of
# requirements.lock (`make lock` regenerates it from pyproject.toml): a tampered or
# substituted package fails the build. This layer is rebuilt only when the lock changes.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock

# Then the project itself, against exactly those packages (no resolver, no downloads).
COPY pyproject.toml README.md LICENSE ./
COPY config/ config/
COPY state/ state/
COPY tasks/ tasks/
COPY alembic.ini ./
RUN pip install --no-cache-dir --no-deps --no-build-isolation --no-index .

# Your own agent and actions: the packages in the build context's app/ folder (see
# app/README.md), importable by every process of the image whatever its working folder.
# Last, so changing them rebuilds only this layer.
COPY app/ /srv/app/
ENV PYTHONPATH=/srv/app

# Source stays root-owned and read-only for the runtime user; Celery beat keeps its
# schedule under the temp dir (/tmp), which is writable.
USER agentstate

CMD ["celery", "-A", "tasks", "worker", "--loglevel=INFO"]
