"""The PNG plots of a results document (matplotlib, Agg), each from the JSON alone:

- `<stem>-lateness-cdf.png`: lateness CDF of the steady `http` rates (and the peers');
- `<stem>-lateness-vs-rate.png`: p50 and p99 lateness against the steady rate, `http`
  (receipts) and `log` (ledger), the peers' p99 beside them;
- `<stem>-burst-drain.png`: the crowd start curves, share of a crowd started against
  seconds after T0 (`http` crowds by receipt, `log` crowds from the ledger, the peers');
- `<stem>-replica-scaling.png`: saturated fires/s and CPU against the number of replicas.
"""

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.reading import scenario

PEER_COLORS = ("tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:gray")
Figure = Any  # matplotlib's Figure and Axes: matplotlib is optional and untyped here
Axes = Any


def _cdf_series(document: dict[str, Any]) -> Iterator[tuple[str, list[float]]]:
    steady = scenario(document, "steady")
    for level in (steady or {}).get("levels", []):
        yield f"Tickgate {level['rate']}/s", level.get("lateness_cdf_s", [])
    peers = scenario(document, "peers")
    for name, peer in (peers or {}).get("peers", {}).items():
        for level in (peer.get("steady") or {}).get("levels", []):
            if level.get("lateness_cdf_s"):
                yield f"{name} {level['rate']}/s", level["lateness_cdf_s"]


def _drain_series(document: dict[str, Any]) -> Iterator[tuple[str, list[float], float, str]]:
    """(label, drain curve, share of the crowd started, line style): Tickgate `http`
    solid, Tickgate `log` dash-dotted, peers dashed."""
    burst = scenario(document, "burst") or {}
    for size in burst.get("sizes", []):
        yield f"Tickgate {size['jobs']:,} http", size.get("drain_curve_s", []), _share(size), "-"
    for size in burst.get("log_sizes", []):
        started = size["started"] / size["jobs"]
        yield f"Tickgate {size['jobs']:,} log (ledger)", size["drain_curve_s"], started, "-."
    peers = scenario(document, "peers")
    for name, peer in (peers or {}).get("peers", {}).items():
        for size in (peer.get("burst") or {}).get("sizes", []):
            if size.get("drain_curve_s"):
                yield f"{name} {size['jobs']:,}", size["drain_curve_s"], _share(size), "--"


def _share(size: dict[str, Any]) -> float:
    delivered = float(size.get("delivered") or 0)
    return delivered / float(size["jobs"])


def _draw_cdf(axes: Axes, document: dict[str, Any]) -> bool:
    series = [(label, curve) for label, curve in _cdf_series(document) if curve]
    for label, curve in series:
        fractions = [i / (len(curve) - 1) for i in range(len(curve))]
        axes.plot([max(v * 1000, 0.1) for v in curve], fractions, label=label)
    axes.set_xscale("log")
    axes.set_xlabel("lateness: receipt - nominal tick (ms, log)")
    axes.set_ylabel("fraction of fires")
    axes.set_title("Steady one-second jobs: lateness CDF")
    axes.grid(True, which="both", alpha=0.3)
    return bool(series)


def _draw_drain(axes: Axes, document: dict[str, Any]) -> bool:
    curves = [entry for entry in _drain_series(document) if entry[1]]
    for label, curve, share, style in curves:
        fractions = [share * i / (len(curve) - 1) for i in range(len(curve))]
        axes.plot([0.0, *curve], [0.0, *fractions], style, label=label)
    axes.set_xlabel("seconds after T0")
    axes.set_ylabel("fraction of the crowd started")
    axes.set_title("Crowds: every job due at T0, start curves")
    axes.grid(True, alpha=0.3)
    return bool(curves)


def _lateness_points(levels: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [
        (level["rate"], level["lateness"][key])
        for level in levels
        if (level.get("lateness") or {}).get(key) is not None
    ]
    return [rate for rate, _ in points], [max(ms, 0.1) for _, ms in points]


def _draw_lateness_vs_rate(axes: Axes, document: dict[str, Any]) -> bool:
    asked: set[int] = set()
    for name, label, color in (("steady", "http", "tab:blue"), ("steady_log", "log", "tab:green")):
        levels = (scenario(document, name) or {}).get("levels", [])
        for key, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
            rates, values = _lateness_points(levels, key)
            if rates:
                axes.plot(rates, values, style, color=color, label=f"Tickgate {label} {key[:3]}")
                asked.update(rates)
    peers = (scenario(document, "peers") or {}).get("peers", {})
    for (name, peer), color in zip(peers.items(), PEER_COLORS, strict=False):
        rates, values = _lateness_points((peer.get("steady") or {}).get("levels", []), "p99_ms")
        if rates:
            axes.plot(rates, values, ":", marker=".", color=color, label=f"{name} p99")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(sorted(asked), [f"{rate:,}" for rate in sorted(asked)])
    axes.set_xticks([], minor=True)
    axes.set_xlabel("steady rate asked (fires/s, log)")
    axes.set_ylabel("lateness (ms, log)")
    axes.set_title("Lateness against rate (http: receipt - tick; log: started_at - tick)")
    axes.grid(True, which="both", alpha=0.3)
    return bool(asked)


def _draw_scaling(axes: Axes, document: dict[str, Any]) -> bool:
    steps = (scenario(document, "replicas") or {}).get("steps", [])
    if not steps:
        return False
    counts = [step["replicas"] for step in steps]
    axes.plot(counts, [step["fires_per_s"] or 0 for step in steps], "o-", label="fires/s")
    axes.set_xlabel("replicas (TICKGATE_OWNERSHIP=on)")
    axes.set_ylabel("saturated fires/s (jobs / drain time)")
    axes.set_xticks(counts)
    axes.set_ylim(bottom=0)
    cpu = axes.twinx()
    for key, style in (("replicas", "s--"), ("postgres", "^--"), ("box", "x:")):
        cpu.plot(counts, [step["cpu_cores"].get(key) or 0 for step in steps], style, label=key)
    for step in steps:
        each = [value or 0 for value in step["cpu_cores_each"]]
        cpu.plot([step["replicas"]] * len(each), each, "k.", alpha=0.6)
    cpu.set_ylabel("CPU cores over the drain (dots: each replica)")
    cpu.set_ylim(bottom=0)
    cpu.legend(fontsize=8, loc="lower right")
    axes.set_title(f"Replica scaling: {steps[0]['jobs']:,} `log` jobs at T0")
    axes.grid(True, alpha=0.3)
    return True


PLOTS: dict[str, Callable[[Axes, dict[str, Any]], bool]] = {
    "lateness-cdf": _draw_cdf,
    "lateness-vs-rate": _draw_lateness_vs_rate,
    "burst-drain": _draw_drain,
    "replica-scaling": _draw_scaling,
}


def draw_plots(document: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """Every plot the document has data for, as `<out>/<stem>-<name>.png`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib missing: no plots (pip install '.[bench]')", file=sys.stderr)
        return []
    written = []
    for name, draw in PLOTS.items():
        figure, axes = plt.subplots(figsize=(8, 5))
        if draw(axes, document):
            axes.legend(fontsize=8, loc="best")
            figure.tight_layout()
            path = out / f"{stem}-{name}.png"
            figure.savefig(path, dpi=110)
            written.append(path)
        plt.close(figure)
    return written
