"""The soak's judgement, from the results document alone.

- **duplicates**: no two ledger rows of one (job, tick) (per window, and over the whole
  table at the end), and no (job, tick) delivered twice to the receiver unless its
  ledger row had as many attempts.
- **ticks accounted**: in every window, every nominal tick of every job that lived
  through it unchanged has exactly one ledger row; a tick summed up by a gap row counts
  only within `GAP_ALLOWANCE_SECONDS` of the PostgreSQL restart, and only if it has no
  row of its own; no row at a tick that is not nominal; and the receiver agrees with the
  ledger (no succeeded run undelivered, no delivery of a skipped tick or of a tick
  without a row).
- **RSS flat**: for each incarnation of each replica that lived long enough (two bands
  past its warm-up), the median RSS over its last band (a fifteenth of the run: 2 minutes
  of 30) is under 10 % above the median over the band that starts at its warm-up (a sixth
  of the run after it started).
- **ledger bounded**: from the plateau on (half the run, or once retention has had its
  horizon and a window more to bite, whichever is later), the ledger's largest count in
  the last band is under 10 % above the median of the first band.
- **scrape time flat**: per incarnation as for RSS, the last band's median scrape time
  at most 1.5 times the first band's plus 5 ms (a shared two-core box is noisy at the
  millisecond scale; the exposition's size, reported beside it, is not).
- **scrape fast between crowds**: the median of each incarnation's scrapes taken half a
  second after the whole second (between two crowds of ticks) is under
  `SCRAPE_BETWEEN_BOUND_MS`; a run without those samples (before 2026-12-06) is not
  judged.

Only samples inside the run count: those taken after it (while the last windows settle,
the churn stopped, so deleted jobs no longer take their rows with them) do not.
A check that the run was too short to make is `None` (not judged), never a failure.
"""

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from reliability.soak.attribution import skips_by_fault

RSS_GROWTH_BOUND = 0.10
LEDGER_GROWTH_BOUND = 0.10
SCRAPE_FACTOR_BOUND = 1.5
SCRAPE_SLACK_MS = 5.0
SCRAPE_BETWEEN_BOUND_MS = 250.0
GAP_ALLOWANCE_SECONDS = 90.0  # around the PostgreSQL outage
BANDS = 15  # a band is this share of the run
HTTP_PROBLEMS = (
    "duplicates",
    "succeeded_not_delivered",
    "delivered_but_skipped",
    "delivered_without_row",
    "unexpected_deliveries",
)


def _total(windows: Sequence[dict[str, Any]], pick: Callable[[dict[str, Any]], int]) -> int:
    return sum(pick(window) for window in windows)


def _event_times(document: dict[str, Any], kind: str) -> list[float]:
    return [event["at"] for event in document["events"] if event["kind"] == kind]


def _near_outage(document: dict[str, Any], window: dict[str, Any]) -> bool:
    stops = _event_times(document, "pg_stop")
    backs = _event_times(document, "cluster_ready") or _event_times(document, "pg_start")
    if not stops:
        return False
    begin, end = stops[0] - GAP_ALLOWANCE_SECONDS, (backs or stops)[-1] + GAP_ALLOWANCE_SECONDS
    return bool(window["start"] < end and window["end"] > begin)


def duplicates(document: dict[str, Any]) -> dict[str, Any]:
    windows = document["windows"]
    ledger = _total(windows, lambda w: w["ledger_duplicates"])
    whole = document["final"].get("ledger_duplicate_ticks")
    receiver = document["receiver"]
    unexplained = receiver.get("duplicates_unexplained", 0)
    return {
        "ledger_duplicates_in_windows": ledger,
        "ledger_duplicates_whole_table": whole,
        "receiver_duplicates": receiver.get("duplicates", 0),
        "receiver_duplicates_unexplained": unexplained,
        "ok": ledger == 0 and not whole and unexplained == 0,
    }


