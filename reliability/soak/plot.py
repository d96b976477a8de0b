"""The soak's plot (matplotlib, Agg), from the results document alone: RSS per replica,
ledger rows, fire lateness p50/p99 and `/metrics` scrape time against minutes into the
run, with the faults marked (kills, the PostgreSQL restart, the blackhole)."""

import sys
from pathlib import Path
from typing import Any

SLOT_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")
Axes = Any  # matplotlib is optional and untyped here


def _per_slot(axes: Axes, document: dict[str, Any], key: str, label: str) -> None:
    samples = document["samples"]
    for slot in document["slots"]:
        index = slot["slot"]
        for number, incarnation in enumerate(slot["incarnations"]):
            runner = incarnation["runner_id"]
            points = [
                (s["t"] / 60, s[key][index])
                for s in samples
                if s["runner"][index] == runner and s[key][index] is not None
            ]
            if points:
                proxied = " (proxied)" if slot["proxied"] else ""
                axes.plot(
                    *zip(*points, strict=True),
                    color=SLOT_COLORS[index % 4],
                    lw=1,
                    label=f"replica {index}{proxied}" if number == 0 else None,
                )
    axes.set_ylabel(label)
    axes.legend(fontsize=7, loc="upper left")


def _ledger(axes: Axes, document: dict[str, Any]) -> None:
    points = [
        (s["t"] / 60, s["ledger_rows"])
        for s in document["samples"]
        if s.get("ledger_rows") is not None
    ]
    if points:
        axes.plot(*zip(*points, strict=True), color="black", lw=1, label="ledger rows")
    axes.set_ylabel("ledger rows")
    axes.set_ylim(bottom=0)


def _lateness(axes: Axes, document: dict[str, Any]) -> None:
    for key, style in (("lateness_p50_ms", "-"), ("lateness_p99_ms", "--")):
        points = [
            (s["t"] / 60, max(s[key], 0.1)) for s in document["samples"] if s.get(key) is not None
        ]
        if points:
            axes.plot(
                *zip(*points, strict=True), style, color="tab:purple", lw=1, label=key.split("_")[1]
            )
    axes.set_yscale("log")
    axes.set_ylabel("lateness (ms, log)")
    axes.legend(fontsize=7, loc="upper left")


def _faults(axes: Axes, document: dict[str, Any]) -> None:
    began = document["meta"]["began"]
    events = document["events"]
    for event in events:
        at = (event["at"] - began) / 60
        if event["kind"] == "kill":
            axes.axvline(at, color="red", ls=":", lw=0.8)
        elif event["kind"] == "pg_stop":
            axes.axvline(at, color="purple", ls="-.", lw=0.8)
        elif event["kind"] == "churn_stopped":  # the run's end: the last windows settle
            axes.axvline(at, color="black", lw=0.8)
    holes = [(e["at"] - began) / 60 for e in events if e["kind"] in ("blackhole", "restore")]
    for start, end in zip(holes[::2], holes[1::2], strict=False):
        axes.axvspan(start, end, color="gray", alpha=0.2)


def draw(document: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[soak] matplotlib missing: no plot (pip install '.[bench]')", file=sys.stderr)
        return None
    figure, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    _per_slot(axes[0], document, "rss_mib", "RSS per replica (MiB)")
    _ledger(axes[1], document)
    _lateness(axes[2], document)
    _per_slot(axes[3], document, "scrape_ms", "/metrics scrape (ms, log)")
    axes[3].set_yscale("log")
    for each in axes:
        _faults(each, document)
        each.grid(True, alpha=0.3)
    axes[-1].set_xlabel(
        "minutes into the run (dotted: kill -9, dash-dot: PostgreSQL "
        "restart, gray: blackholed link, black: end of the run)"
    )
    meta = document["meta"]
    axes[0].set_title(
        f"Soak: {meta['jobs']:,} jobs, 3 replicas, {meta['minutes']:g} min, "
        f"{meta['churn_per_s']:g} API changes/s"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
