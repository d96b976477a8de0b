"""Results: the JSON document, the Markdown report (BENCHMARKS.md) and the PNG plots.

Every figure in the Markdown comes from the JSON, so `python -m bench.report FILE.json`
redraws the report and the plots of an earlier run.
"""

import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

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


# ---------------------------------------------------------------------------- helpers


def _scenario(document: dict[str, Any], name: str) -> dict[str, Any] | None:
    result = document["scenarios"].get(name)
    return result if result and result.get("status") == "ok" else None


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _ratio(value: float | None, ceiling: float | None) -> str:
    if not value or not ceiling:
        return "-"
    return f"{value / ceiling:.2f}"


def ceiling(document: dict[str, Any]) -> float | None:
    limit = _scenario(document, "limit")
    return limit["ceiling_fires_per_s"] if limit else None


def _mark(met: bool | None) -> str:
    return {True: "✅ met", False: "❌ not met", None: "n/a"}[met]


# ---------------------------------------------------------------------------- targets


def _sustained(document: dict[str, Any]) -> tuple[str, bool | None]:
    steady = _scenario(document, "steady")
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
    burst = _scenario(document, "burst")
    sizes = {size["jobs"]: size for size in burst["sizes"]} if burst else {}
    size = sizes.get(TARGET_BURST_JOBS)
    if size is None:
        return "no 10k burst in this run", None
    complete = size["misses"] == 0 and size["duplicates"] == 0
    text = f"drain {size['drain_s']} s, {size['delivered']:,} delivered, {size['misses']} missed"
    return text, complete and (size["drain_s"] or 1e9) < TARGET_BURST_S


def _peer_best(document: dict[str, Any]) -> tuple[str, float] | None:
    peers = _scenario(document, "peers")
    best = None
    for name, peer in (peers or {}).get("peers", {}).items():
        value = (peer.get("steady") or {}).get("max_achieved_fires_per_s")
        if value and (best is None or value > best[1]):
            best = (name, float(value))
    return best


def _peer_target(document: dict[str, Any]) -> tuple[str, bool | None]:
    steady = _scenario(document, "steady")
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
    api = _scenario(document, "api")
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
    scale = _scenario(document, "scale")
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
    smoke = bool(document["meta"].get("smoke"))
    rows = []
    for title, check in checks:
        text, met = check(document)
        rows.append(
            (title, text + (" (smoke: not judged)" if smoke else ""), None if smoke else met)
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
        "everything else default (4 lock sessions, 5000 runs in flight, API pool 10). "
        "All on the same 2-core box as "
        "PostgreSQL, the receiver and the load generator: CPU columns are in cores (1.0 = one "
        "core busy); `box` is the whole machine, anything else running included.",
        f"- **Load generator (api):** {meta.get('load_generator')}.",
        f"- **Repeats:** {_repeats(meta['sizes']['repeats'])}",
        "- **Deliveries** are counted by a loopback HTTP receiver from its own records "
        "(job, scheduled tick, arrival), not from Tickgate's ledger.",
        "",
    ]


def _repeats(count: int) -> str:
    if count <= 1:
        return "every figure is a single run."
    return (
        f"limit and api figures are the median of {count} runs; steady, burst and scale "
        "run once per size (they are long)."
    )


def _targets_section(document: dict[str, Any]) -> list[str]:
    rows = [(title, text, _mark(met)) for title, text, met in targets(document)]
    return ["## Targets", "", *_table(["target (this 2-core box)", "measured", ""], rows)]


def _limit_section(document: dict[str, Any]) -> list[str]:
    limit = _scenario(document, "limit")
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
        *_table(["clients", "gated fires/s (tps)", "avg latency ms"], rows),
    ]


