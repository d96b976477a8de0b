"""Results: the JSON document, the Markdown report (BENCHMARKS.md) and the PNG plots.

Every figure in the Markdown comes from the JSON, so `python -m bench.report FILE.json`
redraws the report and the plots of an earlier run.
"""

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import versus
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
        text = render(document, [os.path.relpath(p, target.parent) for p in plots])
        target.write_text(versus.kept_from(target, text))
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


Result = dict[str, Any]
Column = tuple[str, Callable[[Result], Any]]


def _section(title: str, intro: str, header: Sequence[str], rows: Sequence[Any]) -> list[str]:
    return [f"## {title}", "", intro, "", *table(header, rows)]


def _columns(title: str, intro: str, columns: Sequence[Column], items: list[Any]) -> list[str]:
    rows = [tuple(get(item) for _, get in columns) for item in items]
    return _section(title, intro, [name for name, _ in columns], rows)


def _cpu(key: str) -> Column:
    return f"CPU {key}", lambda item: item["cpu_cores"].get(key)


def _late(key: str, name: str) -> Column:
    return name, lambda item: item["lateness"][f"{key}_ms"]


def _rate_columns(top: float | None, achieved: str) -> list[Column]:
    """A steady level's first columns: its target, what it achieved, and its lateness."""
    return [
        ("target fires/s", lambda lv: lv["rate"]),
        (achieved, lambda lv: lv["achieved_fires_per_s"]),
        ("÷ limit", lambda lv: ratio(lv["achieved_fires_per_s"], top)),
        _late("p50", "lateness p50 ms"),
        _late("p99", "p99 ms"),
        _late("max", "max ms"),
    ]


def _joined(values: Sequence[Any], digits: int = 1) -> str:
    return " / ".join(fmt(value, digits) for value in values)


def _limit_section(limit: Result, document: Result) -> list[str]:
    rows = [(lv["clients"], lv["tps"], lv["latency_avg_ms"]) for lv in limit["levels"]]
    return _section(
        "1. limit: the gate alone in pgbench",
        "`pg_try_advisory_lock` + ledger `INSERT ... ON CONFLICT DO NOTHING` + "
        f"`pg_advisory_unlock`, prepared, {limit['seconds']} s per run. The best figure "
        "is the ceiling every fire rate below is divided by.",
        ["clients", "gated fires/s (tps)", "avg latency ms"],
        rows,
    )


def _steady_section(steady: Result, document: Result) -> list[str]:
    columns = [
        *_rate_columns(ceiling(document), "achieved"),
        ("dup", lambda lv: lv["duplicates"]),
        ("miss", lambda lv: lv["misses"]),
        *map(_cpu, ("replicas", "postgres", "receiver", "box")),
        ("max RSS MiB", lambda lv: max(lv["replica_rss_mib"])),
        # None for results from before the harness measured it
        ("lock held after return p99 ms", lambda lv: _p99(lv, "lock_held_after_return")),
        ("same, first second p99 ms", lambda lv: _p99(lv, "lock_held_after_return_first_second")),
    ]
    return _columns(
        "2. steady: one-second jobs",
        f"Half 6-field cron `* * * * * *`, half 1 s intervals, `http` task to the receiver; "
        f"{steady['window_seconds']} s window after a warm-up. Lateness = receipt - nominal tick; "
        "a miss is a tick of the window not received within 20 s after the window closed "
        "(Tickgate itself records ticks later than the 60 s misfire grace as misfires). "
        "Lock held after return = a run's recorded end (written with its unlock) minus the "
        "receiver's answer, over every run since the replicas started, and over each "
        "replica's first second of runs.",
        columns,
        steady["levels"],
    )


def _p99(level: Result, key: str) -> Any:
    return (level.get(key) or {}).get("p99_ms")


def _steady_log_section(result: Result, document: Result) -> list[str]:
    columns = [
        *_rate_columns(ceiling(document), "succeeded/s"),
        ("missing", lambda lv: lv["missing"]),
        ("skipped", lambda lv: _counts(lv["skipped_by_reason"])),
        ("other", lambda lv: _counts(lv["other_by_status"])),
        ("clean", lambda lv: "yes" if lv["clean"] else "no"),
        *map(_cpu, ("replicas", "postgres", "box")),
        ("max RSS MiB", lambda lv: max(lv["replica_rss_mib"])),
    ]
    return _columns(
        "3. steady_log: one-second `log` jobs, judged from the ledger",
        f"As steady, with the `log` task (its message below the replicas' log level: the fire "
        f"path alone), {result['window_seconds']} s window. Lateness = `started_at - "
        f"scheduled_for`. Clean: {result['clean_rule']}. Highest clean rate: "
        f"**{fmt(result['highest_clean_rate'])}**.",
        columns,
        result["levels"],
    )


