"""Statistics of the benchmark figures: percentiles, latency summaries, CDF curves."""

from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50 / p99 / max in milliseconds."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    ordered = sorted(seconds)
    return {
        "p50_ms": ms(percentile(ordered, 50)),
        "p99_ms": ms(percentile(ordered, 99)),
        "max_ms": ms(ordered[-1] if ordered else None),
    }


def quantile_curve(values: Sequence[float], points: int = 201) -> list[float]:
    """`points` evenly spaced quantiles (0..100 %) of `values`: enough to redraw a CDF."""
    ordered = sorted(values)
    if not ordered:
        return []
    return [round(percentile(ordered, 100 * i / (points - 1)) or 0.0, 6) for i in range(points)]


def median_of(values: Iterable[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    middle = len(present) // 2
    if len(present) % 2:
        return present[middle]
    return (present[middle - 1] + present[middle]) / 2