def accounted(document: dict[str, Any]) -> dict[str, Any]:
    windows = document["windows"]
    gap_near = _total(windows, lambda w: w["gap_covered"] if _near_outage(document, w) else 0)
    gap_far = _total(windows, lambda w: 0 if _near_outage(document, w) else w["gap_covered"])
    statuses: dict[str, int] = {}
    reasons: dict[str, int] = {}
    http: dict[str, int] = {}
    for window in windows:
        for into, counts in (
            (statuses, window["statuses"]),
            (reasons, window["skip_reasons"]),
            (http, window["http"]),
        ):
            for key, value in counts.items():
                into[key] = into.get(key, 0) + value
    unaccounted = _total(windows, lambda w: w["unaccounted"])
    unexpected = _total(windows, lambda w: w["unexpected_rows"])
    double = _total(windows, lambda w: w.get("double_counted", 0))  # judged since #43
    problems = sum(http.get(name, 0) for name in HTTP_PROBLEMS)
    return {
        "windows": len(windows),
        "expected_ticks": _total(windows, lambda w: w["expected_ticks"]),
        "statuses": statuses,
        "skip_reasons": reasons,
        "unaccounted": unaccounted,
        "gap_covered_near_restart": gap_near,
        "gap_covered_elsewhere": gap_far,
        "double_counted": double,
        "unexpected_rows": unexpected,
        "http": http,
        "skips_by_fault": skips_by_fault(document),
        "ok": bool(windows)
        and unaccounted == 0
        and gap_far == 0
        and double == 0
        and unexpected == 0
        and problems == 0,
    }


def _band(
    samples: Sequence[dict[str, Any]], begin: float, end: float, key: str, index: int
) -> list[float]:
    """The values of `key` (a list per slot) for slot `index`, sampled in [begin, end]."""
    return [s[key][index] for s in samples if begin <= s["t"] <= end and s[key][index] is not None]


def _in_run(document: dict[str, Any]) -> list[dict[str, Any]]:
    length = document["meta"]["minutes"] * 60
    return [s for s in document["samples"] if s["t"] <= length]