def _steady_section(document: dict[str, Any]) -> list[str]:
    steady = _scenario(document, "steady")
    if not steady:
        return []
    top = ceiling(document)
    rows = [
        (
            lv["rate"],
            lv["achieved_fires_per_s"],
            _ratio(lv["achieved_fires_per_s"], top),
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
        *_table(header, rows),
    ]


def _held(level: dict[str, Any], key: str) -> float | None:
    """A p99 the harness measured, or None for results from before it did."""
    summary = level.get(key) or {}
    value: float | None = summary.get("p99_ms")
    return value


def _burst_section(document: dict[str, Any]) -> list[str]:
    burst = _scenario(document, "burst")
    if not burst:
        return []
    top = ceiling(document)
    rows = [
        (
            size["jobs"],
            size["drain_s"],
            size["p50_s"],
            size["p99_s"],
            size["drain_fires_per_s"],
            _ratio(size["drain_fires_per_s"], top),
            size["duplicates"],
            size["misses"],
            "yes" if size["ready_before_t0"] else "NO",
            max(size["replica_ready_s"]),
        )
        for size in burst["sizes"]
    ]
    header = [
        "jobs at T0", "drain s (last - T0)", "half by s", "99 % by s", "fires/s",
        "÷ limit", "dup", "miss", "synced before T0", "replica ready s",
    ]  # fmt: skip
    return [
        "## 3. burst: every job due in one second",
        "",
        "`once` jobs at T0, loaded by each replica's first sync; times are receipts minus T0.",
        "",
        *_table(header, rows),
    ]


def _api_section(document: dict[str, Any]) -> list[str]:
    api = _scenario(document, "api")
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
        row.append(_ratio(idle["rps"] if idle else None, base["rps"] if base else None))
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
        "## 4. api: REST under closed-loop load",
        "",
        f"Generator: {api['generator_version']}; {api['seconds']} s per run, connections "
        "round-robin over 3 processes. Cells: req/s (p50 / p99 ms). "
        f"`Tickgate + fires`: while {background.get('rate')} one-second jobs fire.",
        "",
        *_table(header, rows),
        f"Fires during the loaded runs: {background.get('achieved_fires_per_s')} /s achieved, "
        f"lateness p99 {background.get('lateness', {}).get('p99_ms')} ms, "
        f"{background.get('duplicates')} duplicates, {background.get('misses')} misses.",
        "",
    ]


def _api_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    errors = f", {cell['errors'] + cell['non_2xx']} err" if cell["errors"] + cell["non_2xx"] else ""
    return f"{_fmt(cell['rps'])} ({_fmt(cell['p50_ms'])} / {_fmt(cell['p99_ms'])}){errors}"


def _scale_section(document: dict[str, Any]) -> list[str]:
    scale = _scenario(document, "scale")
    if not scale:
        return []
    walk = scale["paging"]["walk_limit_1000"]
    together_ready = " / ".join(_fmt(x, 2) for x in scale["replica_ready_s"])
    together_rss = " / ".join(_fmt(x) for x in scale["replica_rss_peak_mib"])
    page = walk["page"]
    rows = [
        ("one replica alone: ready after start, s", _fmt(scale["solo_ready_s"], 2)),
        ("one replica alone: peak RSS, MiB", _fmt(scale["solo_rss_peak_mib"])),
        ("three together: ready after start, s", together_ready),
        ("three together: peak RSS, MiB", together_rss),
        (
            f"walk all jobs, limit=1000 ({walk['pages']} pages)",
            f"{walk['total_s']} s; page p50 {page['p50_ms']} ms, p99 {page['p99_ms']} ms",
        ),
        ("first page, limit=100: p50 / p99 ms", _pair(scale["paging"]["first_page_limit_100"])),
        ("prefix page, limit=100: p50 / p99 ms", _pair(scale["paging"]["prefix_page_limit_100"])),
    ]
    return [
        f"## 5. scale: {scale['jobs']:,} jobs in the database",
        "",
        "Ready = first 200 of `GET /readyz` (the scheduler's first sync done), timed from "
        "process start; RSS is the peak from start to 5 s after ready.",
        "",
        *_table(["measure", "value"], rows),
    ]


