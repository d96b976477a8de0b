"""The soak's section of RELIABILITY.md, between `<!-- soak:begin -->` and
`<!-- soak:end -->`, rendered from a results document (`python -m reliability.soak --report
FILE`). The rest of the file is the fault tests' (`tests/faults/report.py`, which keeps
this section when it rewrites the file)."""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.reading import fmt, table
from reliability.soak.verdicts import SCRAPE_BETWEEN_BOUND_MS

BEGIN = "<!-- soak:begin -->"
END = "<!-- soak:end -->"


def _yes(ok: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "not judged (run too short)"}[ok]


def _each(entries: dict[str, Any], key: str, unit: str) -> str:
    parts = []
    for runner, entry in entries.items():
        if entry.get("judged"):
            parts.append(
                f"{runner} {fmt(entry['first'])} → {fmt(entry['last'])}{unit} "
                f"({entry['growth_pct']:+.1f} %)"
            )
        else:
            parts.append(f"{runner} not judged (lived {entry['lived_s']} s)")
    return "; ".join(parts) or "-"


def _sizes(entries: dict[str, Any]) -> str:
    parts = [
        f"{runner} {fmt(int(e['bytes_first']))} → {fmt(int(e['bytes_last']))} B"
        for runner, e in entries.items()
        if e.get("judged") and "bytes_first" in e
    ]
    return "; ".join(parts) or "-"


def _accounted_text(accounted: dict[str, Any]) -> str:
    statuses = ", ".join(f"{k} {fmt(v)}" for k, v in sorted(accounted["statuses"].items()))
    reasons = ", ".join(f"{k} {fmt(v)}" for k, v in sorted(accounted["skip_reasons"].items()))
    rows = sum(accounted["statuses"].values())
    return (
        f"{fmt(rows)} rows for {fmt(accounted['expected_ticks'])} ticks in "
        f"{accounted['windows']} windows ({statuses}; skips: {reasons or 'none'}); "
        f"no row {fmt(accounted['unaccounted'])}; summed up by a gap row: "
        f"{fmt(accounted['gap_covered_near_restart'])} near the restart, "
        f"{fmt(accounted['gap_covered_elsewhere'])} elsewhere, "
        f"{fmt(accounted.get('double_counted', 0))} with a row of their own too; "
        "rows off the schedule "
        f"{fmt(accounted['unexpected_rows'])}"
    )


def _skips_table(accounted: dict[str, Any]) -> list[str]:
    """The skips by reason in each fault's windows (reliability/soak/attribution.py)."""
    charged = accounted.get("skips_by_fault") or {}
    reasons = sorted({reason for counts in charged.values() for reason in counts})
    if not reasons:
        return []
    rows = [(fault, *(counts.get(r, 0) for r in reasons)) for fault, counts in charged.items()]
    intro = (
        "Skips by the fault whose span (until ready again, plus 30 s) their window "
        "overlaps; `quiet`: in no fault's span; the `overlap:` columns split the overlap "
        "skips by the run each was behind when its claim found the job busy: in progress "
        "(the policy's), ending (its end not yet committed), gone (abandoned or fenced, "
        "its session taken by a fault before that moment: detection delay), or none found "
        "(`reliability/soak/attribution.py`):"
    )
    return [intro, "", *table(("fault", *reasons), rows)]


def _between(incarnations: dict[str, Any]) -> str:
    """Each incarnation's median scrape between crowds (verdicts.scrape_between)."""
    shown = [f"{runner} {entry['median']:,.1f} ms" for runner, entry in incarnations.items()]
    return "; ".join(shown) or "not sampled"


def _http_text(http: dict[str, int]) -> str:
    names = (
        "expected",
        "delivered",
        "succeeded_not_delivered",
        "delivered_but_skipped",
        "delivered_without_row",
        "unexpected_deliveries",
    )
    return ", ".join(f"{name.replace('_', ' ')} {fmt(http.get(name, 0))}" for name in names)


