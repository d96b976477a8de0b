"""The report's targets table: for each measure this run's figure, the figure before
(of the first run), the target, and whether it is met. The rows are data
(`bench/targets.json`); this module holds the checks they name. The report judges;
tests never do. A smoke run judges nothing.

Each check reads the results document and answers (measured text, met): met is None
when this run cannot say (the scenario did not run, or ran at other sizes).
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.reading import ceiling, fmt, mark, scenario, smoke, table

TARGETS = Path(__file__).with_name("targets.json")
UNMET_NOTE = "limit: (see PROFILING.md)"
MB = 1_000_000 / 2**20  # MiB per MB: RSS is sampled in MiB, the target is in MB


def _crowd(document: dict[str, Any], key: str, jobs: int) -> dict[str, Any] | None:
    burst = scenario(document, "burst") or {}
    return next((size for size in burst.get(key, []) if size["jobs"] == jobs), None)


def _drain(size: dict[str, Any], counts: str, met: bool) -> tuple[str, bool | None]:
    """A crowd's drain and counts; judged only if the replicas synced before T0."""
    synced = "" if size["ready_before_t0"] else "; replicas NOT synced before T0: not clean"
    text = (
        f"{fmt(size['drain_s'], 2)} s (half {fmt(size['p50_s'], 2)} s, 99 % "
        f"{fmt(size['p99_s'], 2)} s); {counts}{synced}"
    )
    return text, met if size["ready_before_t0"] else None


def log_crowd(
    document: dict[str, Any], jobs: int = 10_000, seconds: float = 2.0
) -> tuple[str, bool | None]:
    size = _crowd(document, "log_sizes", jobs)
    if size is None:
        return f"no {jobs:,}-job `log` crowd in this run", None
    counts = (
        f"{size['started']:,} started, {size['missing']} without a row, "
        f"{size['jobs_with_more_than_one_row']} with more than one"
    )
    complete = size["started"] == size["jobs"] and not size["jobs_with_more_than_one_row"]
    return _drain(size, counts, complete and (size["drain_s"] or 1e9) < seconds)


def http_crowd(document: dict[str, Any]) -> tuple[str, bool | None]:
    size = _crowd(document, "sizes", 10_000)
    if size is None:
        return "no 10k `http` crowd in this run", None
    counts = f"{size['delivered']:,} received, {size['misses']} missed, {size['duplicates']} twice"
    complete = size["misses"] == 0 and size["duplicates"] == 0
    return _drain(size, counts, complete and (size["drain_s"] or 1e9) < 3.0)


def steady_http(document: dict[str, Any]) -> tuple[str, bool | None]:
    levels = (scenario(document, "steady") or {}).get("levels", [])
    level = next((lv for lv in levels if lv["rate"] == 1000), None)
    if level is None:
        return "no 1,000/s steady level in this run", None
    p99 = level["lateness"]["p99_ms"]
    text = f"{fmt(p99)} ms, {level['duplicates']}, {level['misses']}"
    return text, p99 is not None and p99 < 100 and not level["duplicates"] and not level["misses"]


def clean_log_rate(document: dict[str, Any], rate: int = 4000) -> tuple[str, bool | None]:
    result = scenario(document, "steady_log")
    if not result:
        return "steady_log did not run", None
    best = result["highest_clean_rate"]
    tried = ", ".join(f"{level['rate']:,}" for level in result["levels"])
    if best is None:
        return f"no rate clean (tried {tried}/s)", False
    level = next(level for level in result["levels"] if level["rate"] == best)
    text = f"{best:,}/s (p99 {fmt(level['lateness']['p99_ms'])} ms; tried {tried}/s)"
    if best < rate and max(level["rate"] for level in result["levels"]) < rate:
        return f"{text}; rates of {rate:,}/s not tried", None
    return text, best >= rate


def best_gated_rate(document: dict[str, Any]) -> tuple[float, str] | None:
    """The best of the `http` steady rate achieved and the `log` clean rate's, and which."""
    candidates = []
    steady = scenario(document, "steady")
    if steady:
        candidates.append((steady["max_achieved_fires_per_s"], "`http` steady, achieved"))
    steady_log = scenario(document, "steady_log")
    if steady_log and steady_log["highest_clean_rate"] is not None:
        levels = {level["rate"]: level for level in steady_log["levels"]}
        achieved = levels[steady_log["highest_clean_rate"]]["achieved_fires_per_s"]
        candidates.append((achieved, "`log` highest clean rate"))
    return max(candidates, default=None)


def gated_over_limit(document: dict[str, Any]) -> tuple[str, bool | None]:
    top, best = ceiling(document), best_gated_rate(document)
    if not top or best is None:
        return "needs limit and steady or steady_log", None
    share = best[0] / top
    return f"{share:.2f} ({best[0]:,.0f} fires/s, {best[1]}; limit {top:,.0f}/s)", share >= 0.3


def replica_scaling(document: dict[str, Any]) -> tuple[str, bool | None]:
    result = scenario(document, "replicas")
    if not result:
        return "replicas did not run", None
    steps = result["steps"]
    curve = " → ".join(f"{s['replicas']}: {fmt(s['fires_per_s'], 0)}/s" for s in steps)
    cpu = "; ".join(
        f"{s['replicas']}: " + " / ".join(fmt(c, 2) for c in s["cpu_cores_each"]) for s in steps
    )
    unsettled = [s["replicas"] for s in steps if not s["settled_before_t0"]]
    text = f"{curve}; CPU cores each {cpu}"
    if unsettled:
        return f"{text}; views not settled before T0 at {unsettled}: not clean", None
    return text, result["rises_every_step"]


