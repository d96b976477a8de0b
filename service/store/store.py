"""The store on the API pool, one class per concern, each with its statements named in
one module:

- `jobs` (`jobs_sql`): the job definitions, created, read, listed, changed, deleted;
- `ledger` (`runs_sql`, `fire_sql`): the runs, as the API reads them and as the fire path
  records what it records over this pool;
- `cursors` (`cursor_sql`): the tick cursors' audit, the window's reads;
- `chores` (`chores_sql`, `members_sql`): the cluster-wide rounds (the overdue and
  next-tick books, retention) and the members' list;
- `outbox` (`hooks_sql`): the hook deliveries, taken and settled by senders.

Every method returns frozen domain objects. The fire path's claims and ends go over the
lock sessions (`sessions`), not through here.
"""

from service.store.chores import ChoreStore
from service.store.cursors import CursorStore
from service.store.jobs import JobStore
from service.store.ledger import LedgerStore
from service.store.outbox import OutboxStore


class Store(JobStore, LedgerStore, CursorStore, ChoreStore, OutboxStore):
    """Owns the API pool and every statement run on it (see `base.StoreBase`)."""
