"""The statements a backfill runs before its claims: splitting the runs of missed ticks
it reaches into (see `service.domain.gaps`), so every tick keeps exactly one outcome."""

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple
from uuid import UUID, uuid4

from service.domain.gaps import GapSplit
from service.store.columns import Column, Columns, Params

# The rows of the job (the first argument) from the backfill's first tick to its last
# (the second and third), and the first row after its last: the misfire rows whose runs
# of missed ticks the backfill may reach into, and the rows that bound those runs. A
# manual or chained run is no tick's outcome. One range of the (job, scheduled_for)
# index, and one probe.
GAP_ROWS = """(SELECT scheduled_for, missed_ticks FROM tickgate_runs
        WHERE job = $1 AND scheduled_for BETWEEN $2 AND $3
          AND trigger NOT IN ('manual', 'chain'))
    UNION ALL
    (SELECT scheduled_for, missed_ticks FROM tickgate_runs
        WHERE job = $1 AND scheduled_for > $3 AND trigger NOT IN ('manual', 'chain')
        ORDER BY scheduled_for LIMIT 1)"""


class GapPart(NamedTuple):
    """One part of a split run of missed ticks: its row's id, its last tick, how many
    ticks it counts, the run it belongs to (`gap`: that run's row's tick), its note."""

    id: UUID
    tick: datetime
    missed: int
    gap: datetime
    note: str


# A split run: its row's tick (`tick`), what it counts (`was`), what it keeps.
GAP_COLUMNS: Columns[GapSplit] = Columns(
    Column("tick", "timestamptz", lambda s: s.gap),
    Column("was", "int", lambda s: s.was),
    Column("keeps", "int", lambda s: s.keeps),
)
PART_COLUMNS: Columns[GapPart] = Columns(
    Column("id", "uuid", lambda p: p.id),
    Column("tick", "timestamptz", lambda p: p.tick),
    Column("missed", "int", lambda p: p.missed),
    Column("gap", "timestamptz", lambda p: p.gap),
    Column("note", "text", lambda p: p.note),
)

# Split runs of missed ticks of the job: each misfire row (of `gaps`) that still counts
# what it `was` (compare-and-set: of two backfills splitting at once, one does, the
# other reads again) counts what it `keeps` now (NULL for its own alone), and the
# `parts` become misfire rows like it, written only where their run's row was changed.
# They add no hook delivery: the misfire was announced once, by the row at the run's
# end, which keeps its deliveries. Answers how many runs were split; fewer than asked
# means another statement changed one meanwhile.
_splitting = Params()
SPLIT_GAPS = _splitting.statement(f"""WITH gaps AS (
        SELECT * FROM {_splitting.rows("gaps", GAP_COLUMNS).unnest("g")}
    ), shrunk AS (
        UPDATE tickgate_runs r SET missed_ticks = NULLIF(g.keeps, 1)
        FROM gaps g
        WHERE r.job = {_splitting("job")} AND r.scheduled_for = g.tick
          AND r.status = 'skipped' AND r.missed_ticks = g.was
        RETURNING r.*
    ), parts AS (
        SELECT * FROM {_splitting.rows("parts", PART_COLUMNS).unnest("p")}
    ), written AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, skip_reason, error,
            missed_ticks, started_at, finished_at, duration_ms, attempts, runner, job_version,
            lock_key, locked, backend_pid, backend_start)
        SELECT p.id, s.job, p.tick, s.trigger, 'skipped', s.skip_reason, p.note,
            NULLIF(p.missed, 1), s.started_at, s.finished_at, 0, 0, s.runner, s.job_version,
            s.lock_key, false, s.backend_pid, s.backend_start
        FROM parts p JOIN shrunk s ON s.scheduled_for = p.gap
        ORDER BY p.tick
        ON CONFLICT (job, scheduled_for) DO NOTHING
    )
    SELECT count(*) FROM shrunk""")


def split_arguments(job: str, splits: Sequence[GapSplit]) -> tuple[object, ...]:
    parts = [
        GapPart(uuid4(), tick, count, split.gap, _note(split.gap, tick, count))
        for split in splits
        for tick, count in split.parts
    ]
    return SPLIT_GAPS.arguments(job=job, gaps=splits, parts=parts)


def _note(gap: datetime, tick: datetime, count: int) -> str:
    ticks = "the tick" if count == 1 else f"{count} ticks up to"
    return (
        f"not started within its misfire grace: {ticks} {tick.isoformat()}, counted apart"
        f" from the misfire at {gap.isoformat()} once a backfill reached into its run"
    )
