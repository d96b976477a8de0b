"""The targets: for each measure its target, how a results document is judged against
it, and what held it back where it was last profiled. The rows are data
(`bench/targets.json`, read by the current table, the side-by-side table and each run's
own report); this module holds the checks they name. The report judges; tests never do.
A smoke run judges nothing.

Each check reads the results document and answers (measured text, met): met is None
when this run cannot say (the scenario did not run, or ran at other sizes).
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.reading import ceiling, fmt, mark, scenario, smoke, table

TARGETS = Path(__file__).with_name("targets.json")
UNMET_NOTE = "limit: not profiled yet"
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


def scale_jobs(
    document: dict[str, Any], ready_s: float = 10, rss_mb: float = 500
) -> tuple[str, bool | None]:
    """scale's jobs on one replica alone and on three together: ready and peak RSS."""
    result = scenario(document, "scale")
    if not result:
        return "scale did not run", None
    solo, together = result["solo_rss_peak_mib"] / MB, max(result["replica_rss_peak_mib"]) / MB
    ready = max(result["solo_ready_s"], *result["replica_ready_s"])
    text = (
        f"{result['jobs']:,} jobs: one replica alone ready {fmt(result['solo_ready_s'], 1)} s, "
        f"{solo:,.0f} MB; three together ready {fmt(max(result['replica_ready_s']), 1)} s, "
        f"{together:,.0f} MB"
    )
    if result["jobs"] != 100_000:
        return text, None
    return text, ready < ready_s and max(solo, together) < rss_mb


def best_peer(document: dict[str, Any]) -> tuple[str, float] | None:
    """The peer with the highest steady fires/s achieved in this run, and that rate."""
    peers = (scenario(document, "peers") or {}).get("peers", {})
    rates = [
        (name, float(rate))
        for name, peer in peers.items()
        if (rate := (peer.get("steady") or {}).get("max_achieved_fires_per_s"))
    ]
    return max(rates, key=lambda named: named[1], default=None)


def over_best_peer(document: dict[str, Any], factor: float = 2.0) -> tuple[str, bool | None]:
    steady, best = scenario(document, "steady"), best_peer(document)
    if not steady or best is None:
        return "steady and peers did not both run", None
    ours = steady["max_achieved_fires_per_s"]
    text = f"{ours / best[1]:.2f}x: Tickgate {fmt(ours)}/s, {best[0]} {fmt(best[1])}/s"
    return text, ours >= factor * best[1]


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
        scale_jobs,
        over_best_peer,
    )
}


def load(path: Path = TARGETS) -> dict[str, Any]:
    targets: dict[str, Any] = json.loads(path.read_text())
    return targets


def named(measures: list[str], targets: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of these measures, in this order."""
    rows = {row["measure"]: row for row in (targets or load())["rows"]}
    return [rows[measure] for measure in measures]


def judged(document: dict[str, Any], row: dict[str, Any]) -> tuple[str, bool | None]:
    """The row's figure in `document`, and met or not (None: not measured there)."""
    text, met = CHECKS[row["check"]](document, **row.get("args", {}))
    return (f"{text} (smoke: not judged)", None) if smoke(document) else (text, met)


def why_not(row: dict[str, Any], met: bool | None) -> str:
    """The row's limit when unmet: what held it back where it was last profiled."""
    if met is not False:
        return ""
    return f"limit: {row['limit']}" if "limit" in row else UNMET_NOTE


def section(document: dict[str, Any], targets: dict[str, Any] | None = None) -> list[str]:
    """A run's own report: every target judged on this run alone."""
    rows = []
    for row in (targets or load())["rows"]:
        text, met = judged(document, row)
        rows.append((row["measure"], row["target"], text, mark(met), why_not(row, met)))
    header = ["measure", "target", "this run", "", "why not"]
    return ["## Targets, judged on this run", "", *table(header, rows)]