def _pair(summary: dict[str, Any]) -> str:
    return f"{_fmt(summary['p50_ms'])} / {_fmt(summary['p99_ms'])}"


def _peers_section(document: dict[str, Any]) -> list[str]:
    result = document["scenarios"].get("peers")
    if not result or result.get("status") != "ok":
        return []
    top = ceiling(document)
    steady, burst = _scenario(document, "steady"), _scenario(document, "burst")
    ours = steady["max_achieved_fires_per_s"] if steady else None
    rows = [
        (
            "**Tickgate**",
            ours,
            _ratio(ours, top),
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
        "Same receiver, same counting, same rates and burst sizes, 3 processes each "
        "(`bench/peers`). A peer's duplicates are reported, not judged.",
        "",
        *_table(header, rows),
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
    return f"{_fmt(size.get('drain_s'), 2)} ({size['jobs']:,} jobs, {size.get('misses')} miss)"


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
        _ratio(best, top),
        _ratio(ours, best),
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
        _targets_section(document),
        _profiling_section(),
        _limit_section(document),
        _steady_section(document),
        _burst_section(document),
        _api_section(document),
        _scale_section(document),
        _peers_section(document),
        _problems_section(document),
        ["## Plots", "", *(f"![{Path(p).stem}]({p})" for p in plots), ""] if plots else [],
    ]
    return "\n".join(line for section in sections for line in section)


# ---------------------------------------------------------------------------- plots


def _cdf_series(document: dict[str, Any]) -> Iterator[tuple[str, list[float]]]:
    steady = _scenario(document, "steady")
    for level in (steady or {}).get("levels", []):
        yield f"Tickgate {level['rate']}/s", level.get("lateness_cdf_s", [])
    peers = _scenario(document, "peers")
    for name, peer in (peers or {}).get("peers", {}).items():
        for level in (peer.get("steady") or {}).get("levels", []):
            if level.get("lateness_cdf_s"):
                yield f"{name} {level['rate']}/s", level["lateness_cdf_s"]


def _drain_series(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(label, burst size result, line style): Tickgate solid, peers dashed."""
    burst = _scenario(document, "burst")
    for size in (burst or {}).get("sizes", []):
        if size.get("drain_curve_s"):
            yield f"Tickgate {size['jobs']:,} jobs", size, "-"
    peers = _scenario(document, "peers")
    for name, peer in (peers or {}).get("peers", {}).items():
        for size in (peer.get("burst") or {}).get("sizes", []):
            if size.get("drain_curve_s"):
                yield f"{name} {size['jobs']:,} jobs", size, "--"


def draw_plots(document: dict[str, Any], out: Path, stem: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib missing: no plots (pip install '.[bench]')", file=sys.stderr)
        return []
    written = []
    series = [(label, curve) for label, curve in _cdf_series(document) if curve]
    if series:
        path = out / f"{stem}-lateness-cdf.png"
        figure, axes = plt.subplots(figsize=(8, 5))
        for label, curve in series:
            fractions = [i / (len(curve) - 1) for i in range(len(curve))]
            axes.plot([max(v * 1000, 0.1) for v in curve], fractions, label=label)
        axes.set_xscale("log")
        axes.set_xlabel("lateness: receipt - nominal tick (ms, log)")
        axes.set_ylabel("fraction of fires")
        axes.set_title("Steady one-second jobs: lateness CDF")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    curves = list(_drain_series(document))
    if curves:
        path = out / f"{stem}-burst-drain.png"
        figure, axes = plt.subplots(figsize=(8, 5))
        for label, size, style in curves:
            curve = size["drain_curve_s"]
            share = size["delivered"] / size["jobs"]
            fractions = [share * i / (len(curve) - 1) for i in range(len(curve))]
            axes.plot([0.0, *curve], [0.0, *fractions], style, label=label)
        axes.set_xlabel("seconds after T0")
        axes.set_ylabel("fraction of jobs started (received)")
        axes.set_title("Burst: every job due at T0, drain curves")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


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
