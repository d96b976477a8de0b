"""Retries inside one run, with Cloud Scheduler's backoff semantics."""

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_ATTEMPTS = 20


class RetryPolicy(BaseModel):
    """How often a failed attempt is tried again within the same run (same lock, same
    Idempotency-Key). The wait starts at `min_backoff_seconds`, doubles `max_doublings`
    times, then grows linearly by the last doubled step, capped at `max_backoff_seconds`.
    `max_retry_seconds` (0: no limit) bounds the whole run, first attempt included."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(1, ge=1, le=MAX_ATTEMPTS, description="Attempts, the first included.")
    min_backoff_seconds: float = Field(5, gt=0, le=3600)
    max_backoff_seconds: float = Field(3600, gt=0, le=86_400)
    max_doublings: int = Field(5, ge=0, le=16)
    max_retry_seconds: float = Field(0, ge=0, le=86_400, description="0: no limit.")

    @model_validator(mode="after")
    def _ordered_bounds(self) -> "RetryPolicy":
        if self.max_backoff_seconds < self.min_backoff_seconds:
            raise ValueError("max_backoff_seconds must be at least min_backoff_seconds")
        return self

    def backoff_seconds(self, retry: int) -> float:
        """The wait before retry number `retry` (0 for the first retry).

        min 10, max 300, doublings 3: 10, 20, 40, 80, 160, 240, 300, 300, ...
        """
        doubled = min(retry, self.max_doublings)
        linear = max(0, retry - self.max_doublings)
        step = self.min_backoff_seconds * 2.0**doubled * (linear + 1)
        return float(min(step, self.max_backoff_seconds))

    def allows_attempt(self, attempt: int, elapsed_seconds: float) -> bool:
        """Whether attempt number `attempt` (1 for the first) may start `elapsed_seconds`
        after the run began."""
        in_time = not self.max_retry_seconds or elapsed_seconds < self.max_retry_seconds
        return attempt <= self.max_attempts and in_time

    def worst_case_seconds(self, attempt_timeout: float) -> float:
        """The longest a run can take: every attempt timing out, every wait served."""
        waits = sum(self.backoff_seconds(r) for r in range(self.max_attempts - 1))
        total = attempt_timeout * self.max_attempts + waits
        return min(total, self.max_retry_seconds) if self.max_retry_seconds else total
