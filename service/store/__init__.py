"""Everything that talks SQL."""

from service.store.store import (
    JobChange,
    JobFilter,
    JobsApplied,
    Labels,
    Prune,
    RunFilter,
    RunPosition,
    ShownJob,
    Store,
    TickPosition,
)

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
