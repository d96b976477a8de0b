"""Everything that talks SQL."""

from service.store.store import JobChange, JobFilter, Store

__all__ = ["JobChange", "JobFilter", "Store"]
