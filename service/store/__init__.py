"""Everything that talks SQL."""

from service.store.jobs import (
    JobChange,
    JobFilter,
    JobsApplied,
    Labels,
    Prune,
    ShownJob,
    TickPosition,
)
from service.store.runs_sql import RunFilter, RunPosition
from service.store.store import Store
from service.store.values import CancelAnswer, KeptRun

__all__ = [
    "CancelAnswer",
    "JobChange",
    "JobFilter",
    "JobsApplied",
    "KeptRun",
    "Labels",
    "Prune",
    "RunFilter",
    "RunPosition",
    "ShownJob",
    "Store",
    "TickPosition",
]
