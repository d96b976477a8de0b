"""Results: the JSON document, the Markdown report (BENCHMARKS.md) and the PNG plots.

Every figure in the Markdown comes from the JSON, so `python -m bench.report FILE.json`
redraws the report and the plots of an earlier run.
"""

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.plots import draw_plots
from bench.reading import ceiling, fmt, mark, ratio, scenario, smoke, table
from bench.targets import section as targets_section

TARGET_FIRES_PER_S = 1000
TARGET_P99_MS = 100
TARGET_BURST_JOBS = 10_000
TARGET_BURST_S = 2.0
TARGET_PEER_FACTOR = 2.0
TARGET_CREATE_RATIO = 0.70
TARGET_SCALE_JOBS = 100_000
TARGET_RSS_MIB = 500
TARGET_READY_S = 10.0


def write_json(document: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(document, indent=1, sort_keys=False, default=str) + "\n")


def failures(document: dict[str, Any]) -> list[str]:
    """Why the run fails: a scenario that raised, or a Tickgate tick delivered twice."""
    found = []
    for name, result in document["scenarios"].items():
        if result.get("status") == "error":
            found.append(f"{name}: {result.get('error')}")
        elif name != "peers" and result.get("duplicates"):
            found.append(f"{name}: Tickgate delivered {result['duplicates']} duplicate(s)")
    return found


def write_all(
    document: dict[str, Any], out: Path, stem: str, markdown: Path | None = None
) -> list[Path]:
    """JSON, plots and `<out>/<stem>.md` (and `markdown`, e.g. BENCHMARKS.md, if given)."""
    written = [out / f"{stem}.json"]
    write_json(document, written[0])
    plots = draw_plots(document, out, stem)
    written += plots
    targets = [out / f"{stem}.md"] + ([markdown] if markdown else [])
    for target in targets:
        target.write_text(render(document, [os.path.relpath(p, target.parent) for p in plots]))
        written.append(target)
    return written


# ---------------------------------------------------------------------------- targets


def _sustained(document: dict[str, Any]) -> tuple[str, bool | None]:
    steady = scenario(document, "steady")
    if not steady:
        return "steady did not run", None
    clean = [
        level
        for level in steady["levels"]
        if level["misses"] == 0
        and level["duplicates"] == 0
        and (level["lateness"]["p99_ms"] or 1e9) < TARGET_P99_MS
    ]
    best = max(clean, key=lambda level: level["rate"], default=None)
    tried = max(level["rate"] for level in steady["levels"])
    if best is None:
        text = "no rate ran clean (p99 < 100 ms, no duplicate, no miss)"
    else:
        text = (
            f"highest clean rate {best['rate']:,} fires/s (achieved "
            f"{best['achieved_fires_per_s']:,}, p99 {best['lateness']['p99_ms']} ms)"
        )
    if tried < TARGET_FIRES_PER_S:
        return f"{text}; only rates up to {tried:,} tried", None
    return text, best is not None and best["rate"] >= TARGET_FIRES_PER_S


def _burst_target(document: dict[str, Any]) -> tuple[str, bool | None]:
    burst = scenario(document, "burst")
    sizes = {size["jobs"]: size for size in burst["sizes"]} if burst else {}
    size = sizes.get(TARGET_BURST_JOBS)
    if size is None:
        return "no 10k burst in this run", None
    complete = size["misses"] == 0 and size["duplicates"] == 0
    text = f"drain {size['drain_s']} s, {size['delivered']:,} delivered, {size['misses']} missed"
    return text, complete and (size["drain_s"] or 1e9) < TARGET_BURST_S


def _peer_best(document: dict[str, Any]) -> tuple[str, float] | None:
    peers = scenario(document, "peers")
    best = None
    for name, peer in (peers or {}).get("peers", {}).items():
        value = (peer.get("steady") or {}).get("max_achieved_fires_per_s")
        if value and (best is None or value > best[1]):
            best = (name, float(value))
    return best


