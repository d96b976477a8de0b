"""Which per-job series a replica keeps: those of the jobs it owns, and for a while those
of the jobs it ran without owning them (a handover, a takeover)."""

from datetime import UTC, datetime

from service.domain.ownership import bucket_of
from service.domain.runs import RunStatus
from service.metrics import Metrics

KEY = 0x1234_5678


def _ran(metrics: Metrics) -> Metrics:
    metrics.count_run("nightly", KEY, RunStatus.SUCCEEDED, datetime.now(UTC))
    return metrics


def _exported(metrics: Metrics) -> bool:
    return 'job="nightly"' in metrics.exposition().decode()


def test_an_owned_job_keeps_its_series() -> None:
    metrics = _ran(Metrics(series_linger_seconds=0))
    metrics.forget_unowned(frozenset({bucket_of(KEY)}))
    assert _exported(metrics)


def test_every_job_is_owned_while_the_replica_is_alone() -> None:
    metrics = _ran(Metrics(series_linger_seconds=0))
    metrics.forget_unowned(None)
    assert _exported(metrics)


def test_a_job_owned_elsewhere_keeps_its_series_while_it_lingers() -> None:
    metrics = _ran(Metrics(series_linger_seconds=3600))
    metrics.forget_unowned(frozenset())
    assert _exported(metrics)
    assert metrics.counts("nightly")


def test_a_job_owned_elsewhere_loses_its_series_after_the_linger() -> None:
    metrics = _ran(Metrics(series_linger_seconds=0))
    metrics.forget_unowned(frozenset({bucket_of(KEY) ^ 1}))
    assert not _exported(metrics)
    assert not metrics.counts("nightly")
