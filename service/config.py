"""Settings from the environment (pydantic-settings); one object, built once per process."""

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


def split_names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def default_runner_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every knob Tickgate reads. Names are the env vars, upper-cased with TICKGATE_."""

    model_config = SettingsConfigDict(
        env_prefix="TICKGATE_", extra="ignore", frozen=True, populate_by_name=True
    )

    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "TICKGATE_DATABASE_URL"),
        description="PostgreSQL DSN. Unset: start an embedded PostgreSQL in data_dir.",
    )
    data_dir: Path = Field(Path(".tickgate"), description="Where the embedded PostgreSQL lives.")
    runner_id: str = Field(default_factory=default_runner_id, min_length=1, max_length=200)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] | None = Field(
        None, description="Log format; default text on a terminal, JSON otherwise."
    )
    require_database_url: bool = Field(
        False, description="Refuse to start without DATABASE_URL (set in the container image)."
    )
    apply_jobs: Path | None = Field(
        None, description="YAML or JSON file of jobs upserted at startup, as PUT /v1/jobs/{name}."
    )
    api_pool_size: int = Field(10, ge=1, le=200, description="Connections for API requests.")
    scheduler: bool = Field(True, description="Run the scheduler here; off for API-only pods.")
    reconcile_seconds: float = Field(
        30, gt=0, le=3600, description="Full resync of the scheduler mirror, orphan sweep."
    )
    lock_sessions: int = Field(
        4,
        ge=1,
        le=64,
        description="Pinned lock sessions (connections) per replica for scheduled ticks; "
        "each holds the advisory locks of many runs at once and runs one claim at a time.",
    )
    max_concurrent_runs: int = Field(
        5000,
        ge=1,
        le=100_000,
        description="Scheduled runs in flight per replica (claimed runs; a tick whose claim "
        "does not win it holds its room only for the claim statement).",
    )
    shutdown_grace_seconds: float = Field(
        30, ge=0, le=86_400, description="On SIGTERM, how long in-flight runs may finish."
    )
    run_history: int = Field(1000, ge=1, le=1_000_000, description="Runs kept per job.")
    task_modules: str = Field(
        "", description="Comma-separated modules whose @task definitions are registered."
    )
    sql_targets: dict[str, str] = Field(
        default_factory=dict,
        description='JSON {"name": "dsn"}: databases the sql task may run on, by name.',
    )
    sql_allow_self: bool = Field(
        False, description="Let the sql task target `self`, Tickgate's own database."
    )
    api_tokens: dict[str, list[Literal["read", "write"]]] = Field(
        default_factory=dict,
        description='JSON {"token": ["read", "write"]}: bearer tokens and their scopes.',
    )
    api_tokens_file: Path | None = Field(
        None, description="A mounted file holding the same JSON as TICKGATE_API_TOKENS."
    )
    allow_anonymous: bool = Field(
        False, description="Serve without tokens on a non-loopback address (not advised)."
    )
    open_paths: str = Field(
        "/healthz,/readyz,/metrics",
        description="Comma-separated paths served without a token.",
    )
    http_allow: str = Field(
        "",
        description="Comma-separated CIDRs or host names the http task may reach although "
        "they are loopback or private; link-local and metadata addresses stay denied.",
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="Larger request bodies get 413."
    )
    test_clock_offset_ms: int = Field(
        0, ge=-60_000, le=60_000, description="Test only: this replica's clock runs off by this."
    )
    test_record_delay_ms: int = Field(
        0,
        ge=0,
        le=60_000,
        description="Test only: hold every run's end record back this long after its task "
        "returned (a GC pause or a slow commit, on purpose).",
    )
    test_fire_delay_ms: int = Field(
        0, ge=0, le=60_000, description="Test only: hold every fire back this long."
    )


class TokenFileError(ValueError):
    """TICKGATE_API_TOKENS_FILE cannot be read or does not hold {token: [scopes]}."""


_SCOPES = TypeAdapter(dict[str, list[Literal["read", "write"]]])


def token_scopes(settings: Settings) -> dict[str, frozenset[str]]:
    """Every configured bearer token with its scopes: the env JSON, then the file's."""
    tokens = dict(settings.api_tokens)
    if settings.api_tokens_file is not None:
        try:
            tokens |= _SCOPES.validate_json(settings.api_tokens_file.read_bytes())
        except (OSError, ValidationError) as error:
            raise TokenFileError(f"cannot use {settings.api_tokens_file}: {error}") from error
    return {token: frozenset(scopes) for token, scopes in tokens.items() if token}
