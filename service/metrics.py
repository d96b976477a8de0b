"""Prometheus metrics, on a registry of the app's own (no import-time global state)."""

import math
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from service.domain.ownership import bucket_of
from service.domain.runs import RunStatus
from service.tasks.hosts import HostTally
from service.tzdb import TzDatabase

HELD_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# How long a replica keeps the run series of a job it no longer owns after its last run
# here: a few scrapes' worth, so the end of a handover or a takeover is seen.
SERIES_LINGER_SECONDS = 120.0
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Every metric Tickgate exports. Run counters are this replica's; the job gauges
    are read from the database at scrape time, so every replica reports the same.

    `database_gauges=False` (a scheduler process) leaves the job gauges out: reading them
    walks every active job, work the fire path's process should not do at each scrape;
    the API process, or the API's pods, report them."""

    def __init__(
        self,
        *,
        database_gauges: bool = True,
        hosts: HostTally | None = None,
        series_linger_seconds: float = SERIES_LINGER_SECONDS,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        if hosts is not None:
            self.registry.register(_HostCollector(hosts))
        self.database_gauges = database_gauges
        exported_if_read = self.registry if database_gauges else None
        self.last_success = Gauge(
            "tickgate_job_last_success_timestamp_seconds",
            "Unix time this replica last finished a run of the job successfully; a "
            "replica keeps it while it owns the job (a job an app fires: its last "
            "success in the ledger, on every replica). Alert on max_over_time() of the "
            "max() across replicas going stale, not only on failures.",
            ["job"],
            registry=self.registry,
        )
        self.runs = Counter(
            "tickgate_runs",
            "Runs finished on this replica, kept while it owns the job.",
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
            "its misfire grace), capped (max_runs used up), cancelled (a queue_one tick "
            "dropped). The superseded skips an edit records (ticks left undecided when a "
            "job's ticks changed, or it was paused) are in the ledger only.",
            ["reason"],
            registry=self.registry,
        )
        self.hook_deliveries = Counter(
            "tickgate_hook_deliveries",
            "Hook deliveries this replica sent, by event (failure, success, recovery, "
            "misfire, skip) and outcome: delivered, retried (to be sent again after a "
            "backoff), failed (its retry policy gave up, or it cannot be sent).",
            ["event", "outcome"],
            registry=self.registry,
        )
        self.ticks_taken_over = Counter(
            "tickgate_ticks_taken_over",
            "Ticks this replica's audit handed to its claims because their job's cursor "
            "lagged past TICKGATE_TAKEOVER_SECONDS (the owner died, stalls, or never had "
            "the job); each is still claimed through the gate.",
            registry=self.registry,
        )
        self.jobs = Gauge(
            "tickgate_jobs", "Jobs in the database, by state.", ["state"], registry=exported_if_read
        )
        self.jobs_overdue = Gauge(
            "tickgate_jobs_overdue",
            "Active jobs whose latest nominal tick is older than their misfire grace and "
            "has no run (ticks nobody ran), as of the last overdue check.",
            registry=exported_if_read,
        )
        self.overdue_checked = Gauge(
            "tickgate_overdue_checked_timestamp_seconds",
            "Unix time the overdue check last finished (one replica per reconcile round "
            "does it); 0 if never. Alert if it goes stale: nobody is checking.",
            registry=exported_if_read,
        )
        self.tzdata = Gauge(
            "tickgate_tzdata_info",
            "1, labelled with the time-zone database release this replica computes ticks "
            "with and where it reads it from; replicas should all show the same.",
            ["version", "source"],
            registry=self.registry,
        )
        # The jobs with series here, each with its bucket and when it last ran here
        # (monotonic): a deleted one is forgotten even on a replica that ran it without
        # holding it (a takeover), see `counts`; one owned elsewhere, after a while.
        self._counted: dict[str, tuple[int, float]] = {}
        self._app_series: set[str] = set()  # app jobs' last successes set here
        self._linger = series_linger_seconds
        self.sync_age = Gauge(
            "tickgate_scheduler_sync_age_seconds",
            "Seconds since this replica's scheduler last fully synced with the database.",
            registry=self.registry,
        )

    def set_tzdata(self, database: TzDatabase) -> None:
        self.tzdata.labels(database.version, database.source).set(1)

    def count_run(
        self, job: str, lock_key: int, status: RunStatus, finished_at: datetime | None
    ) -> None:
        """A run of `job` ended here; `finished_at` if it succeeded."""
        self._counted[job] = (bucket_of(lock_key), time.monotonic())
        self.runs.labels(job, status.value).inc()
        if status is RunStatus.SUCCEEDED and finished_at is not None:
            self.last_success.labels(job).set(finished_at.timestamp())

    def set_app_successes(self, successes: Mapping[str, datetime | None]) -> None:
        """The last successes of the jobs apps fire (the APScheduler gate), from the
        ledger: the API's process exports them in the series every replica exports for
        its own runs, so one alert on a stale last success covers both. The series of an
        app's job gone from the database go too."""
        succeeded = {job: at for job, at in successes.items() if at is not None}
        for job in self._app_series - succeeded.keys():
            self.last_success.remove(job)
        self._app_series = set(succeeded)
        for job, finished_at in succeeded.items():
            self.last_success.labels(job).set(finished_at.timestamp())

    def forget_job(self, job: str) -> None:
        """Drop a deleted job's series: kept, they would pile up with every job ever
        made, and the job's history lives in the ledger anyway."""
        self._counted.pop(job, None)
        self.last_success.remove(job)
        for status in RunStatus:
            self.runs.remove(job, status.value)

    def forget_unowned(self, owned: frozenset[int] | None) -> None:
        """Drop the series of the jobs owned elsewhere (`owned`: the buckets owned here,
        None: all) that have not run here for a while. Kept, each handover would add
        the moved jobs' series to the replica that took them for a moment, until every
        replica exported every job (the soak of 2026-12-07 saw /metrics double)."""
        if owned is None:
            return
        since = time.monotonic() - self._linger
        for job, (bucket, ran) in list(self._counted.items()):
            if bucket not in owned and ran <= since:
                self.forget_job(job)

    def counts(self, job: str) -> bool:
        """Whether this replica has series of the job, to forget if it is deleted."""
        return job in self._counted

    def exposition(self) -> bytes:
        return generate_latest(_Families(_without_created(self.registry.collect())))


def _without_created(families: Iterable[Metric]) -> list[Metric]:
    """The families without their `_created` series, as most exporters send them: a
    timestamp per counter child, doubling the series for little use. prometheus_client's
    own switch (disable_created_metrics) is process-wide state, so they are left out here."""
    kept = []
    for family in families:
        family.samples = [s for s in family.samples if not s.name.endswith("_created")]
        kept.append(family)
    return kept


# Gauges whose values add up across a pod's processes (each counts its own runs). Every
# other gauge reads the same in each process that sets it, or is set in one only (the
# others export their initial 0), so the pod reports the largest.
SUMMED_GAUGES = frozenset(
    {
        "tickgate_runs_in_flight",
        "tickgate_http_connections_open",
        "tickgate_http_runs_waiting_for_connection",
    }
)


class _HostCollector:
    """The http task's connections per host (`HostTally`), read at scrape time."""

    def __init__(self, hosts: HostTally) -> None:
        self._hosts = hosts

    def describe(self) -> list[Metric]:
        return []  # read at each scrape: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            "tickgate_http_connections_open",
            "Connections the http task holds open to the host (in use or kept alive).",
            labels=["host"],
        )
        waiting = GaugeMetricFamily(
            "tickgate_http_runs_waiting_for_connection",
            "http runs waiting for a free connection to the host (the per-host cap is in use).",
            labels=["host"],
        )
        failures = CounterMetricFamily(
            "tickgate_http_connect_failures",
            "Connects to the host that failed or timed out.",
            labels=["host"],
        )
        for host, counts in sorted(self._hosts.snapshot().items()):
            open_.add_metric([host], counts.open)
            waiting.add_metric([host], counts.waiting)
            failures.add_metric([host], counts.connect_failures)
        yield from (open_, waiting, failures)


