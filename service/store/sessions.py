"""The lock pool: a handful of long-lived pinned connections, and the statements run on
them.

An advisory lock belongs to the session that took it, so a tick's lock, ledger claim,
result and unlock all go over the same connection. Each connection is a session that
holds the locks of many runs at once: ticks due together are claimed in one statement,
their runs stay bound to the session that holds their locks, and their ends are
recorded, and their locks released, in batches on it. A session that dies takes its
locks with it (its runs are fenced) and is replaced by a new one.

A session whose link goes silent must die too, on both ends (see `link`): every
statement on it has a deadline, past which the connection is dropped; a quiet session
heartbeats, so a silent link is noticed while runs hold locks on it and no statement
flows; and PostgreSQL ends a session quiet for the link timeout, freeing its locks. The
server bounds each statement (`statement_timeout`, `lock_timeout`) well inside the
client's deadline: a claim it ends that way changed nothing, and gives back the locks
it took (session locks outlive the statement) rather than dropping the session.
"""

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Self, TypeVar
from uuid import UUID

import asyncpg

from service.domain.runs import Run
from service.store import fire_sql, session_sql
from service.store.base import init_connection
from service.store.coalesce import Coalescer
from service.store.connection import Connection
from service.store.errors import is_unavailable, timed_out
from service.store.link import Link, deadline, heartbeat
from service.store.moves import claimed_ticks
from service.store.ports import (
    BackendId,
    Claim,
    ClaimOutcome,
    GateFacts,
    Orphan,
    RunEnd,
    TickClaim,
    check_orphans,
)
from service.store.rows import job_from_row, run_from_row
from service.store.turns import Turns

__all__ = [
    "Claim",
    "ClaimOutcome",
    "LockSession",
    "LockSessions",
    "RunEnd",
    "TickClaim",
]


# How long the first end of several runs sharing a session waits for the others.
FINISH_LINGER_SECONDS = 0.005
# Opening a session (connect and warm up) gives up after this long; a failed attempt
# waits this long before the next, so a database that is away is not hammered.
CONNECT_SECONDS = 5.0
RECONNECT_BACKOFF_SECONDS = 0.5
CLOSE_SECONDS = 5.0

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class _Ending:
    run_id: UUID
    end: RunEnd
    release_lock: int | None


