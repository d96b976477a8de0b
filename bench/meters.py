"""CPU and memory meters of process groups over a window (replicas, PostgreSQL, peers)."""

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from bench.context import Context
from harness.replicas import Replica, process_tree, tree_pss_bytes, tree_rss_bytes


def _cpu_seconds(process: psutil.Process, *, with_reaped_children: bool) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    total = times.user + times.system
    if with_reaped_children:
        total += times.children_user + times.children_system
    return float(total)


def group_cpu_seconds(processes: Iterable[psutil.Process], *, root_pid: int | None = None) -> float:
    """CPU seconds (user + system) of `processes`; the root also counts its reaped children
    (a PostgreSQL backend that exited during the window keeps counting)."""
    return sum(_cpu_seconds(p, with_reaped_children=p.pid == root_pid) for p in processes)


def box_busy_seconds() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


@dataclass
class CpuMeter:
    """CPU of named process groups over a window, in cores (1.0 = one core busy).

    `groups` maps a name to a callable listing that group's processes *now* (PostgreSQL
    backends come and go), and the group's root pid, whose reaped children count too.
    The `box` group is the whole machine, other people's work included.
    """

    groups: Mapping[str, tuple[Callable[[], list[psutil.Process]], int | None]]
    _start: dict[str, float] = field(default_factory=dict)
    _began: float = 0.0

    def _read(self) -> dict[str, float]:
        values = {
            name: group_cpu_seconds(processes(), root_pid=root)
            for name, (processes, root) in self.groups.items()
        }
        return values | {"box": box_busy_seconds()}

    def start(self) -> None:
        self._began = time.monotonic()
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._began, 1e-9)
        end = self._read()
        return {name: round((end[name] - self._start[name]) / elapsed, 3) for name in end}


class RssSampler:
    """Peak RSS of some process trees, sampled every `interval` s on a background thread
    (start-up and sync included, not only the moment someone looks), and their peak PSS
    (`tree_pss_bytes`) every `PSS_EVERY`th sample, as it costs more to read."""

    PSS_EVERY = 5

    def __init__(self, pids: Sequence[int], interval: float = 0.2) -> None:
        self._pids = list(pids)
        self._interval = interval
        self.peaks = [0] * len(self._pids)
        self.pss_peaks = [0] * len(self._pids)
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        pss = self._samples % self.PSS_EVERY == 0
        self._samples += 1
        for index, pid in enumerate(self._pids):
            self.peaks[index] = max(self.peaks[index], tree_rss_bytes(pid))
            if pss:
                self.pss_peaks[index] = max(self.pss_peaks[index], tree_pss_bytes(pid))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> "RssSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def peaks_mib(self) -> list[float]:
        return [round(peak / 2**20, 1) for peak in self.peaks]

    def pss_peaks_mib(self) -> list[float]:
        return [round(peak / 2**20, 1) for peak in self.pss_peaks]


def processes_of(pids: Iterable[int]) -> Callable[[], list[psutil.Process]]:
    """Each pid's process tree, listed anew at each reading (children count too)."""

    def listing() -> list[psutil.Process]:
        return [process for pid in pids for process in process_tree(pid)]

    return listing


def replica_meter(ctx: Context, replicas: Sequence[Replica]) -> CpuMeter:
    """As `standard_meter`, plus each replica on its own (`r0`, `r1`, ...)."""
    meter = standard_meter(ctx, replicas)
    each = {f"r{i}": (processes_of([r.pid]), None) for i, r in enumerate(replicas)}
    return CpuMeter({**meter.groups, **each})


def standard_meter(
    ctx: Context, replicas: Sequence[Replica], extra: Mapping[str, int] | None = None
) -> CpuMeter:
    """Replicas (summed), PostgreSQL (postmaster + backends), and any `extra` pids."""
    groups: dict[str, tuple[Callable[[], list[psutil.Process]], int | None]] = {
        "replicas": (processes_of([r.pid for r in replicas]), None),
    }
    if ctx.postgres.pid is not None:
        groups["postgres"] = (ctx.postgres.processes, ctx.postgres.pid)
    for name, pid in (extra or {}).items():
        groups[name] = (processes_of([pid]), None)
    return CpuMeter(groups)