def merge_expositions(*texts: bytes) -> bytes:
    """One pod's exposition from those of its processes (the API's and the scheduler's):
    counters and histograms add up, gauges follow SUMMED_GAUGES. One scrape then shows the
    pod as one replica, as before the split.

    Merged line by line: both come from `generate_latest`, which spells a series alike in
    every process. Parsed into families, the expositions of 2,000 jobs (400 KB) took
    170 ms of the scrape on an idle core, and seconds on a busy one."""
    families: dict[str, _MergedFamily] = {}
    for text in texts:
        family = None
        for line in text.decode().splitlines():
            if line.startswith("# HELP "):
                name = line.split(" ", 3)[2]
                family = families.setdefault(name, _MergedFamily(name, line))
            elif line.startswith("# TYPE ") and family is not None:
                family.type_line = line
            elif line and family is not None:
                series, _, value = line.rpartition(" ")
                family.add(series, float(value))
    return "".join(family.text() for family in families.values()).encode()


def _number(value: float) -> str:
    """A sample value as the text format spells it (Go's), as generate_latest does."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "NaN" if math.isnan(value) else repr(value)


class _MergedFamily:
    """One metric family as merged: its header lines and each series' value."""

    def __init__(self, name: str, help_line: str) -> None:
        self.name, self.help_line, self.type_line = name, help_line, ""
        self.values: dict[str, float] = {}

    def add(self, series: str, value: float) -> None:
        earlier = self.values.get(series)
        if earlier is None:
            self.values[series] = value
        elif self.type_line.endswith(" gauge") and self.name not in SUMMED_GAUGES:
            self.values[series] = max(earlier, value)
        else:
            self.values[series] = earlier + value

    def text(self) -> str:
        samples = "".join(f"{s} {_number(v)}\n" for s, v in self.values.items())
        return f"{self.help_line}\n{self.type_line}\n{samples}"


class _Families:
    """Already collected families, in the shape generate_latest reads."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