class LockSession:
    """One pinned connection of the lock pool; the runs it claimed share it."""

    def __init__(self, connection: Connection, link: Link, backend: BackendId) -> None:
        self._connection = connection
        self._link = link
        self.backend = backend
        self.pid: int = backend.pid
        self._terminated = False
        self._answered_at = time.monotonic()
        self._beating = False
        # A connection runs one statement at a time; claims and ends take turns (ends,
        # which release locks, before waiting claims), and ends that queue up meanwhile
        # are recorded together by whoever goes next.
        self._turns = Turns()
        self._endings = Coalescer(self._record_endings, self._finish_linger)
        self._open_runs = 0  # claimed here and not yet recorded
        # The lock keys this session holds, as its statements said. Claims never take a
        # lock twice (see `claim`), so each is held once. A release is noted once its
        # statement answered: until then the key still reads as held, which can only
        # make a claim ask again, never let one through.
        self._held: set[int] = set()
        self._heartbeat = asyncio.create_task(heartbeat(link, self, f"lock session {self.pid}"))

    @classmethod
    async def open(cls, dsn: str, link: Link) -> Self:
        """Connect, bound the session (`Link.tune`) and warm it up, within
        CONNECT_SECONDS; then it heartbeats until it closes."""
        connection = await asyncpg.connect(dsn, timeout=CONNECT_SECONDS)
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                await link.tune(connection, quiet_ends=True, fire_path=True)
                backend = await _warmed(connection)
        except BaseException:
            connection.terminate()
            raise
        return cls(connection, link, backend)

    @property
    def holds_locks(self) -> bool:
        return bool(self._held)

    @property
    def closed(self) -> bool:
        """The session is gone: the server or the network closed it, or we did. Every
        advisory lock it held is gone with it."""
        return self._terminated or self._connection.is_closed()

    @contextmanager
    def fenced(self, on_lost: Callable[[], None]) -> Iterator[None]:
        """Call `on_lost` if the connection closes while the block runs (a database
        restart, a cut link): the session died, and the job's lock with it, so another
        replica may now start the job's next tick.

        asyncpg calls termination listeners soon after it sees the connection close,
        idle or not.
        """

        def lost(_connection: object) -> None:
            self._held.clear()
            on_lost()

        if self.closed:
            lost(None)  # it died before the fence went up
        else:
            self._connection.add_termination_listener(lost)
        try:
            yield
        finally:
            if not self.closed:
                self._connection.remove_termination_listener(lost)

    async def claim(self, ticks: Sequence[TickClaim]) -> list[Claim]:
        """Pass ticks, each of a different job, through the gate in one statement (see
        `fire_sql.claim_statement`); one Claim per tick, in order. A claim that counts
        against `max_runs` goes alone.

        The lock is `pg_try_advisory_lock`, which never waits. A session's locks are
        re-entrant, so a tick whose lock this session holds already (for another run
        of its job) is not let through: the statement is told which keys it holds, and
        answers as if another session held that one. Only claimed ticks leave their
        lock held. A session lock outlives a failed statement: one the server ended at
        its statement or lock timeout, or refused with an error of its own, gives back
        the locks it took, and the error goes to the caller; only a statement whose fate
        is unknown (the link broke) closes the connection (and with it the locks of
        every run on it, which are fenced).
        """
        if len({tick.job.name for tick in ticks}) != len(ticks):
            raise ValueError("a claim takes at most one tick per job")
        counted = any(tick.counted for tick in ticks)
        if counted and len(ticks) > 1:
            raise ValueError("a claim that counts runs goes alone")
        statement = (fire_sql.CLAIM_COUNTED if counted else fire_sql.CLAIM).text
        async with self._turns.turn():
            # The keys held are read, and the ones taken noted, within the turn: no
            # other statement on the session comes in between.
            arguments = fire_sql.claim_arguments(claimed_ticks(ticks), self._held)
            taking = {tick.job.lock_key for tick in ticks if tick.lock} - self._held
            rows = await self._claiming(taking, statement, arguments)
            claims = [_claim_of(row, tick) for row, tick in zip(rows, ticks, strict=True)]
            for claim, tick in zip(claims, ticks, strict=True):
                self._took(claim, tick.job.lock_key)
            return claims

    async def _claiming(
        self, taking: set[int], statement: str, arguments: Sequence[object]
    ) -> list[Any]:
        # Only a statement that was sent may have taken locks (of `taking`): waiting
        # for the turn and giving up leaves the session, and the runs on it, as they were.
        # One the server refused (its timeout, or an error of the statement's own) wrote
        # nothing and left the session as it was, but for the locks it took: those are
        # given back, and the runs on the session live on. Only a session whose state
        # is unknown (the link broke, the wait was cancelled) is dropped.
        try:
            return list(await self._answer(self._connection.fetch(statement, *arguments)))
        except BaseException as error:
            if taking and not (_refused(error) and await self._gave_back(taking)):
                self.terminate()
            raise

    async def _gave_back(self, taking: set[int]) -> bool:
        """After a claim the server refused (it wrote nothing, yet the locks it took
        live on), release those it took: the ones of `taking` this session holds now
        (it held none of them before). False if that failed too."""
        try:
            await self._answer(self._connection.execute(fire_sql.UNLOCK_HELD, list(taking)))
        except Exception as error:  # noqa: BLE001 - logged; the session is dropped instead
            log.warning("lock session %d: locks of a refused claim kept (%r)", self.pid, error)
            return False
        except asyncio.CancelledError:
            self.terminate()
            raise
        return True

    async def _answer(self, statement: Awaitable[T]) -> T:
        """Await one statement of this session within the link's `statement_seconds`;
        past it the session is dropped."""
        with deadline(self._link.statement_seconds, self.terminate, "lock session statement"):
            answer = await statement
        self._answered_at = time.monotonic()
        return answer

    # --- the heartbeat (`link.Pulse`) ---

    def quiet_seconds(self) -> float:
        return time.monotonic() - self._answered_at

    async def beat(self) -> None:
        # A statement holding the turn has its own deadline: no need to queue behind it.
        if self._turns.busy:
            return
        async with self._turns.turn():
            self._beating = True  # the heartbeat's deadline may drop the session now
            try:
                await self._connection.fetchval(session_sql.PING)
            finally:
                self._beating = False
        self._answered_at = time.monotonic()

    def drop(self) -> None:
        self.terminate()

    def _took(self, claim: Claim, key: int) -> None:
        if claim.run is not None:
            self._open_runs += 1
        if claim.holds_lock:
            self._held.add(key)

    async def finish(
        self, run_id: UUID, outcome: RunEnd, release_lock: int | None
    ) -> tuple[Run | None, bool]:
        """Record how the run ended and then, in the same turn, release the job's lock
        if `release_lock` names it. Returns the run and whether the lock was released.
        Ends that runs sharing this session queue meanwhile go in the same statements."""
        return await self._endings.submit(_Ending(run_id, outcome, release_lock))

    def _finish_linger(self) -> float:
        """A lone run's end is written at once. Runs of one crowd, sharing the session,
        end within moments of each other: waiting FINISH_LINGER_SECONDS for them writes
        their ends in one statement (one commit for all), and keeps each lock no more
        than that past its run's end, far below a tick."""
        return FINISH_LINGER_SECONDS if self._open_runs > 1 else 0.0

    async def _record_endings(self, endings: Sequence[_Ending]) -> list[tuple[Run | None, bool]]:
        """Record the ends in one statement, then release their locks; per end, the run
        and whether its lock was released. If the database refuses the statement for
        what one end holds, each end is recorded alone, so no run is left `running` by
        another's bytes; the locks stay held meanwhile, and no other run is touched."""
        self._open_runs -= len(endings)
        try:
            ended = await self._finishing(endings)
        except (asyncpg.PostgresError, asyncpg.DataError) as error:
            if is_unavailable(error):
                raise
            log.warning(
                "%d run ends refused together (%r); recording each alone", len(endings), error
            )
            ended = [each for ending in endings for each in await self._finishing_alone(ending)]
        return self._finished(ended, endings)

    async def _finishing(self, endings: Sequence[_Ending]) -> list[tuple[Any, bool]]:
        """Per end, its row as FINISH answered it and whether its lock was released. The
        locks go in a statement of their own, once FINISH succeeded, in the same turn (no
        claim comes in between): a refused FINISH wrote nothing, and a lock released in
        it would not come back, whatever failed after. Nothing is released then."""
        async with self._turns.turn(urgent=True):
            finishing = self._connection.fetch(fire_sql.FINISH.text, *_finish_arguments(endings))
            rows = list(await self._answer(finishing))
            released = await self._unlocking([ending.release_lock for ending in endings])
        return list(zip(rows, released, strict=True))

    async def _unlocking(self, keys: list[int | None]) -> list[bool]:
        """Release each key given once (None: nothing to release); whether each was
        held. If that fails the session is dropped, and the locks with it."""
        if all(key is None for key in keys):
            return [False] * len(keys)
        try:
            unlocking = fire_sql.UNLOCK_ENDED
            rows = await self._answer(
                self._connection.fetch(unlocking.text, *unlocking.arguments(keys=keys))
            )
        except Exception as error:  # noqa: BLE001 - logged; the session is dropped instead
            log.warning("lock session %d: locks of ended runs kept (%r)", self.pid, error)
            self.terminate()
            return [key is not None for key in keys]  # released: the session is gone
        except asyncio.CancelledError:
            self.terminate()
            raise
        return [bool(row["released"]) for row in rows]

    async def _finishing_alone(self, ending: _Ending) -> list[tuple[Any, bool]]:
        """One end; if the database refuses even that, the run is recorded with the
        refusal as its error and no result."""
        try:
            return await self._finishing([ending])
        except (asyncpg.PostgresError, asyncpg.DataError) as error:
            if is_unavailable(error):
                raise
            why = f"the run's result or error could not be stored: {type(error).__name__}"
            bare = RunEnd(ending.end.status, why, None, ending.end.attempts)
            return await self._finishing([_Ending(ending.run_id, bare, ending.release_lock)])

    def _finished(
        self, ended: Sequence[tuple[Any, bool]], endings: Sequence[_Ending]
    ) -> list[tuple[Run | None, bool]]:
        results = []
        for (row, released), ending in zip(ended, endings, strict=True):
            if released and ending.release_lock is not None:
                self._held.discard(ending.release_lock)
            results.append((run_from_row(row) if row["id"] is not None else None, released))
        return results

    async def resume(self, orphans: Sequence[Orphan], runner: str) -> list[Claim]:
        """Take over the orphans' runs, their locks first, in one statement (see
        `fire_sql.RESUME`). A lock this session holds already is another run of the job
        here: LOCKED, as a claim would answer (the session's locks are re-entrant; the
        gate is not)."""
        check_orphans(orphans)
        async with self._turns.turn():
            asking = [o for o in orphans if not (o.locked and o.lock_key in self._held)]
            taking = {o.lock_key for o in asking if o.locked}
            arguments = fire_sql.RESUME.arguments(orphans=asking, runner=runner)
            resuming = fire_sql.RESUME.text
            rows = await self._claiming(taking, resuming, arguments) if asking else []
            answers = dict(zip((o.run.id for o in asking), rows, strict=True))
            return [self._resumed(answers.get(o.run.id), o.lock_key) for o in orphans]

    def _resumed(self, row: Mapping[str, Any] | None, key: int) -> Claim:
        if row is None:  # this session holds the job's lock for another run
            return Claim(ClaimOutcome.LOCKED)
        if row["id"] is None:
            return Claim(ClaimOutcome.ALREADY_RAN if row["got"] else ClaimOutcome.LOCKED)
        claim = Claim(ClaimOutcome.CLAIMED, run_from_row(row), bool(row["holds_lock"]))
        self._took(claim, key)
        return claim

    async def unlock(self, key: int) -> bool:
        """True once this session no longer holds `key`; False if it never did."""
        async with self._turns.turn(urgent=True):
            released = await self._answer(self._connection.fetchval(fire_sql.UNLOCK, key))
        if released:
            self._held.discard(key)
        return bool(released)

    def terminate(self) -> None:
        """Close the connection hard: its session, and any lock it holds, dies with it.
        Safe on a connection that is already gone."""
        self._held.clear()
        self._terminated = True
        self._connection.terminate()
        if not self._beating:  # a beat in flight fails at once, and ends the heartbeat
            self._heartbeat.cancel()

    async def close(self) -> None:
        """Close the connection politely (its locks go with the session); hard if the
        server does not answer in time."""
        self._terminated = True
        self._heartbeat.cancel()
        await asyncio.gather(self._heartbeat, return_exceptions=True)
        try:
            await self._connection.close(timeout=CLOSE_SECONDS)
        except Exception as error:  # noqa: BLE001 - logged; the connection is cut instead
            log.warning("lock session %d did not close (%r); cutting it", self.pid, error)
            self._connection.terminate()


