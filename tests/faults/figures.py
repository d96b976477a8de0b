"""Each fault test records what it injected and what it saw, for RELIABILITY.md.

Records are JSON lines appended to the file named by `TICKGATE_RELIABILITY_LOG`; with it
unset nothing is written. `tests/faults/report.py` renders the file.
"""

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LOG_ENV = "TICKGATE_RELIABILITY_LOG"


@dataclass
class FaultFigures:
    """One fault test's figures.

    `ticks_expected`: (job, tick) pairs the test required to run; `duplicates`: extra
    deliveries of any tick, anywhere in the test (so 0 means no tick ran twice);
    `misses`: expected ticks that never arrived; `misses_allowed`: how many of those the
    requirement tolerates (ticks the faulty replica had claimed when it was hit, and
    ticks the ledger records as skipped by the `skip` overlap policy); `unaccounted`:
    expected ticks with no ledger row at all (a tick lost in silence; never allowed).
    """

    test: str
    title: str
    fault: str
    faults_injected: int
    ticks_expected: int = 0
    duplicates: int = 0
    misses: int = 0
    misses_allowed: int = 0
    unaccounted: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)


def record(figures: FaultFigures) -> None:
    """Append `figures` to the reliability log, if one is configured."""
    target = os.environ.get(LOG_ENV)
    if not target:
        return
    entry = asdict(figures)
    started = entry.pop("started")
    entry = {"kind": "fault", **entry, "seconds": round(time.monotonic() - started, 1)}
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as log:
        log.write(json.dumps(entry, sort_keys=True) + "\n")
