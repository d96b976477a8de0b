"""One pod's /metrics from its two processes' expositions."""

from prometheus_client.parser import text_string_to_metric_families

from service.metrics import Metrics, merge_expositions


def values(exposition: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
    }


def test_counters_and_histograms_add_up_gauges_take_the_largest_but_runs_in_flight() -> None:
    api, scheduler = Metrics(), Metrics(database_gauges=False)
    api.runs.labels("nightly", "succeeded").inc(2)
    scheduler.runs.labels("nightly", "succeeded").inc(3)
    scheduler.runs.labels("hourly", "failed").inc()
    api.runs_in_flight.set(1)
    scheduler.runs_in_flight.set(4)
    api.lock_held_after_return.observe(0.001)
    scheduler.lock_held_after_return.observe(0.3)
    api.last_success.labels("nightly").set(100)
    scheduler.last_success.labels("nightly").set(200)
    api.jobs.labels("active").set(7)
    api.jobs_overdue.set(2)
    scheduler.sync_age.set(3.5)

    merged = values(merge_expositions(api.exposition(), scheduler.exposition()))

    assert merged[("tickgate_runs_total", (("job", "nightly"), ("status", "succeeded")))] == 5
    assert merged[("tickgate_runs_total", (("job", "hourly"), ("status", "failed")))] == 1
    assert merged[("tickgate_runs_in_flight", ())] == 5
    held = "tickgate_lock_held_after_return_seconds"
    assert merged[(f"{held}_count", ())] == 2
    assert merged[(f"{held}_sum", ())] == 0.301
    assert merged[(f"{held}_bucket", (("le", "0.001"),))] == 1
    assert merged[(f"{held}_bucket", (("le", "0.5"),))] == 2
    assert merged[("tickgate_job_last_success_timestamp_seconds", (("job", "nightly"),))] == 200
    assert merged[("tickgate_jobs", (("state", "active"),))] == 7
    assert merged[("tickgate_jobs_overdue", ())] == 2
    assert merged[("tickgate_scheduler_sync_age_seconds", ())] == 3.5


def test_no_created_series_and_families_appear_once() -> None:
    first, second = Metrics(), Metrics(database_gauges=False)
    first.runs.labels("a", "succeeded").inc()
    second.runs.labels("a", "succeeded").inc()
    first.fire_lag.observe(0.1)
    text = merge_expositions(first.exposition(), second.exposition())
    for exposition in (first.exposition(), second.exposition(), text):
        assert b"_created" not in exposition
    assert values(text)[("tickgate_runs_total", (("job", "a"), ("status", "succeeded")))] == 2
    assert text.decode().count("# TYPE tickgate_runs_total counter") == 1


def test_a_scheduler_process_leaves_the_job_gauges_out() -> None:
    names = {name for name, _ in values(Metrics(database_gauges=False).exposition())}
    assert "tickgate_jobs_overdue" not in names
    assert "tickgate_runs_in_flight" in names


def test_series_whose_labels_hold_spaces_quotes_and_backslashes_merge_as_one() -> None:
    """The merge goes line by line: a label value is part of the series' spelling."""
    name = 'nightly "report" \\ at 02:00'
    first, second = Metrics(), Metrics(database_gauges=False)
    first.runs.labels(name, "succeeded").inc()
    second.runs.labels(name, "succeeded").inc(2)
    second.runs.labels("other", "succeeded").inc()
    merged = values(merge_expositions(first.exposition(), second.exposition()))
    assert merged[("tickgate_runs_total", (("job", name), ("status", "succeeded")))] == 3
    assert merged[("tickgate_runs_total", (("job", "other"), ("status", "succeeded")))] == 1
