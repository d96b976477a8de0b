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

__all__ = [
    "JobChange",
    "JobFilter",
    "JobsApplied",
    "Labels",
    "Prune",
    "RunFilter",
    "RunPosition",
    "ShownJob",
    "Store",
    "TickPosition",
]
