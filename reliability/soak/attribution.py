"""Which fault each of the soak's skips fell in: its windows' skips by reason, per fault.

A skip is the policy doing its job (an `overlap` skip while a run of the job may still be
in progress) or a detection that is slower than it needs to be (a run whose replica is
gone, still counted as in progress). Which of the two shows in *where* the skips fall:
a quiet window's overlap skips are the policy's (a run outlasting its period); a burst
in the seconds after a kill, a blackholed link or the PostgreSQL restart is the fault's
detection. Each window is charged to every fault span it overlaps (a fault's span runs
from its start until its replica or the cluster is ready again, plus `AFTERMATH_SECONDS`
for the skips that lag it); the CPU spells of the box (`box_cpu_percent` at or above
`SATURATED_PERCENT` in consecutive samples) count as a fault too. A window that overlaps
none is `quiet`.

Each window's overlap skips are also told apart by the run they were behind when their
claim found the job busy (`windows._OVERLAP_BEHIND`): `overlap: run in progress` (a run
that ended well, or runs still: the policy), `overlap: run ending` (its end written, not
yet committed), `overlap: run gone` (an `abandoned` or fenced run whose session a fault
had already taken: its lock or row outlived it, detection delay) and `overlap: no run`
(none found: pruned, or the run's job changed).
"""

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

AFTERMATH_SECONDS = 30.0
SATURATED_PERCENT = 95.0
QUIET = "quiet"

# A fault's start event, the events that end it, and whether the end names the same slot.
_SPANS = {
    "kill": (("ready",), True),
    "pg_stop": (("cluster_ready", "cluster_not_ready_after_120s"), False),
    "blackhole": (("restore",), True),
}


@dataclass(frozen=True)
class Span:
    fault: str
    start: float
    end: float


def fault_spans(document: dict[str, Any]) -> list[Span]:
    """The spans of the faults the soak injected, and of the box's CPU spells."""
    return [*_injected(document["events"]), *_saturated(document.get("samples") or [])]


def _injected(events: Sequence[dict[str, Any]]) -> Iterator[Span]:
    for index, event in enumerate(events):
        if event["kind"] not in _SPANS:
            continue
        ends, same_slot = _SPANS[event["kind"]]
        end = next(
            (
                later["at"]
                for later in events[index + 1 :]
                if later["kind"] in ends
                and (not same_slot or later.get("slot") == event.get("slot"))
            ),
            event["at"],
        )
        name = "pg_restart" if event["kind"] == "pg_stop" else event["kind"]
        yield Span(name, event["at"], end + AFTERMATH_SECONDS)


def _saturated(samples: Sequence[dict[str, Any]]) -> Iterator[Span]:
    """Runs of two or more consecutive samples with the box's CPU saturated."""
    run: list[float] = []
    for sample in [*samples, {"at": float("inf"), "box_cpu_percent": 0.0}]:
        if (sample.get("box_cpu_percent") or 0.0) >= SATURATED_PERCENT:
            run.append(sample["at"])
            continue
        if len(run) >= 2:
            yield Span("cpu_saturated", run[0], run[-1] + AFTERMATH_SECONDS)
        run = []


def skips_by_fault(document: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each fault's skips by reason (a window in two faults' spans counts in both), with
    the windows in no fault's span as `quiet`."""
    spans = fault_spans(document)
    charged: dict[str, Counter[str]] = {}
    for window in document["windows"]:
        faults = {s.fault for s in spans if s.start < window["end"] and s.end > window["start"]}
        behind = {f"overlap: {k}": n for k, n in window.get("overlap_behind", {}).items()}
        for fault in faults or {QUIET}:
            charged.setdefault(fault, Counter()).update(window["skip_reasons"] | behind)
    return {fault: dict(reasons) for fault, reasons in sorted(charged.items())}