def _peer_target(document: dict[str, Any]) -> tuple[str, bool | None]:
    steady = scenario(document, "steady")
    best = _peer_best(document)
    if not steady or best is None:
        return "no peer results in this run", None
    ours = steady["max_achieved_fires_per_s"]
    factor = ours / best[1]
    return (
        f"Tickgate {ours:,} vs {best[0]} {best[1]:,} fires/s: {factor:.2f}x",
        factor >= TARGET_PEER_FACTOR,
    )


def _create_target(document: dict[str, Any]) -> tuple[str, bool | None]:
    api = scenario(document, "api")
    ratios = [
        r
        for r in (api or {}).get("over_baseline", [])
        if r["endpoint"] == "POST /v1/jobs" and r["condition"] == "tickgate_idle"
    ]
    if not ratios:
        return "api did not run", None
    text = ", ".join(f"c{r['concurrency']}: {r['rps_over_baseline']:.0%}" for r in ratios)
    return text, all(r["rps_over_baseline"] >= TARGET_CREATE_RATIO for r in ratios)


def _scale_target(document: dict[str, Any]) -> tuple[str, bool | None]:
    scale = scenario(document, "scale")
    if not scale:
        return "scale did not run", None
    rss, ready = max(scale["replica_rss_peak_mib"]), max(scale["replica_ready_s"])
    solo_rss, solo_ready = scale["solo_rss_peak_mib"], scale["solo_ready_s"]
    text = (
        f"{scale['jobs']:,} jobs: one replica alone {solo_rss} MiB, ready {solo_ready} s; "
        f"three together max {rss} MiB, ready {ready} s"
    )
    if scale["jobs"] < TARGET_SCALE_JOBS:
        return f"{text}; target is for {TARGET_SCALE_JOBS:,}", None
    return text, max(rss, solo_rss) < TARGET_RSS_MIB and solo_ready < TARGET_READY_S