def million_jobs(
    document: dict[str, Any], ready_s: float = 30, rss_mb: float = 500
) -> tuple[str, bool | None]:
    result = scenario(document, "scale_out")
    if not result:
        return "scale_out did not run", None
    if "did_not_fit" in result:
        return f"{result['jobs']:,} jobs did not fit: {result['did_not_fit']}", False
    rss = [round(mib / MB) for mib in result["rss_peak_mib_each"]]
    pss = [round(mib / MB) for mib in result.get("pss_peak_mib_each", [])]
    text = (
        f"{result['jobs']:,} jobs: all ready {fmt(result['all_ready_s'], 1)} s; "
        f"peak RSS each {' / '.join(map(str, rss))} MB"
        + (f" (PSS {' / '.join(map(str, pss))} MB)" if pss else "")
    )
    if result.get("fits_note"):
        return f"{text} ({result['fits_note']})", None
    if result["jobs"] < 1_000_000:
        return text, None
    return text, result["all_ready_s"] < ready_s and max(rss) < rss_mb


def memory_with_jobs(document: dict[str, Any], within_mb: float = 50) -> tuple[str, bool | None]:
    """The peak RSS of scale_out's replicas with all their jobs, against the same replicas
    with one job: the cost of the jobs themselves."""
    result = scenario(document, "scale_out") or {}
    one = (result.get("one_job") or {}).get("rss_peak_mib_each")
    if not one or not result.get("rss_peak_mib_each"):
        return "scale_out (with its one-job run) did not run", None
    most, least = max(result["rss_peak_mib_each"]) / MB, max(one) / MB
    text = (
        f"{result['jobs']:,} jobs: {most:,.0f} MB; 1 job: {least:,.0f} MB "
        f"(peak RSS of the largest replica): {most - least:+,.0f} MB"
    )
    if "did_not_fit" in result or result["jobs"] < 1_000_000:
        return text, None
    return text, most - least < within_mb


def bulk_apply(document: dict[str, Any]) -> tuple[str, bool | None]:
    result = scenario(document, "bulk")
    if not result:
        return "bulk did not run", None
    text = (
        f"{fmt(result['created_s'], 2)} s created, {fmt(result['unchanged_s'], 2)} s "
        f"unchanged ({result['jobs']:,} jobs, median of {result['repeats']})"
    )
    if result["jobs"] != 10_000:
        return text, None
    return text, result["created_s"] < 2.0


def fires_under_api_load(document: dict[str, Any]) -> tuple[str, bool | None]:
    background = (scenario(document, "api") or {}).get("background_fires", {})
    top = background.get("at_top_concurrency")
    if not top:
        return "api did not run (or ran before the c64 window was measured)", None
    p99 = top["lateness"]["p99_ms"]
    text = (
        f"{_seconds(p99)} / {top['misses']} (c{top['concurrency']}, {background['rate']}/s; "
        f"whole loaded run: {_seconds(background['lateness']['p99_ms'])} / "
        f"{background['misses']})"
    )
    if top["concurrency"] != 64 or background["rate"] != 250:
        return text, None
    return text, p99 is not None and p99 < 200 and top["misses"] == 0


def _seconds(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.3f} s"


def over_baseline(
    document: dict[str, Any], endpoint: str, target: float
) -> tuple[str, bool | None]:
    """Tickgate idle over the bare baseline, on `endpoint`, at each concurrency."""
    ratios = [
        r
        for r in (scenario(document, "api") or {}).get("over_baseline", [])
        if r["endpoint"] == endpoint and r["condition"] == "tickgate_idle"
    ]
    if not ratios:
        return "api did not run", None
    text = ", ".join(f"c{r['concurrency']}: {r['rps_over_baseline']:.2f}" for r in ratios)
    return text, all(r["rps_over_baseline"] >= target for r in ratios)


CHECKS: dict[str, Callable[..., tuple[str, bool | None]]] = {
    check.__name__: check
    for check in (
        log_crowd,
        http_crowd,
        steady_http,
        clean_log_rate,
        gated_over_limit,
        replica_scaling,
        million_jobs,
        memory_with_jobs,
        bulk_apply,
        fires_under_api_load,
        over_baseline,
    )
}


def load(path: Path = TARGETS) -> dict[str, Any]:
    targets: dict[str, Any] = json.loads(path.read_text())
    return targets


def _judged(document: dict[str, Any], row: dict[str, Any]) -> tuple[str, bool | None]:
    text, met = CHECKS[row["check"]](document, **row.get("args", {}))
    return (f"{text} (smoke: not judged)", None) if smoke(document) else (text, met)


def section(document: dict[str, Any], targets: dict[str, Any] | None = None) -> list[str]:
    targets = targets or load()
    rows = []
    for row in targets["rows"]:
        text, met = _judged(document, row)
        limit = row.get("limit")
        note = (f"limit: {limit}" if limit else UNMET_NOTE) if met is False else ""
        rows.append((row["measure"], row["before"], row["target"], text, mark(met), note))
    header = ["measure", targets["before_label"], "target", "this run", "", "why not"]
    return [f"## {targets['title']}", "", targets["intro"], "", *table(header, rows)]