def _refused(error: BaseException) -> bool:
    """The server answered the statement with an error: it ended at its timeout, or
    was refused for what it did (a constraint, a bug). It wrote nothing and the
    session is in a known state; a broken link or a cancelled wait is neither."""
    server_said = isinstance(error, asyncpg.PostgresError) and not is_unavailable(error)
    return timed_out(error) or server_said


def _claim_of(row: Mapping[str, Any], tick: TickClaim) -> Claim:
    facts = GateFacts(
        got=bool(row["got"]),
        job_exists=bool(row["job_exists"]),
        same_incarnation=bool(row["same_incarnation"]),
        same_revision=bool(row["same_revision"]),
        capped=bool(row["capped"]),
        inactive=bool(row["inactive"]),
        ticked=bool(row["ticked"]),
        busy=bool(row["busy"]),
        released=bool(row["released"]),
        contended=bool(row["contended"]),
        seen_at=row["seen_at"],
        run=run_from_row(row) if row["id"] else None,
        stored_job=job_from_row({"job": row["stored_job"]}) if row["stored_job"] else None,
    )
    return facts.claim(tick)


def _finish_arguments(endings: Sequence[_Ending]) -> tuple[object, ...]:
    return fire_sql.finish_arguments([(ending.run_id, ending.end) for ending in endings])


