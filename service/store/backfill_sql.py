"""The statements a backfill runs before its claims: splitting the runs of missed ticks
it reaches into (see `service.domain.gaps`), so every tick keeps exactly one outcome."""

from collections.abc import Sequence
from datetime import datetime
from uuid import uuid4

from service.domain.gaps import GapSplit

# The rows of job $1 from tick $2 to tick $3 (the backfill's first and last), and the
# first row after $3: the misfire rows whose runs of missed ticks the backfill may
# reach into, and the rows that bound those runs. A manual or chained run is no tick's
# outcome. One range of the (job, scheduled_for) index, and one probe.
GAP_ROWS = """(SELECT scheduled_for, missed_ticks FROM tickgate_runs
        WHERE job = $1 AND scheduled_for BETWEEN $2 AND $3
          AND trigger NOT IN ('manual', 'chain'))
    UNION ALL
    (SELECT scheduled_for, missed_ticks FROM tickgate_runs
        WHERE job = $1 AND scheduled_for > $3 AND trigger NOT IN ('manual', 'chain')
        ORDER BY scheduled_for LIMIT 1)"""

# Split runs of missed ticks of job $1: each misfire row at $2 that still counts $3
# ticks (compare-and-set: of two backfills splitting at once, one does, the other reads
# again) counts $4 now (NULL for its own alone), and the parts ($5 ids, $6 ticks, $7
# counts, $8 the run each belongs to, $9 notes) become misfire rows like it, written
# only where their run's row was changed. They add no hook delivery: the misfire was announced
# once, by the row at the run's end, which keeps its deliveries. Answers how many runs
# were split; fewer than asked means another statement changed one meanwhile.
SPLIT_GAPS = """WITH gaps AS (
        SELECT * FROM unnest($2::timestamptz[], $3::int[], $4::int[]) AS g (tick, was, keeps)
    ), shrunk AS (
        UPDATE tickgate_runs r SET missed_ticks = NULLIF(g.keeps, 1)
        FROM gaps g
        WHERE r.job = $1 AND r.scheduled_for = g.tick AND r.status = 'skipped'
          AND r.missed_ticks = g.was
        RETURNING r.*
    ), parts AS (
        SELECT * FROM unnest($5::uuid[], $6::timestamptz[], $7::int[], $8::timestamptz[],
                             $9::text[])
            AS p (id, tick, missed, gap, note)
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
    SELECT count(*) FROM shrunk"""


def split_arguments(job: str, splits: Sequence[GapSplit]) -> tuple[object, ...]:
    parts = [(split.gap, tick, count) for split in splits for tick, count in split.parts]
    return (
        job,
        [split.gap for split in splits],
        [split.was for split in splits],
        [split.keeps for split in splits],
        [uuid4() for _ in parts],
        [tick for _, tick, _ in parts],
        [count for _, _, count in parts],
        [gap for gap, _, _ in parts],
        [_note(gap, tick, count) for gap, tick, count in parts],
    )


def _note(gap: datetime, tick: datetime, count: int) -> str:
    ticks = "the tick" if count == 1 else f"{count} ticks up to"
    return (
        f"not started within its misfire grace: {ticks} {tick.isoformat()}, counted apart"
        f" from the misfire at {gap.isoformat()} once a backfill reached into its run"
    )