def _rows(document: dict[str, Any]) -> list[Sequence[Any]]:
    v = document["verdicts"]
    dup, acc, led = v["duplicates"], v["accounted"], v["ledger"]
    between = v.get("scrape_between", {}).get("incarnations", {})
    ledger_text = (
        f"{fmt(led['first'])} at the start, max {fmt(led['max'])}, {fmt(led['last'])} at the end"
    )
    if led.get("judged"):
        ledger_text += (
            f"; from minute {led['plateau_from_t'] / 60:.0f}: median "
            f"{fmt(led['plateau_median'])}, last band max {fmt(led['last_band_max'])}"
            f" ({led['growth_pct']:+.1f} %)"
        )
    return [
        (
            "duplicate runs (ledger: rows per (job, tick))",
            "0",
            f"{dup['ledger_duplicates_in_windows']} in windows, "
            f"{dup['ledger_duplicates_whole_table']} in the whole table",
            _yes(dup["ok"]),
        ),
        (
            "duplicate deliveries (receiver), unexplained by the ledger",
            "0",
            f"{dup['receiver_duplicates_unexplained']} (of {dup['receiver_duplicates']})",
            _yes(dup["ok"]),
        ),
        (
            "every tick of an unchanged job has one ledger row",
            "0 without",
            _accounted_text(acc),
            _yes(acc["ok"]),
        ),
        (
            "receiver against ledger (`http` jobs)",
            "0 disagreements",
            _http_text(acc["http"]),
            _yes(acc["ok"]),
        ),
        (
            "RSS per replica, warm-up to end",
            "< 10 % growth",
            _each(v["rss"]["incarnations"], "rss_mib", " MiB"),
            _yes(v["rss"]["ok"]),
        ),
        ("ledger rows", "plateau (< 10 % growth)", ledger_text, _yes(led["ok"])),
        (
            "`/metrics` scrape time, warm-up to end",
            "≤ 1.5 x + 5 ms",
            _each(v["scrape"]["incarnations"], "scrape_ms", " ms"),
            _yes(v["scrape"]["ok"]),
        ),
        (
            "`/metrics` scrape between two crowds of ticks (half a second past the second)",
            f"median < {SCRAPE_BETWEEN_BOUND_MS:g} ms",
            _between(between),
            _yes(v["scrape_between"]["ok"]) if between else "not judged (not sampled)",
        ),
        ("`/metrics` size (not judged)", "-", _sizes(v["scrape"]["incarnations"]), "-"),
    ]


def _events(document: dict[str, Any]) -> str:
    shown = {
        "kill",
        "restart",
        "ready",
        "pg_stop",
        "pg_start",
        "cluster_ready",
        "blackhole",
        "restore",
    }
    parts = []
    for event in document["events"]:
        if event["kind"] in shown:
            who = f" {event['runner']}" if "runner" in event else ""
            parts.append(f"{event['t'] / 60:.1f} min {event['kind'].replace('_', ' ')}{who}")
    return "; ".join(parts)


def render(document: dict[str, Any], plot: Path | None, markdown: Path) -> str:
    meta, v = document["meta"], document["verdicts"]
    late = v["lateness"]
    churn = document["churn"]
    lines = [
        BEGIN,
        "## Soak run (issue #13, months unattended)",
        "",
        f"`make soak` (`python -m reliability.soak --minutes {meta['minutes']:g}`) on "
        f"{meta['date']}, commit `{meta['git_commit']}`: {meta['minutes']:g} minutes, 3 "
        f"`tickgate serve` replicas (one through a loopback TCP proxy), {fmt(meta['jobs'])} "
        f"jobs (every-second and every-5 s intervals, 5 s and 10 s crons; half `log`, half "
        f"`http` to a loopback receiver; {fmt(meta['nominal_fires_per_s'])} fires/s "
        f"nominal), {fmt(meta['churn_per_s'])} API changes/s (create, `PATCH` schedule or "
        f"args, delete in turn; {fmt(sum(churn['asked'].values()))} in all), "
        f"`{meta['replica_env_text']}`. Faults: {_events(document)}. Results: "
        f"`{meta['results']}`; the checks are explained in `reliability/soak/verdicts.py`.",
        "",
        *table(("check", "bound", "measured", "within bound"), _rows(document)),
        *_skips_table(v["accounted"]),
        f"Fire lateness (`started_at - scheduled_for`, ticks 10-20 s old at each 10 s "
        f"sample): median of the samples' p50 {fmt(late['median_p50_ms'])} ms and p99 "
        f"{fmt(late['median_p99_ms'])} ms, worst p99 {fmt(late['worst_p99_ms'])} ms at "
        f"minute {fmt((late['worst_p99_at_t'] or 0) / 60)}; "
        f"{fmt(late['median_runs_per_s'])} runs/s (median). Box: 2 cores, shared with other "
        f"work (median CPU {fmt(meta.get('median_box_cpu_percent'))} %).",
        "",
        f"**Verdict: {'all within bounds' if v['ok'] else 'failed: ' + ', '.join(v['failed'])}.**",
        "",
    ]
    if plot is not None:
        lines += [f"![soak]({os.path.relpath(plot, markdown.parent)})", ""]
    notes = document.get("notes") or []
    lines += [f"- {note}" for note in notes] + ([""] if notes else [])
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(markdown: Path, section: str) -> None:
    """Replace the soak section of `markdown` (or append it)."""
    text = markdown.read_text(encoding="utf-8") if markdown.exists() else "# Reliability\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    markdown.write_text(text, encoding="utf-8")
