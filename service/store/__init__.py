"""Everything that talks SQL."""

from service.store.store import JobChange, JobFilter, RunPosition, Store

__all__ = ["JobChange", "JobFilter", "RunPosition", "Store"]
