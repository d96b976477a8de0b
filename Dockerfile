# syntax=docker/dockerfile:1
#
# Tickgate container image.
#
#   docker build -t tickgate:0.1.0 --build-arg VERSION=0.1.0 \
#       --build-arg REVISION="$(git rev-parse HEAD)" --build-arg SOURCE_URL=https://... .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgresql://user:pass@db:5432/tickgate tickgate:0.1.0
#
# The image never starts the embedded PostgreSQL (the `embedded` extra is not installed):
# TICKGATE_REQUIRE_DATABASE_URL=1 makes `tickgate serve` exit with an error when
# DATABASE_URL is unset.
#
# `tickgate serve` is PID 1: it runs the scheduler and the API as two child processes,
# passes SIGTERM on to both, and exits when either dies.
#
# Dependencies come from requirements/runtime.lock: the versions the tests ran with, each
# checked against its sha256. Raise one with `make lock` (see the Makefile), not here; the
# tz database is one of them (tzdata, pinned there: a tick's instant depends on it, and
# every replica built from this file must compute the same ticks).
#
# The base image is python:3.12-slim pinned by digest (its multi-platform index), the same
# in both stages, so a rebuild cannot pick up another Python or Debian in silence. The
# digest below is the index of August 2026. This repository's build box reaches no
# container registry, so it was not resolved here: it is the digest that independent
# public Dockerfiles pin for this tag. To bump it (a Python patch release or a Debian
# security fix), and before a release, look up the tag's current index with
#   docker buildx imagetools inspect python:3.12-slim --format '{{json .Manifest.Digest}}'
# and write it in both FROM lines (tests/deploy/test_dockerfile.py holds them equal).

# --- builder: wheels for Tickgate and every locked dependency -------------------------
FROM python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The dependencies first, so that a change to the sources rebuilds only Tickgate's wheel.
COPY requirements/runtime.lock ./requirements/
RUN pip wheel --wheel-dir /wheels --require-hashes -r requirements/runtime.lock
# Only what the build needs; pyproject.toml names README.md as the package readme and
# LICENSE as its license file, which the wheel carries.
COPY pyproject.toml README.md LICENSE ./
COPY service ./service
# The library face (tickgate/, docs/apscheduler.md): the wheel holds it beside the service.
COPY tickgate ./tickgate
RUN pip wheel --wheel-dir /wheels --no-deps .

# --- runtime: install from the wheels only, no compilers, no sources -------------------
FROM python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea AS runtime

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheels are bind-mounted from the builder, so they never become an image layer.
# /wheels holds one version of each dependency, the locked one: pip can pick no other.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels tickgate \
    && groupadd --system --gid 10001 tickgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin tickgate

# Bytecode was compiled at install time; at run time the root filesystem may be read-only.
# PYTHONTZPATH empty: ticks are computed with the `tzdata` package installed here (its
# release pinned with the image), never with whatever zoneinfo the base image carries.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONTZPATH="" \
    TICKGATE_REQUIRE_DATABASE_URL=1 \
    TICKGATE_LOG_FORMAT=json

ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="tickgate" \
      org.opencontainers.image.description="HTTP job scheduler: cron, interval, daily and one-time jobs on PostgreSQL, run exactly once across replicas" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE_URL}"

USER 10001:10001
EXPOSE 8080

# Docker's own health state (docker ps, Compose, Swarm; Kubernetes uses the chart's probes):
# /healthz on the port CMD serves, with python's urllib since the image has no curl, and
# past any HTTP_PROXY the container is given. A container serving on another port or a
# unix socket overrides it (docker run --health-cmd, or --no-healthcheck).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:8080/healthz', timeout=4)"]

ENTRYPOINT ["tickgate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