def _counts(by_name: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in by_name.items()) or "0"


def _drain_columns(drain: str, top: float | None, rate: str) -> list[Column]:
    """A crowd's drain: how long to the last start, to half and to 99 %, and its rate."""
    return [
        (drain, lambda size: fmt(size["drain_s"], 3)),
        ("half by s", lambda size: fmt(size["p50_s"], 3)),
        ("99 % by s", lambda size: fmt(size["p99_s"], 3)),
        ("fires/s", lambda size: size[rate]),
        ("÷ limit", lambda size: ratio(size[rate], top)),
    ]


def _burst_section(burst: Result, document: Result) -> list[str]:
    def log(size: Result) -> bool:
        return size.get("task") == "log"

    columns = [
        ("jobs at T0", lambda size: size["jobs"]),
        ("task (counted by)", lambda size: "`log` (ledger)" if log(size) else "`http` (receiver)"),
        *_drain_columns("drain s (last - T0)", ceiling(document), "drain_fires_per_s"),
        ("dup", lambda size: size["duplicates"]),
        ("miss", lambda size: size["missing"] if log(size) else size["misses"]),
        ("synced before T0", lambda size: "yes" if size["ready_before_t0"] else "NO"),
        ("replica ready s", lambda size: max(size["replica_ready_s"])),
    ]
    return _columns(
        "4. burst: every job due in one second",
        "`once` jobs at T0, loaded by each replica's first sync. `http`: times are receipts "
        "minus T0. `log`: times are the ledger's `started_at` minus T0; dup = jobs with more "
        "than one row, miss = jobs with no row (a row that is a skip is no start).",
        columns,
        [*burst["sizes"], *burst.get("log_sizes", [])],
    )


API_CONDITIONS = ("tickgate_idle", "tickgate_loaded", "baseline")


def _api_section(api: Result, document: Result) -> list[str]:
    cells = {(c["condition"], c["endpoint"], c["concurrency"]): c for c in api["cells"]}
    rows = []
    for endpoint, concurrency in dict.fromkeys(
        (c["endpoint"], c["concurrency"]) for c in api["cells"]
    ):
        row = [cells.get((condition, endpoint, concurrency)) for condition in API_CONDITIONS]
        rps = [cell["rps"] if cell else None for cell in row]
        rows.append([f"`{endpoint}`", concurrency, *map(_api_cell, row), ratio(rps[0], rps[2])])
    background = api.get("background_fires", {})
    header = ["endpoint", "conc.", "Tickgate idle", "Tickgate + fires", "bare baseline"]
    return [
        *_section(
            "5. api: REST under closed-loop load",
            f"Generator: {api['generator_version']}; {api['seconds']} s per run, connections "
            "round-robin over 3 processes. Cells: req/s (p50 / p99 ms). "
            f"`Tickgate + fires`: while {background.get('rate')} one-second jobs fire.",
            [*header, "idle ÷ baseline"],
            rows,
        ),
        f"Fires during the loaded runs: {background.get('achieved_fires_per_s')} /s achieved, "
        f"lateness p99 {background.get('lateness', {}).get('p99_ms')} ms, "
        f"{background.get('duplicates')} duplicates, {background.get('misses')} misses."
        + _top_concurrency_fires(background),
        "",
    ]


def _top_concurrency_fires(background: Result) -> str:
    """The ticks that fell while the generator ran at the highest concurrency."""
    top = background.get("at_top_concurrency")
    if not top:
        return ""
    return (
        f" Ticks while the generator ran at c{top['concurrency']} ({top['ticks_s']} s, every "
        f"endpoint): lateness p50 {top['lateness']['p50_ms']} ms, p99 "
        f"{top['lateness']['p99_ms']} ms, {top['misses']} misses of {top['expected']:,}."
    )


def _api_cell(cell: Result | None) -> str:
    if cell is None:
        return "-"
    errors = f", {cell['errors'] + cell['non_2xx']} err" if cell["errors"] + cell["non_2xx"] else ""
    return f"{fmt(cell['rps'])} ({fmt(cell['p50_ms'])} / {fmt(cell['p99_ms'])}){errors}"


