# syntax=docker/dockerfile:1
#
# Tickgate container image.
#
#   docker build -t tickgate:0.1.0 .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgresql://user:pass@db:5432/tickgate tickgate:0.1.0
#
# The image never starts the embedded PostgreSQL: TICKGATE_REQUIRE_DATABASE_URL=1 makes
# `tickgate serve` exit with an error when DATABASE_URL is unset.
#
# `tickgate serve` is PID 1: it runs the scheduler and the API as two child processes,
# passes SIGTERM on to both, and exits when either dies.

# --- builder: wheels for Tickgate and every dependency ---------------------------------
FROM python:3.12-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the build needs; pyproject.toml names README.md as the package readme.
COPY pyproject.toml README.md ./
COPY service ./service
# The tz database is pinned to one release: a tick's instant depends on it, and every
# replica built from this file must compute the same ticks (README, Time-zone database).
ARG TZDATA_VERSION=2026.6
RUN pip wheel --wheel-dir /wheels . "tzdata==${TZDATA_VERSION}"

# --- runtime: install from the wheels only, no compilers, no sources -------------------
FROM python:3.12-slim AS runtime

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheels are bind-mounted from the builder, so they never become an image layer.
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

USER 10001:10001
EXPOSE 8080

ENTRYPOINT ["tickgate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