class LockSessions:
    """The lock pool: `size` long-lived sessions, each holding the locks of many runs.
    A session opens when first needed (or all at once, `fill`); one that closed is
    replaced at the next `session` call, while its runs, fenced, end elsewhere."""

    def __init__(self, dsn: str, size: int, link: Link | None = None) -> None:
        self._dsn = dsn
        self._link = link or Link()
        self._slots: list[LockSession | None] = [None] * size
        self._opening: dict[int, asyncio.Task[None]] = {}
        # Blocks holding each session now: the least held one takes the next block.
        self._holders: Counter[LockSession] = Counter()

    @classmethod
    async def open(cls, dsn: str, size: int, link: Link | None = None) -> Self:
        pool = cls(dsn, size, link)
        await pool.fill()
        return pool

    @property
    def size(self) -> int:
        return len(self._slots)

    async def fill(self) -> None:
        """Open every session that is not open now (a replica that will fire ticks,
        at startup); ConnectionError if one cannot be opened."""
        self._replace_closed()
        await asyncio.gather(*self._opening.values())
        if any(session is None or session.closed for session in self._slots):
            raise ConnectionError("lock sessions could not be opened (see the log)")

    async def close(self) -> None:
        """Close every session; their locks are released with them. Called once runs
        have ended."""
        opening, self._opening = list(self._opening.values()), {}
        for attempt in opening:
            attempt.cancel()
        await asyncio.gather(*opening, return_exceptions=True)
        await asyncio.gather(*(session.close() for session in self._slots if session))
        self._slots = [None] * self.size

    @asynccontextmanager
    async def session(self, wait_seconds: float) -> AsyncIterator[LockSession]:
        """The open session fewest blocks hold, shared with them for this block (see
        `ports.LockPool.session`)."""
        session = await self._least_held(wait_seconds)
        self._holders[session] += 1
        try:
            yield session
        finally:
            self._holders[session] -= 1
            if not self._holders[session]:
                del self._holders[session]
                _left(session)

    async def _least_held(self, wait_seconds: float) -> LockSession:
        async with asyncio.timeout(wait_seconds):
            while True:
                self._replace_closed()
                open_ones = [s for s in self._slots if s is not None and not s.closed]
                if open_ones:
                    return min(open_ones, key=lambda session: self._holders[session])
                await asyncio.wait(self._opening.values(), return_when=asyncio.FIRST_COMPLETED)

    def _replace_closed(self) -> None:
        """Start opening a new session in every slot whose session closed (one attempt
        at a time per slot)."""
        for index, session in enumerate(self._slots):
            if (session is None or session.closed) and index not in self._opening:
                self._opening[index] = asyncio.create_task(self._reopen(index))

    async def _reopen(self, index: int) -> None:
        try:
            self._slots[index] = await LockSession.open(self._dsn, self._link)
        except Exception as error:  # noqa: BLE001 - logged; the slot is tried again later
            log.warning("lock session could not be opened (%r)", error)
            await asyncio.sleep(RECONNECT_BACKOFF_SECONDS)
        finally:
            self._opening.pop(index, None)


def _left(session: LockSession) -> None:
    """No block holds `session` now, so no run on it holds a lock: a lock it still holds
    would be held for nobody (a bug), and the session is closed to drop it."""
    if session.holds_locks and not session.closed:
        log.error("lock session %d was left holding a lock; closing it", session.pid)
        session.terminate()


async def _warmed(connection: Connection) -> BackendId:
    """A new lock session runs every fire-path statement once (claiming and locking
    nothing) before it is used, so no run waits for a statement to be prepared or a
    type to be looked up. Its backend, as the rows of its runs will name it."""
    await init_connection(connection)
    for statement, arguments in fire_sql.WARM_UP:
        await connection.fetch(statement, *arguments)
    row = await connection.fetchrow(fire_sql.OWN_BACKEND)
    assert row is not None, "a SELECT without FROM answers one row"
    return BackendId(row["pid"], row["started_at"])