def _scale_section(scale: Result, document: Result) -> list[str]:
    paging = scale["paging"]
    walk = paging["walk_limit_1000"]
    rows = [
        ("one replica alone: ready after start, s", fmt(scale["solo_ready_s"], 2)),
        ("one replica alone: peak RSS, MiB", fmt(scale["solo_rss_peak_mib"])),
        ("three together: ready after start, s", _joined(scale["replica_ready_s"], 2)),
        ("three together: peak RSS, MiB", _joined(scale["replica_rss_peak_mib"])),
        (
            f"walk all jobs, limit=1000 ({walk['pages']} pages)",
            f"{walk['total_s']} s; page p50 {walk['page']['p50_ms']} ms, "
            f"p99 {walk['page']['p99_ms']} ms",
        ),
        ("first page, limit=100: p50 / p99 ms", _pair(paging["first_page_limit_100"])),
        ("prefix page, limit=100: p50 / p99 ms", _pair(paging["prefix_page_limit_100"])),
    ]
    if "metrics_scrape" in paging:
        rows.append(("`GET /metrics` scrape: p50 / p99 ms", _pair(paging["metrics_scrape"])))
    return _section(
        f"7. scale: {scale['jobs']:,} jobs in the database",
        "Ready = first 200 of `GET /readyz` (the scheduler's first sync done), timed from "
        "process start; RSS is the peak from start to 5 s after ready.",
        ["measure", "value"],
        rows,
    )


def _pair(summary: Result) -> str:
    return f"{fmt(summary['p50_ms'])} / {fmt(summary['p99_ms'])}"


def _bulk_section(result: Result, document: Result) -> list[str]:
    rows = [
        (f"attempt {i + 1}", a["created_s"], a["unchanged_s"])
        for i, a in enumerate(result["attempts"])
    ]
    rows.append(("**median**", result["created_s"], result["unchanged_s"]))
    return _section(
        f"6. bulk: `PUT /v1/jobs` of {result['jobs']:,} jobs",
        "One replica, a fresh database each attempt; the set applied once (every job "
        "created), then again (every job unchanged). Seconds from sending to the answer.",
        ["", "created s", "unchanged s"],
        [tuple(fmt(v, 3) for v in r) for r in rows],
    )


def _retention_section(result: Result, document: Result) -> list[str]:
    rows = [
        ("ledger rows before the round", f"{result['rows_before']:,}"),
        ("rows deleted (newest kept per job)", f"{result['pruned']:,} ({result['keep_per_job']})"),
        ("one round, s", fmt(result["round_seconds"], 2)),
        ("**rows deleted per second**", f"{result['rows_per_second']:,}"),
    ]
    return _section(
        f"retention: one round over {result['jobs']:,} jobs",
        "One retention round (`Store.prune_runs`, as a replica's sweep runs it once per "
        "reconcile round), timed from outside. Retention keeps up with any steady fire "
        "rate below the rows-per-second figure (before: at most 10,000 rows per round, "
        "333 rows/s at the default 30 s round).",
        ["measure", "value"],
        rows,
    )


def _scale_out_section(result: Result, document: Result) -> list[str]:
    note = f" {result['fits_note']}." if result.get("fits_note") else ""
    section = _section(
        f"8. scale_out: {result['jobs']:,} jobs over {result['replicas']} owning replicas",
        "`TICKGATE_OWNERSHIP=on`; the replicas start together. Ready = first 200 of "
        "`GET /readyz` from process start; RSS is each process tree's peak from start to "
        "a few seconds after the last was ready, summed over its processes; PSS counts a "
        "page they share once (sampled each second). "
        f"{result['available_mib_at_start']:,} MiB were available at the start.{note}",
        ["", "ready after start s", "peak RSS MiB", "peak PSS MiB"],
        [
            (f"replica {i}", ready, rss, pss)
            for i, (ready, rss, pss) in enumerate(
                zip(
                    result.get("replica_ready_s", []),
                    result.get("rss_peak_mib_each", []),
                    result.get("pss_peak_mib_each")
                    or ["-"] * len(result.get("rss_peak_mib_each", [])),
                    strict=True,
                )
            )
        ],
    )
    if "did_not_fit" in result:  # no table: the line instead
        return [*section[:4], f"{result['jobs']:,} jobs did not fit: {result['did_not_fit']}.", ""]
    return section


def _rotated(drain: list[Column]) -> list[Column]:
    """The rate first: the replicas' table leads with fires/s."""
    return [*drain[3:], *drain[:3]]


def _replicas_section(result: Result, document: Result) -> list[str]:
    columns = [
        ("replicas", lambda step: step["replicas"]),
        *_rotated(_drain_columns("drain s", ceiling(document), "fires_per_s")),
        ("miss", lambda step: step["missing"]),
        _cpu("replicas"),
        ("CPU each", lambda step: _joined(step["cpu_cores_each"], 2)),
        *map(_cpu, ("postgres", "box")),
        ("peak RSS MiB each", lambda step: _joined(step["rss_peak_mib_each"])),
        ("runs each", lambda step: _joined(step["runs_each"])),
        ("views settled before T0", lambda step: "yes" if step["settled_before_t0"] else "NO"),
    ]
    return _columns(
        "9. replicas: saturated fires/s against the number of replicas",
        f"{result['jobs']:,} `log` jobs due at T0 on 1, 2 and 4 replicas with "
        "`TICKGATE_OWNERSHIP=on`; fires/s = jobs / drain time (last `started_at` - T0, from "
        "the ledger); CPU in cores over the drain; RSS from ready to drained. "
        f"Rises with every step: **{'yes' if result['rises_every_step'] else 'no'}**.",
        columns,
        result["steps"],
    )


