"""This replica's wall clock, as its scheduler reads it.

In production the offset is zero. Tests inject one (`Faults.clock_offset`,
service/faults.py) to make one replica behave as if its clock ran ahead (positive) or
behind (negative): it then fires tick T when its own clock reads T, that is at true
time T - offset, and judges lateness by its own clock. The ledger and the lock must
still let each tick through once.

Decisions the whole cluster must agree on (orphans, overdue jobs, retention, whether a
job's window has closed, which missed tick to catch up) use the database's clock
instead: `Store.clock()` or `clock_timestamp()` in SQL.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class ReplicaClock:
    offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        """What this replica's clock reads now."""
        return datetime.now(UTC) + self.offset

    def local(self, true_time: datetime) -> datetime:
        """What this replica's clock reads at `true_time`."""
        return true_time + self.offset

    def true(self, local_time: datetime) -> datetime:
        """The true time at which this replica's clock reads `local_time`."""
        return local_time - self.offset
