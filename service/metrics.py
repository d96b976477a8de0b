"""Prometheus metrics, on a registry of the app's own (no import-time global state)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HELD_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Every metric Tickgate exports. Run counters are this replica's; the job gauges
    are read from the database at scrape time, so every replica reports the same."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.last_success = Gauge(
            "tickgate_job_last_success_timestamp_seconds",
            "Unix time this replica last finished a run of the job successfully. "
            "Alert on max() across replicas going stale, not only on failures.",
            ["job"],
            registry=self.registry,
        )
        self.runs = Counter(
            "tickgate_runs",
            "Runs finished on this replica.",
            ["job", "status"],
            registry=self.registry,
        )
        self.runs_in_flight = Gauge(
            "tickgate_runs_in_flight", "Runs in progress on this replica.", registry=self.registry
        )
        self.fire_lag = Histogram(
            "tickgate_fire_lag_seconds",
            "Start of a scheduled run minus its nominal tick.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.lock_held_after_return = Histogram(
            "tickgate_lock_held_after_return_seconds",
            "From a run's task returning to its end recorded and its lock released: while "
            "it lasts, the job's next tick finds the lock held.",
            buckets=HELD_BUCKETS,
            registry=self.registry,
        )
        self.ticks_skipped = Counter(
            "tickgate_ticks_skipped",
            "Ticks this replica recorded as skipped in the ledger, by reason: overlap (an "
            "earlier run of the job was still in progress), misfire (not started within "
            "its misfire grace), capped (max_runs used up).",
            ["reason"],
            registry=self.registry,
        )
        self.jobs = Gauge(
            "tickgate_jobs", "Jobs in the database, by state.", ["state"], registry=self.registry
        )
        self.jobs_overdue = Gauge(
            "tickgate_jobs_overdue",
            "Active jobs whose latest nominal tick is older than their misfire grace and "
            "has no run: ticks nobody ran.",
            registry=self.registry,
        )
        self.sync_age = Gauge(
            "tickgate_scheduler_sync_age_seconds",
            "Seconds since this replica's scheduler last fully synced with the database.",
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