def _peers_section(result: Result, document: Result) -> list[str]:
    steady, burst = scenario(document, "steady"), scenario(document, "burst")
    ours = steady["max_achieved_fires_per_s"] if steady else None
    levels = (steady or {}).get("levels", [])
    rows = [
        (
            "**Tickgate**",
            ours,
            ratio(ours, ceiling(document)),
            "1.00",
            _best_p99(steady),
            sum(level["duplicates"] for level in levels),
            sum(level["misses"] for level in levels),
            _largest_burst(burst),
            "",
        )
    ]
    rows += [
        _peer_row(name, peer, ours, ceiling(document))
        for name, peer in result.get("peers", {}).items()
    ]
    header = [
        "system", "max fires/s", "÷ limit", "Tickgate ÷ it", "p99 ms at that rate",
        "dup (all rates)", "miss (all rates)", "largest burst: drain s", "version / notes",
    ]  # fmt: skip
    return _section(
        "Peers: the alternatives on the same box",
        "Same receiver, same counting, 3 processes each (`bench/peers`); the same steady "
        "rates and crowd sizes up to 1,000/s and 10k (above every peer's saturation the "
        "larger ones only cost time). A peer's duplicates are reported, not judged.",
        header,
        rows,
    )


def _best_p99(steady: Result | None) -> Any:
    levels = (steady or {}).get("levels", [])
    best = max(levels, key=lambda level: level.get("achieved_fires_per_s") or 0, default=None)
    return best.get("lateness", {}).get("p99_ms") if best else None


def _largest_burst(burst: Result | None) -> str:
    sizes = (burst or {}).get("sizes", [])
    if not sizes:
        return "-"
    size = max(sizes, key=lambda s: s["jobs"])
    return f"{fmt(size.get('drain_s'), 2)} ({size['jobs']:,} jobs, {size.get('misses')} miss)"


def _peer_row(name: str, peer: Result, ours: float | None, top: float | None) -> tuple[Any, ...]:
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


def _tracing_section(result: Result, document: Result) -> list[str]:
    crowd, steady = result["crowd"], result["steady"]
    measures: list[tuple[str, Result, Callable[[Result], Any]]] = [
        ("crowd: **fires/s** (drain)", crowd, lambda m: m["drain_fires_per_s"]),
        ("crowd: drain s", crowd, lambda m: m["drain_s"]),
        ("crowd: 99 % started by, s", crowd, lambda m: m["p99_s"]),
        ("crowd: CPU of the replicas, cores", crowd, lambda m: m["cpu_cores"].get("replicas")),
        ("crowd: run traces received", crowd, lambda m: m["traces_received"]),
        ("steady: fires/s succeeded", steady, lambda m: m["achieved_fires_per_s"]),
        ("steady: lateness p99 ms", steady, lambda m: m["lateness_p99_ms"]),
        ("steady: CPU of the replicas, cores", steady, lambda m: m["cpu_cores"].get("replicas")),
        ("steady: run traces received", steady, lambda m: m["traces_received"]),
    ]
    rows = []
    for name, modes, get in measures:
        off, on = get(modes["off"]), get(modes["on"])
        rows.append((name, fmt(off, 2), fmt(on, 2), ratio(on, off)))
    return _section(
        f"tracing: off and on, side by side ({result['crowd_jobs']:,}-job crowd, "
        f"{result['steady_rate']:,} fires/s steady)",
        "The same `log` loads on three replicas, run with tracing off (the default) and "
        "then on, every span exported over OTLP/HTTP to a loopback collector "
        "(`bench/scenarios/tracing.py`). The crowd's drain is the fire path saturated; "
        f"the steady window ({result['steady_seconds']} s) shows the cost below it.",
        ["measure", "tracing off", "tracing on", "on ÷ off"],
        rows,
    )


# The scenarios' sections, in the report's order; a scenario that did not finish has none.
SECTIONS: dict[str, Callable[[Result, Result], list[str]]] = {
    "limit": _limit_section,
    "steady": _steady_section,
    "steady_log": _steady_log_section,
    "burst": _burst_section,
    "api": _api_section,
    "bulk": _bulk_section,
    "scale": _scale_section,
    "retention": _retention_section,
    "scale_out": _scale_out_section,
    "replicas": _replicas_section,
    "peers": _peers_section,
    "tracing": _tracing_section,
}


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
    results = {name: scenario(document, name) for name in SECTIONS}
    sections = [
        _header(document),
        targets_section(document),
        _targets_section(document),
        _profiling_section(),
        *(SECTIONS[name](result, document) for name, result in results.items() if result),
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