def targets(document: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    checks = [
        ("≥1000 fires/s sustained, p99 lateness < 100 ms, zero duplicates and misses", _sustained),
        ("10k burst fully started in < 2 s", _burst_target),
        ("≥2x the best peer's fire throughput", _peer_target),
        ("REST create ≥70% of the bare baseline", _create_target),
        ("100k jobs: < 500 MB RSS per replica, ready in < 10 s", _scale_target),
    ]
    smoke_run = smoke(document)
    rows = []
    for title, check in checks:
        text, met = check(document)
        rows.append(
            (
                title,
                text + (" (smoke: not judged)" if smoke_run else ""),
                None if smoke_run else met,
            )
        )
    return rows


# ---------------------------------------------------------------------------- sections


def _header(document: dict[str, Any]) -> list[str]:
    meta = document["meta"]
    machine, pg = meta["machine"], meta["postgres"]
    settings = ", ".join(f"{k}={v}" for k, v in sorted(pg.get("settings", {}).items()))
    kind = "smoke run (tiny sizes: not figures to quote)" if meta.get("smoke") else "full run"
    return [
        "# Tickgate benchmarks",
        "",
        f"Generated by `{'make bench-smoke' if meta.get('smoke') else 'make bench'}` "
        f"({kind}) on {meta['date']}, commit `{machine.get('git_commit')}`"
        f"{' (uncommitted changes)' if machine.get('git_dirty') else ''}, "
        f"in {meta.get('wall_seconds', '?')} s.",
        "",
        f"- **Machine:** {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, "
        f"{machine['memory_gib']} GiB, {machine['os']}, Python {machine['python']}; "
        f"load average at start {machine.get('load_average_at_start')}.",
        f"- **PostgreSQL:** {pg['version_short']} "
        f"({'embedded, unix socket' if pg['embedded'] else 'BENCH_DATABASE_URL'}); {settings}.",
        "- **Tickgate:** 3 `tickgate serve` replicas, `TICKGATE_LOG_LEVEL=WARNING`, JSON logs, "
        "everything else default (4 lock sessions, 5000 runs in flight, API pool 10, "
        "ownership on: each job has an owner replica and a standby). All on the same 2-core box as "
        "PostgreSQL, the receiver and the load generator: CPU columns are in cores (1.0 = one "
        "core busy); `box` is the whole machine, anything else running included.",
        f"- **Load generator (api):** {meta.get('load_generator')}.",
        f"- **Repeats:** {_repeats(meta['sizes']['repeats'])}",
        "- **Deliveries** of the `http` task are counted by a loopback HTTP receiver from "
        "its own records (job, scheduled tick, arrival), not from Tickgate's ledger; the "
        "`log` task sends nothing, so its scenarios read the ledger (`started_at`).",
        "",
    ]


def _repeats(count: int) -> str:
    if count <= 1:
        return "every figure is a single run."
    return (
        f"limit, api and bulk figures are the median of {count} runs; steady, steady_log, "
        "burst, scale, scale_out and replicas run once per size (they are long)."
    )


def _targets_section(document: dict[str, Any]) -> list[str]:
    rows = [(title, text, mark(met)) for title, text, met in targets(document)]
    return ["## Targets", "", *table(["target (this 2-core box)", "measured", ""], rows)]


def _limit_section(document: dict[str, Any]) -> list[str]:
    limit = scenario(document, "limit")
    if not limit:
        return []
    rows = [(lv["clients"], lv["tps"], lv["latency_avg_ms"]) for lv in limit["levels"]]
    return [
        "## 1. limit: the gate alone in pgbench",
        "",
        "`pg_try_advisory_lock` + ledger `INSERT ... ON CONFLICT DO NOTHING` + "
        f"`pg_advisory_unlock`, prepared, {limit['seconds']} s per run. The best figure "
        "is the ceiling every fire rate below is divided by.",
        "",
        *table(["clients", "gated fires/s (tps)", "avg latency ms"], rows),
    ]


def _steady_section(document: dict[str, Any]) -> list[str]:
    steady = scenario(document, "steady")
    if not steady:
        return []
    top = ceiling(document)
    rows = [
        (
            lv["rate"],
            lv["achieved_fires_per_s"],
            ratio(lv["achieved_fires_per_s"], top),
            lv["lateness"]["p50_ms"],
            lv["lateness"]["p99_ms"],
            lv["lateness"]["max_ms"],
            lv["duplicates"],
            lv["misses"],
            lv["cpu_cores"].get("replicas"),
            lv["cpu_cores"].get("postgres"),
            lv["cpu_cores"].get("receiver"),
            lv["cpu_cores"].get("box"),
            max(lv["replica_rss_mib"]),
            _held(lv, "lock_held_after_return"),
            _held(lv, "lock_held_after_return_first_second"),
        )
        for lv in steady["levels"]
    ]
    header = [
        "target fires/s", "achieved", "÷ limit", "lateness p50 ms", "p99 ms", "max ms",
        "dup", "miss", "CPU replicas", "CPU postgres", "CPU receiver", "CPU box", "max RSS MiB",
        "lock held after return p99 ms", "same, first second p99 ms",
    ]  # fmt: skip
    return [
        "## 2. steady: one-second jobs",
        "",
        f"Half 6-field cron `* * * * * *`, half 1 s intervals, `http` task to the receiver; "
        f"{steady['window_seconds']} s window after a warm-up. Lateness = receipt - nominal tick; "
        "a miss is a tick of the window not received within 20 s after the window closed "
        "(Tickgate itself records ticks later than the 60 s misfire grace as misfires). "
        "Lock held after return = a run's recorded end (written with its unlock) minus the "
        "receiver's answer, over every run since the replicas started, and over each "
        "replica's first second of runs.",
        "",
        *table(header, rows),
    ]


def _held(level: dict[str, Any], key: str) -> float | None:
    """A p99 the harness measured, or None for results from before it did."""
    summary = level.get(key) or {}
    value: float | None = summary.get("p99_ms")
    return value


def _burst_row(size: dict[str, Any], top: float | None) -> tuple[Any, ...]:
    log = size.get("task") == "log"
    return (
        size["jobs"],
        "`log` (ledger)" if log else "`http` (receiver)",
        *(fmt(size[key], 3) for key in ("drain_s", "p50_s", "p99_s")),
        size["drain_fires_per_s"],
        ratio(size["drain_fires_per_s"], top),
        size["duplicates"],
        size["missing"] if log else size["misses"],
        "yes" if size["ready_before_t0"] else "NO",
        max(size["replica_ready_s"]),
    )


def _burst_section(document: dict[str, Any]) -> list[str]:
    burst = scenario(document, "burst")
    if not burst:
        return []
    top = ceiling(document)
    rows = [_burst_row(size, top) for size in [*burst["sizes"], *burst.get("log_sizes", [])]]
    header = [
        "jobs at T0", "task (counted by)", "drain s (last - T0)", "half by s", "99 % by s",
        "fires/s", "÷ limit", "dup", "miss", "synced before T0", "replica ready s",
    ]  # fmt: skip
    return [
        "## 4. burst: every job due in one second",
        "",
        "`once` jobs at T0, loaded by each replica's first sync. `http`: times are receipts "
        "minus T0. `log`: times are the ledger's `started_at` minus T0; dup = jobs with more "
        "than one row, miss = jobs with no row (a row that is a skip is no start).",
        "",
        *table(header, rows),
    ]


def _api_section(document: dict[str, Any]) -> list[str]:
    api = scenario(document, "api")
    if not api:
        return []
    cells = {(c["condition"], c["endpoint"], c["concurrency"]): c for c in api["cells"]}
    keys = list(dict.fromkeys((c["endpoint"], c["concurrency"]) for c in api["cells"]))
    rows = []
    for endpoint, concurrency in keys:
        row: list[Any] = [f"`{endpoint}`", concurrency]
        for condition in ("tickgate_idle", "tickgate_loaded", "baseline"):
            cell = cells.get((condition, endpoint, concurrency))
            row.append(_api_cell(cell))
        idle, base = (
            cells.get(("tickgate_idle", endpoint, concurrency)),
            cells.get(("baseline", endpoint, concurrency)),
        )
        row.append(ratio(idle["rps"] if idle else None, base["rps"] if base else None))
        rows.append(row)
    background = api.get("background_fires", {})
    header = [
        "endpoint",
        "conc.",
        "Tickgate idle",
        "Tickgate + fires",
        "bare baseline",
        "idle ÷ baseline",
    ]
    return [
        "## 5. api: REST under closed-loop load",
        "",
        f"Generator: {api['generator_version']}; {api['seconds']} s per run, connections "
        "round-robin over 3 processes. Cells: req/s (p50 / p99 ms). "
        f"`Tickgate + fires`: while {background.get('rate')} one-second jobs fire.",
        "",
        *table(header, rows),
        f"Fires during the loaded runs: {background.get('achieved_fires_per_s')} /s achieved, "
        f"lateness p99 {background.get('lateness', {}).get('p99_ms')} ms, "
        f"{background.get('duplicates')} duplicates, {background.get('misses')} misses."
        + _top_concurrency_fires(background),
        "",
    ]


def _top_concurrency_fires(background: dict[str, Any]) -> str:
    """The ticks that fell while the generator ran at the highest concurrency."""
    top = background.get("at_top_concurrency")
    if not top:
        return ""
    return (
        f" Ticks while the generator ran at c{top['concurrency']} ({top['ticks_s']} s, every "
        f"endpoint): lateness p50 {top['lateness']['p50_ms']} ms, p99 "
        f"{top['lateness']['p99_ms']} ms, {top['misses']} misses of {top['expected']:,}."
    )


def _api_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    errors = f", {cell['errors'] + cell['non_2xx']} err" if cell["errors"] + cell["non_2xx"] else ""
    return f"{fmt(cell['rps'])} ({fmt(cell['p50_ms'])} / {fmt(cell['p99_ms'])}){errors}"


def _scale_section(document: dict[str, Any]) -> list[str]:
    scale = scenario(document, "scale")
    if not scale:
        return []
    walk = scale["paging"]["walk_limit_1000"]
    together_ready = " / ".join(fmt(x, 2) for x in scale["replica_ready_s"])
    together_rss = " / ".join(fmt(x) for x in scale["replica_rss_peak_mib"])
    page = walk["page"]
    rows = [
        ("one replica alone: ready after start, s", fmt(scale["solo_ready_s"], 2)),
        ("one replica alone: peak RSS, MiB", fmt(scale["solo_rss_peak_mib"])),
        ("three together: ready after start, s", together_ready),
        ("three together: peak RSS, MiB", together_rss),
        (
            f"walk all jobs, limit=1000 ({walk['pages']} pages)",
            f"{walk['total_s']} s; page p50 {page['p50_ms']} ms, p99 {page['p99_ms']} ms",
        ),
        ("first page, limit=100: p50 / p99 ms", _pair(scale["paging"]["first_page_limit_100"])),
        ("prefix page, limit=100: p50 / p99 ms", _pair(scale["paging"]["prefix_page_limit_100"])),
    ]
    if "metrics_scrape" in scale["paging"]:
        rows.append(
            ("`GET /metrics` scrape: p50 / p99 ms", _pair(scale["paging"]["metrics_scrape"]))
        )
    return [
        f"## 7. scale: {scale['jobs']:,} jobs in the database",
        "",
        "Ready = first 200 of `GET /readyz` (the scheduler's first sync done), timed from "
        "process start; RSS is the peak from start to 5 s after ready.",
        "",
        *table(["measure", "value"], rows),
    ]


def _pair(summary: dict[str, Any]) -> str:
    return f"{fmt(summary['p50_ms'])} / {fmt(summary['p99_ms'])}"


def _steady_log_section(document: dict[str, Any]) -> list[str]:
    result = scenario(document, "steady_log")
    if not result:
        return []
    top = ceiling(document)
    rows = [
        (
            lv["rate"],
            lv["achieved_fires_per_s"],
            ratio(lv["achieved_fires_per_s"], top),
            lv["lateness"]["p50_ms"],
            lv["lateness"]["p99_ms"],
            lv["lateness"]["max_ms"],
            lv["missing"],
            _counts(lv["skipped_by_reason"]),
            _counts(lv["other_by_status"]),
            "yes" if lv["clean"] else "no",
            lv["cpu_cores"].get("replicas"),
            lv["cpu_cores"].get("postgres"),
            lv["cpu_cores"].get("box"),
            max(lv["replica_rss_mib"]),
        )
        for lv in result["levels"]
    ]
    header = [
        "target fires/s", "succeeded/s", "÷ limit", "lateness p50 ms", "p99 ms", "max ms",
        "missing", "skipped", "other", "clean", "CPU replicas", "CPU postgres", "CPU box",
        "max RSS MiB",
    ]  # fmt: skip
    return [
        "## 3. steady_log: one-second `log` jobs, judged from the ledger",
        "",
        f"As steady, with the `log` task (its message below the replicas' log level: the fire "
        f"path alone), {result['window_seconds']} s window. Lateness = `started_at - "
        f"scheduled_for`. Clean: {result['clean_rule']}. Highest clean rate: "
        f"**{fmt(result['highest_clean_rate'])}**.",
        "",
        *table(header, rows),
    ]


def _counts(by_name: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in by_name.items()) or "0"


def _bulk_section(document: dict[str, Any]) -> list[str]:
    result = scenario(document, "bulk")
    if not result:
        return []
    rows = [
        (f"attempt {i + 1}", a["created_s"], a["unchanged_s"])
        for i, a in enumerate(result["attempts"])
    ]
    rows.append(("**median**", result["created_s"], result["unchanged_s"]))
    return [
        f"## 6. bulk: `PUT /v1/jobs` of {result['jobs']:,} jobs",
        "",
        "One replica, a fresh database each attempt; the set applied once (every job "
        "created), then again (every job unchanged). Seconds from sending to the answer.",
        "",
        *table(["", "created s", "unchanged s"], [tuple(fmt(v, 3) for v in r) for r in rows]),
    ]


def _retention_section(document: dict[str, Any]) -> list[str]:
    result = scenario(document, "retention")
    if not result or result.get("status") != "ok":
        return []
    rows = [
        ("ledger rows before the round", f"{result['rows_before']:,}"),
        ("rows deleted (newest kept per job)", f"{result['pruned']:,} ({result['keep_per_job']})"),
        ("one round, s", fmt(result["round_seconds"], 2)),
        ("**rows deleted per second**", f"{result['rows_per_second']:,}"),
    ]
    return [
        f"## retention: one round over {result['jobs']:,} jobs",
        "",
        "One retention round (`Store.prune_runs`, as a replica's sweep runs it once per "
        "reconcile round), timed from outside. Retention keeps up with any steady fire "
        "rate below the rows-per-second figure (before: at most 10,000 rows per round, "
        "333 rows/s at the default 30 s round).",
        "",
        *table(["measure", "value"], rows),
    ]


def _scale_out_section(document: dict[str, Any]) -> list[str]:
    result = scenario(document, "scale_out")
    if not result:
        return []
    if "did_not_fit" in result:
        body = [f"{result['jobs']:,} jobs did not fit: {result['did_not_fit']}.", ""]
    else:
        rows = [
            (f"replica {i}", ready, rss)
            for i, (ready, rss) in enumerate(
                zip(result["replica_ready_s"], result["rss_peak_mib_each"], strict=True)
            )
        ]
        body = table(["", "ready after start s", "peak RSS MiB"], rows)
    note = f" {result['fits_note']}." if result.get("fits_note") else ""
    return [
        f"## 8. scale_out: {result['jobs']:,} jobs over {result['replicas']} owning replicas",
        "",
        "`TICKGATE_OWNERSHIP=on`; the replicas start together. Ready = first 200 of "
        "`GET /readyz` from process start; RSS is each process tree's peak from start to "
        f"a few seconds after the last was ready. {result['available_mib_at_start']:,} MiB "
        f"were available at the start.{note}",
        "",
        *body,
    ]


def _replicas_section(document: dict[str, Any]) -> list[str]:
    result = scenario(document, "replicas")
    if not result:
        return []
    top = ceiling(document)
    rows = [
        (
            step["replicas"],
            step["fires_per_s"],
            ratio(step["fires_per_s"], top),
            *(fmt(step[key], 3) for key in ("drain_s", "p50_s", "p99_s")),
            step["missing"],
            step["cpu_cores"].get("replicas"),
            " / ".join(fmt(c, 2) for c in step["cpu_cores_each"]),
            step["cpu_cores"].get("postgres"),
            step["cpu_cores"].get("box"),
            " / ".join(fmt(r) for r in step["rss_peak_mib_each"]),
            " / ".join(fmt(r) for r in step["runs_each"]),
            "yes" if step["settled_before_t0"] else "NO",
        )
        for step in result["steps"]
    ]
    header = [
        "replicas", "fires/s", "÷ limit", "drain s", "half by s", "99 % by s", "miss",
        "CPU replicas", "CPU each", "CPU postgres", "CPU box", "peak RSS MiB each",
        "runs each", "views settled before T0",
    ]  # fmt: skip
    return [
        "## 9. replicas: saturated fires/s against the number of replicas",
        "",
        f"{result['jobs']:,} `log` jobs due at T0 on 1, 2 and 4 replicas with "
        "`TICKGATE_OWNERSHIP=on`; fires/s = jobs / drain time (last `started_at` - T0, from "
        "the ledger); CPU in cores over the drain; RSS from ready to drained. "
        f"Rises with every step: **{'yes' if result['rises_every_step'] else 'no'}**.",
        "",
        *table(header, rows),
    ]


def _peers_section(document: dict[str, Any]) -> list[str]:
    result = document["scenarios"].get("peers")
    if not result or result.get("status") != "ok":
        return []
    top = ceiling(document)
    steady, burst = scenario(document, "steady"), scenario(document, "burst")
    ours = steady["max_achieved_fires_per_s"] if steady else None
    rows = [
        (
            "**Tickgate**",
            ours,
            ratio(ours, top),
            "1.00",
            _best_p99(steady),
            sum(level["duplicates"] for level in (steady or {}).get("levels", [])),
            sum(level["misses"] for level in (steady or {}).get("levels", [])),
            _largest_burst(burst),
            "",
        )
    ]
    rows += [_peer_row(name, peer, ours, top) for name, peer in result.get("peers", {}).items()]
    header = [
        "system", "max fires/s", "÷ limit", "Tickgate ÷ it", "p99 ms at that rate",
        "dup (all rates)", "miss (all rates)", "largest burst: drain s", "version / notes",
    ]  # fmt: skip
    return [
        "## Peers: the alternatives on the same box",
        "",
        "Same receiver, same counting, 3 processes each (`bench/peers`); the same steady "
        "rates and crowd sizes up to 1,000/s and 10k (above every peer's saturation the "
        "larger ones only cost time). A peer's duplicates are reported, not judged.",
        "",
        *table(header, rows),
    ]


def _best_level(steady: dict[str, Any] | None) -> dict[str, Any] | None:
    levels = (steady or {}).get("levels", [])
    return max(levels, key=lambda level: level.get("achieved_fires_per_s") or 0, default=None)


def _best_p99(steady: dict[str, Any] | None) -> Any:
    best = _best_level(steady)
    return best.get("lateness", {}).get("p99_ms") if best else None


def _largest_burst(burst: dict[str, Any] | None) -> str:
    sizes = (burst or {}).get("sizes", [])
    if not sizes:
        return "-"
    size = max(sizes, key=lambda s: s["jobs"])
    return f"{fmt(size.get('drain_s'), 2)} ({size['jobs']:,} jobs, {size.get('misses')} miss)"


def _peer_row(
    name: str, peer: dict[str, Any], ours: float | None, top: float | None
) -> tuple[Any, ...]:
    if peer.get("status") == "skipped":
        return (name, None, "-", "-", None, "", "", "-", f"skipped: {peer.get('reason')}")
    steady = peer.get("steady") or {}
    levels = steady.get("levels", [])
    best = steady.get("max_achieved_fires_per_s")
    return (
        name,
        best,
        ratio(best, top),
        ratio(ours, best),
        _best_p99(steady),
        sum(level.get("duplicates", 0) for level in levels),
        sum(level.get("misses", 0) for level in levels),
        _largest_burst(peer.get("burst")),
        peer.get("version", ""),
    )


def _problems_section(document: dict[str, Any]) -> list[str]:
    lines = []
    for name, result in document["scenarios"].items():
        if result.get("status") == "skipped":
            lines.append(f"- **{name}** skipped: {result.get('reason')}")
        elif result.get("status") == "error":
            lines.append(f"- **{name}** failed: `{result.get('error')}`")
    return ["## Not measured", "", *lines, ""] if lines else []


def _profiling_section() -> list[str]:
    """bench/PROFILING.md, kept by hand: what was profiled and fixed, before and after."""
    notes = Path(__file__).with_name("PROFILING.md")
    return [notes.read_text().rstrip(), ""] if notes.exists() else []


def render(document: dict[str, Any], plots: Sequence[str]) -> str:
    sections = [
        _header(document),
        targets_section(document),
        _targets_section(document),
        _profiling_section(),
        _limit_section(document),
        _steady_section(document),
        _steady_log_section(document),
        _burst_section(document),
        _api_section(document),
        _bulk_section(document),
        _scale_section(document),
        _retention_section(document),
        _scale_out_section(document),
        _replicas_section(document),
        _peers_section(document),
        _problems_section(document),
        ["## Plots", "", *(f"![{Path(p).stem}]({p})" for p in plots), ""] if plots else [],
    ]
    return "\n".join(line for section in sections for line in section)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.report RESULTS.json [BENCHMARKS.md]`: redraw the report and plots
    beside the results (after editing PROFILING.md, say), and the given Markdown file."""
    arguments = argv if argv is not None else sys.argv[1:]
    path = Path(arguments[0])
    markdown = Path(arguments[1]) if len(arguments) > 1 else None
    document = json.loads(path.read_text())
    for written in write_all(document, path.parent, path.stem, markdown):
        print(written)


if __name__ == "__main__":
    main()
