"""Tickgate as a library: its gate for code that schedules by itself.

- `tickgate.gate.locked_run`: run a coroutine function under a job's advisory lock, on one
  connection of your asyncpg pool, at most one holder at a time across processes (a Go
  replica that derives its key from the same name included).
- `tickgate.apscheduler.GatedExecutor`: an APScheduler 3 executor under which each
  (job id, scheduled run time) runs once across every process that schedules the job
  (`pip install tickgate[apscheduler]`).

See docs/apscheduler.md. Nothing else here is public.
"""

from tickgate.gate import lock_key, locked_run

__all__ = ["lock_key", "locked_run"]