def _incarnation_series(document: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [
        (slot["slot"], incarnation)
        for slot in document["slots"]
        for incarnation in slot["incarnations"]
    ]


def _flat_per_incarnation(
    document: dict[str, Any], key: str, judge: Callable[[float, float], bool]
) -> dict[str, Any]:
    """For each incarnation: the median of `key` over the band after its warm-up and
    over its last band, and whether `judge(first, last)` holds."""
    meta = document["meta"]
    began, length = meta["began"], meta["minutes"] * 60
    warmup, band = length / 6, length / BANDS
    results = {}
    for index, incarnation in _incarnation_series(document):
        runner = incarnation["runner_id"]
        ours = [s for s in _in_run(document) if s["runner"][index] == runner]
        if not ours:
            continue
        warm = incarnation["started"] - began + warmup
        last = ours[-1]["t"]
        first_band = _band(ours, warm, warm + band, key, index)
        last_band = _band(ours, last - band, last, key, index)
        if last - warm < 2 * band or not first_band or not last_band:
            results[runner] = {"judged": False, "lived_s": round(last - warm + warmup)}
            continue
        first, final = statistics.median(first_band), statistics.median(last_band)
        results[runner] = {
            "judged": True,
            "from_t": round(warm),
            "to_t": round(last),
            "first": round(first, 1),
            "last": round(final, 1),
            "growth_pct": round(100 * (final / first - 1), 1) if first else None,
            "ok": judge(first, final),
        }
    return results


def _all_ok(results: dict[str, Any]) -> bool | None:
    judged = [entry["ok"] for entry in results.values() if entry.get("judged")]
    return all(judged) if judged else None


def rss(document: dict[str, Any]) -> dict[str, Any]:
    each = _flat_per_incarnation(
        document, "rss_mib", lambda first, last: last < first * (1 + RSS_GROWTH_BOUND)
    )
    return {"incarnations": each, "ok": _all_ok(each)}


def scrape(document: dict[str, Any]) -> dict[str, Any]:
    each = _flat_per_incarnation(
        document,
        "scrape_ms",
        lambda first, last: last <= first * SCRAPE_FACTOR_BOUND + SCRAPE_SLACK_MS,
    )
    sizes = _flat_per_incarnation(document, "scrape_bytes", lambda first, last: True)
    for runner, entry in sizes.items():
        if entry.get("judged") and runner in each:
            each[runner]["bytes_first"] = entry["first"]
            each[runner]["bytes_last"] = entry["last"]
    return {"incarnations": each, "ok": _all_ok(each)}


def _slot_value(sample: dict[str, Any], key: str, index: int) -> Any:
    values = sample.get(key) or []
    return values[index] if index < len(values) else None


def scrape_between(document: dict[str, Any]) -> dict[str, Any]:
    """Each incarnation's median scrape between two crowds of ticks, and whether each is
    under the bound."""
    each: dict[str, Any] = {}
    for index, incarnation in _incarnation_series(document):
        runner = incarnation["runner_id"]
        ours = [s for s in _in_run(document) if s["runner"][index] == runner]
        taken = [ms for s in ours if (ms := _slot_value(s, "scrape_mid_ms", index)) is not None]
        if taken:
            median = statistics.median(taken)
            ok = median < SCRAPE_BETWEEN_BOUND_MS
            each[runner] = {"judged": True, "median": round(median, 1), "ok": ok}
    return {"incarnations": each, "ok": _all_ok(each)}


def ledger(document: dict[str, Any]) -> dict[str, Any]:
    meta = document["meta"]
    length = meta["minutes"] * 60
    band = length / BANDS
    plateau = max(length / 2, meta["retention_horizon_s"] + meta["window_s"])
    rows = [
        (s["t"], s["ledger_rows"]) for s in _in_run(document) if s.get("ledger_rows") is not None
    ]
    summary = {
        "first": rows[0][1] if rows else None,
        "max": max((count for _, count in rows), default=None),
        "last": rows[-1][1] if rows else None,
        "plateau_from_t": round(plateau),
    }
    first_band = [count for t, count in rows if plateau <= t <= plateau + band]
    last_t = rows[-1][0] if rows else 0
    last_band = [count for t, count in rows if t >= last_t - band]
    if last_t - plateau < 2 * band or not first_band or not last_band:
        return summary | {"judged": False, "ok": None}
    first, final = statistics.median(first_band), max(last_band)
    return summary | {
        "judged": True,
        "plateau_median": round(first),
        "last_band_max": final,
        "growth_pct": round(100 * (final / first - 1), 1),
        "ok": final < first * (1 + LEDGER_GROWTH_BOUND),
    }


def lateness(document: dict[str, Any]) -> dict[str, Any]:
    samples = [s for s in document["samples"] if s.get("lateness_p99_ms") is not None]
    p50 = [s["lateness_p50_ms"] for s in samples]
    p99 = [s["lateness_p99_ms"] for s in samples]
    worst = max(samples, key=lambda s: s["lateness_p99_ms"], default=None)
    runs = [s["runs_per_s"] for s in samples]
    return {
        "median_p50_ms": statistics.median(p50) if p50 else None,
        "median_p99_ms": statistics.median(p99) if p99 else None,
        "worst_p99_ms": worst["lateness_p99_ms"] if worst else None,
        "worst_p99_at_t": worst["t"] if worst else None,
        "median_runs_per_s": statistics.median(runs) if runs else None,
    }


def judge(document: dict[str, Any]) -> dict[str, Any]:
    verdicts = {
        "duplicates": duplicates(document),
        "accounted": accounted(document),
        "rss": rss(document),
        "ledger": ledger(document),
        "scrape": scrape(document),
        "scrape_between": scrape_between(document),
        "lateness": lateness(document),
    }
    harness = document.get("harness_errors") or []
    failed = [name for name, verdict in verdicts.items() if verdict.get("ok") is False]
    failed += ["harness"] if harness else []
    return {**verdicts, "failed": failed, "ok": not failed}
