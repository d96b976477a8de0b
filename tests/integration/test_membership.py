"""Cluster membership and job ownership, on real PostgreSQL: members are live exactly while
their lock is held, and rendezvous hashing of buckets gives each job one owner."""

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from uuid import UUID

import asyncpg
import httpx
import pytest

from harness.postgres import with_database
from harness.waiting import eventually_async
from service.config import Settings
from service.domain.jobs import JobSpec, create_job, pause_job
from service.domain.names import lock_key
from service.domain.ownership import Heartbeat, Member, Members, owned_buckets
from service.domain.runs import RunStatus
from service.domain.schedules import CronSchedule
from service.scheduler.departure import LEAVE_SECONDS, PEERS_POLL_SECONDS, Departure
from service.scheduler.membership import Membership
from service.store import Store
from service.store.members import MemberSession, SeedTakenError
from service.store.members_sql import MEMBER_LOCK_CLASS
from service.store.ports import JoinCluster
from tests.support.fire import finished_runs, runs_of
from tests.support.inprocess import served

POLL_SECONDS = 0.2
PATIENCE_SECONDS = 30
JOB_COUNT = 1000

Ownership = dict[str, tuple[UUID, int]]


@asynccontextmanager
async def cluster(database_url: str, size: int) -> AsyncIterator[list[Membership]]:
    """`size` started memberships; every one stopped on the way out."""
    members = [
        Membership(join=joining(database_url, f"replica-{index}"), poll_seconds=POLL_SECONDS)
        for index in range(size)
    ]
    try:
        for member in members:
            await member.start()
        yield members
    finally:
        for member in members:
            await member.stop()


def joining(dsn: str, runner_id: str, tzdata: str = "") -> JoinCluster:
    """Joins as `runner_id` on version "test", as a replica does (service/app.py)."""
    return partial(MemberSession.join, dsn, runner_id, "test", tzdata)


def views_agree(members: Sequence[Membership], size: int) -> bool:
    views = {member.members.seeds for member in members}
    return len(views) == 1 and len(views.pop()) == size


async def settled(members: Sequence[Membership], size: int) -> list[Members]:
    await eventually_async(
        lambda: views_agree(members, size), PATIENCE_SECONDS, f"{size} members in every view"
    )
    return [member.members for member in members]


async def lock_holder(database_url: str, seed: int) -> int | None:
    """The backend pid holding member `seed`'s lock, read from pg_locks."""
    connection = await asyncpg.connect(database_url)
    try:
        pid: int | None = await connection.fetchval(
            """SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND classid = $1::oid AND objid = $2::oid AND objsubid = 2
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())""",
            MEMBER_LOCK_CLASS,
            seed,
        )
        return pid
    finally:
        await connection.close()


async def terminate_backend(database_url: str, pid: int) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


async def add_jobs(store: Store, count: int, *, paused: int = 0) -> list[str]:
    """`count` active jobs plus `paused` paused ones; returns the active jobs' names."""
    now = datetime.now(UTC)
    spec = JobSpec(schedule=CronSchedule(kind="cron", expression="0 3 * * *"), task="log")
    names = [f"job-{index:04d}" for index in range(count + paused)]
    for index, name in enumerate(names):
        job = create_job(name, spec, now)
        assert await store.insert_job(pause_job(job, now) if index >= count else job)
    return names[:count]


async def ownership(store: Store, views: Sequence[Members]) -> list[Ownership]:
    """What each view's window would read: the active jobs of the buckets it owns."""
    return [await owned_jobs(store, view) for view in views]


async def owned_jobs(store: Store, view: Members) -> Ownership:
    # Two days ahead: a daily job's cursor falls due within it.
    read = await store.read_window(owned_buckets(view), 2 * 86400)
    return {job.name: job.revision for job, _ in read.jobs}


def holders(owned: Sequence[Ownership]) -> dict[str, list[int]]:
    """Per job, the indexes of the members owning it."""
    found: dict[str, list[int]] = {}
    for index, jobs in enumerate(owned):
        for name in jobs:
            found.setdefault(name, []).append(index)
    return found


@pytest.mark.parametrize("size", [2, 3])
async def test_members_see_each_other(database_url: str, size: int) -> None:
    async with cluster(database_url, size) as members:
        views = await settled(members, size)
        assert sorted(view.own for view in views if view.own is not None) == list(views[0].seeds)
        assert all(member.joined for member in members)
        runners = {peer.runner_id for peer in members[0].peers}
        assert runners == {f"replica-{index}" for index in range(size)}


async def test_members_on_different_time_zone_databases_are_warned_about(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    releases = {"old": "2024a (tzdata package)", "new": "2025b (tzdata package)"}
    members = [
        Membership(join=joining(database_url, name, release), poll_seconds=POLL_SECONDS)
        for name, release in releases.items()
    ]
    try:
        for member in members:
            await member.start()
        await settled(members, 2)
        assert {peer.tzdata for peer in members[0].peers} == set(releases.values())
        await eventually_async(
            lambda: "different time-zone databases: 2024a" in caplog.text,
            PATIENCE_SECONDS,
            "a warning naming both releases",
        )
    finally:
        for member in members:
            await member.stop()


async def test_members_on_one_time_zone_database_raise_no_warning(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(database_url, 2) as members:
        await settled(members, 2)
    assert "time-zone databases" not in caplog.text


async def test_members_started_together_know_each_other_when_started(database_url: str) -> None:
    """Replicas of a fresh deployment start moments apart: the first one's start waits
    until its view holds still, so its first sync already knows the others."""
    first, second = (
        Membership(join=joining(database_url, name), poll_seconds=POLL_SECONDS)
        for name in ("early", "late")
    )

    async def late_start() -> None:
        await asyncio.sleep(POLL_SECONDS / 2)
        await second.start()

    try:
        await asyncio.gather(first.start(), late_start())
        assert len(first.members.seeds) == 2, first.members
    finally:
        await first.stop()
        await second.stop()


async def test_a_killed_member_leaves_every_view_and_rejoins(database_url: str) -> None:
    async with cluster(database_url, 3) as members:
        views = await settled(members, 3)
        victim, old_seed = members[0], views[0].own
        assert old_seed is not None
        pid = await lock_holder(database_url, old_seed)
        assert pid is not None
        await terminate_backend(database_url, pid)

        def dropped() -> bool:
            return all(old_seed not in member.members.seeds for member in members[1:])

        await eventually_async(
            dropped, PATIENCE_SECONDS, "the killed member out of the others' views"
        )
        await settled(members, 3)
        assert victim.members.own not in (None, old_seed)
        assert await lock_holder(database_url, old_seed) is None


async def test_a_rejoin_keeps_the_instant_the_replica_came_up(
    database_url: str, store: Store
) -> None:
    """#41, finding 7: a replica whose membership's connection is lost (a PostgreSQL
    restart, a heartbeat past its deadline) joins again under a new seed, but it was up
    all along: the new row keeps the instant it first joined, and the cluster's
    `cluster_since` (the audit's `Takeover.since`) does not move forward."""
    async with cluster(database_url, 1) as [member]:
        [view] = await settled([member], 1)
        since = member.cluster_since
        assert since is not None
        assert view.own is not None
        pid = await lock_holder(database_url, view.own)
        assert pid is not None
        await terminate_backend(database_url, pid)

        def rejoined() -> bool:
            return member.members.own not in (None, view.own)

        await eventually_async(rejoined, PATIENCE_SECONDS, "the member to join again")
        [row] = await store.live_members()
        assert (row.seed, row.started_at) == (member.members.own, since)
        assert member.cluster_since == since


async def test_a_tick_a_live_replica_still_holds_is_no_misfire_after_a_rejoin(
    settings: Settings, store: Store, database_url: str
) -> None:
    """#41, finding 7, end to end: a lone replica's tick waits within its grace (another
    session holds its job's lock: LOCKED, asked again), lagging, so the audit hands it
    over, round after round. The replica's membership is lost and rejoins: the tick
    fell due while that replica was up, so it is not missed by all, and no misfire;
    once the lock is free, it runs. Before, the rejoin moved `cluster_since` past the
    tick, and the audit recorded it as a misfire (catch-up `none`)."""
    scheduling = settings.model_copy(update={"scheduler": True, "takeover_seconds": 1})
    holder = await asyncpg.connect(database_url)
    try:
        # Held before the job exists: its tick can only wait, however slow the box.
        await holder.execute("SELECT pg_advisory_lock($1)", lock_key("held"))
        async with served(scheduling) as client:
            at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
            job = {
                "name": "held",
                "schedule": {"kind": "once", "at": at.isoformat()},
                "task": "log",
                "args": {"message": "held"},
                "misfire_grace_seconds": 60,
                "catchup": "none",
            }
            made = await client.post("/v1/jobs", json=job)
            assert made.status_code == 201, made.text

            async def handed_over(more_than: float) -> float | None:
                count = await _taken_over(client)
                return count if count > more_than else None

            await eventually_async(lambda: handed_over(0), 30, "the lagging tick handed over")
            [first] = await store.live_members()
            pid = await lock_holder(database_url, first.seed)
            assert pid is not None
            await terminate_backend(database_url, pid)

            async def rejoined() -> bool:
                return [m.seed for m in await store.live_members()] not in ([], [first.seed])

            await eventually_async(rejoined, PATIENCE_SECONDS, "the replica to join again")
            seen = await _taken_over(client)

            async def audited_or_recorded() -> bool:
                # Two more hand-overs: an audit round since the rejoin kept waiting for
                # the tick. A row: it was decided (a misfire, before).
                return await _taken_over(client) >= seen + 2 or bool(await runs_of(store, "held"))

            await eventually_async(audited_or_recorded, 30, "an audit after the rejoin")
            await holder.execute("SELECT pg_advisory_unlock($1)", lock_key("held"))
            [run] = await finished_runs(store, "held", 1)
    finally:
        await holder.close()
    assert (run.scheduled_for, run.status, run.skip_reason) == (at, RunStatus.SUCCEEDED, None)


async def _taken_over(client: httpx.AsyncClient) -> float:
    """The replica's tickgate_ticks_taken_over_total, from its /metrics."""
    text = (await client.get("/metrics")).text
    counts = [line.split()[-1] for line in text.splitlines() if line.startswith(_TAKEN_OVER)]
    return float(counts[0]) if counts else 0.0


_TAKEN_OVER = "tickgate_ticks_taken_over_total "


async def test_a_stopped_member_releases_its_lock(database_url: str) -> None:
    async with cluster(database_url, 2) as members:
        views = await settled(members, 2)
        await members[0].stop()
        await settled(members[1:], 1)
        assert views[0].own is not None
        assert await lock_holder(database_url, views[0].own) is None
        assert not members[0].joined


async def test_each_job_has_one_owner(database_url: str, store: Store) -> None:
    active = await add_jobs(store, JOB_COUNT, paused=20)
    async with cluster(database_url, 3) as members:
        owned = await ownership(store, await settled(members, 3))
    owners = holders(owned)
    assert sorted(owners) == active
    assert all(len(owners[name]) == 1 for name in active)
    shares = Counter(index for [index] in owners.values())
    assert all(0.20 * JOB_COUNT <= shares[index] <= 0.47 * JOB_COUNT for index in range(3))


async def test_a_leaver_moves_only_its_own_jobs(database_url: str, store: Store) -> None:
    await add_jobs(store, JOB_COUNT)
    async with cluster(database_url, 3) as members:
        before = await ownership(store, await settled(members, 3))
        await members[2].stop()
        after = await ownership(store, await settled(members[:2], 2))
    owners, owners_after = holders(before), holders(after)
    assert sorted(owners_after) == sorted(owners)
    assert all(len(held) == 1 for held in owners_after.values())
    for name, [owner] in owners.items():
        if owner != 2:
            assert owners_after[name] == [owner], name
    # The leaver's jobs went to both survivors, not to one.
    taken = Counter(owners_after[name][0] for name, [owner] in owners.items() if owner == 2)
    assert set(taken) == {0, 1}


async def test_a_notified_read_finds_the_named_jobs_in_any_state(store: Store) -> None:
    active = await add_jobs(store, 3, paused=2)
    read = await store.read_window(None, 0, ["job-0000", "job-0004", "missing"])
    states = {job.name: job.state.value for job, _ in read.jobs}
    assert states == {"job-0000": "active", "job-0004": "paused"}
    assert active[0] == "job-0000"


async def test_a_refill_reads_again_only_the_jobs_it_does_not_hold_at_their_revision(
    store: Store,
) -> None:
    """A crowd is read again while it drains: the jobs a window holds at the revision
    read come back as held (no definition read or parsed again), a job edited since
    comes back as it stands, and a job paused since not at all."""
    names = await add_jobs(store, 4)
    first = {job.name: job for job, _ in (await store.read_window(None, 2 * 86400)).jobs}
    await store.update_jobs(
        {"job-0001": lambda job, now: job.model_copy(update={"version": job.version + 1})}
    )
    await store.update_jobs({"job-0002": pause_job})
    again = await store.read_window(None, 2 * 86400, filed=first.get)
    read = {job.name: job for job, _ in again.jobs}
    assert sorted(read) == [names[0], names[1], names[3]]
    assert read["job-0000"] is first["job-0000"]
    assert read["job-0003"] is first["job-0003"]
    assert read["job-0001"] is not first["job-0001"]
    assert read["job-0001"].version == first["job-0001"].version + 1


async def test_alone_or_with_no_view_a_replica_owns_everything(
    database_url: str, store: Store
) -> None:
    await add_jobs(store, 50, paused=3)
    everything = await store.active_versions()
    async with cluster(database_url, 1) as [member]:
        [alone] = await settled([member], 1)
    for view in (alone, Members.unknown()):
        assert owned_buckets(view) is None
        assert await owned_jobs(store, view) == everything


async def test_the_member_lock_is_the_two_int_form(database_url: str) -> None:
    session = await MemberSession.join(database_url, "r", "test")
    try:
        assert await lock_holder(database_url, session.seed) is not None
        [me] = await session.live_members()
        assert (me.seed, me.runner_id, me.version) == (session.seed, "r", "test")
        # A job lock whose bigint key has the same high and low halves is another lock.
        job_key = (MEMBER_LOCK_CLASS << 32) | session.seed
        other = await asyncpg.connect(database_url)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1::bigint)", job_key)
        finally:
            await other.close()
    finally:
        await session.close()
    assert await lock_holder(database_url, session.seed) is None


async def test_a_seed_whose_lock_is_taken_is_no_member(database_url: str) -> None:
    foreign = await asyncpg.connect(database_url)
    try:
        # A fresh database draws seed 1 first.
        assert await foreign.fetchval("SELECT pg_try_advisory_lock($1, 1)", MEMBER_LOCK_CLASS)
        with pytest.raises(SeedTakenError):
            await MemberSession.join(database_url, "r", "test")
        session = await MemberSession.join(database_url, "r", "test")
        try:
            assert [m.seed for m in await session.live_members()] == [session.seed]
        finally:
            await session.close()
    finally:
        await foreign.close()


async def test_heartbeats_report_and_sweep_long_dead_members(database_url: str) -> None:
    first = await MemberSession.join(database_url, "first", "test")
    second = await MemberSession.join(database_url, "second", "test")
    admin = await asyncpg.connect(database_url)
    try:
        long_ago = datetime.now(UTC) - timedelta(hours=2)
        dead = await admin.fetchval(
            """INSERT INTO tickgate_members (runner_id, version, heartbeat_at)
               VALUES ('dead', 'test', $1) RETURNING seed""",
            long_ago,
        )
        # Live whatever its heartbeat says: only the lock counts.
        await admin.execute(
            "UPDATE tickgate_members SET heartbeat_at = $1 WHERE seed = $2", long_ago, first.seed
        )
        synced = datetime.now(UTC)
        live = await second.heartbeat(Heartbeat(runs_in_flight=7, last_sync=synced))
        assert [m.seed for m in live] == [first.seed, second.seed]
        seeds = {row["seed"] for row in await admin.fetch("SELECT seed FROM tickgate_members")}
        assert seeds == {first.seed, second.seed}
        assert dead not in seeds
        [_, me] = await first.live_members()
        assert (me.runs_in_flight, me.last_sync) == (7, synced)
    finally:
        await admin.close()
        await first.close()
        await second.close()


async def test_a_replica_that_cannot_join_owns_everything_and_keeps_trying(
    database_url: str,
) -> None:
    unreachable = with_database(database_url, "tickgate_no_such_database")
    member = Membership(join=joining(unreachable, "r"), poll_seconds=POLL_SECONDS)
    await member.start()
    try:
        assert member.members == Members.unknown()
        assert not member.joined
    finally:
        await member.stop()


class Leaving:
    """A member's departure, with what it read of the live members while it waited
    and what its one peer's view was the moment it stopped its ticks."""

    def __init__(
        self,
        store: Store,
        member: Membership,
        peer: Membership | None = None,
        *,
        hand_over: bool = True,
    ) -> None:
        self.readings: list[list[int]] = []
        self.peer_view_at_stop: tuple[int, ...] | None = None
        self.stops = 0
        self._store, self._peer = store, peer
        self.departure = Departure(
            member, self._stop_ticks, self._live_members, hand_over=hand_over
        )

    async def _live_members(self) -> list[Member]:
        live = await self._store.live_members()
        self.readings.append([member.seed for member in live])
        return live

    def _stop_ticks(self) -> None:
        self.stops += 1
        if self._peer is not None:
            self.peer_view_at_stop = self._peer.members.seeds


async def test_a_leaver_fires_on_until_its_peer_has_seen_it_go(
    database_url: str, store: Store
) -> None:
    """With a peer staying, the ticks stop only after the peer's view has lost the
    leaver (so the peer owns its jobs by then), and not early: every reading showed
    the peer live."""
    async with cluster(database_url, 2) as [staying, leaver]:
        await settled([staying, leaver], 2)
        seed = leaver.members.own
        leaving = Leaving(store, leaver, peer=staying)
        leaving.departure.begin()
        await leaving.departure.finished()
        assert leaving.stops == 1
        assert leaving.peer_view_at_stop is not None
        assert seed not in leaving.peer_view_at_stop
        assert leaving.readings
        assert all(reading == [staying.members.own] for reading in leaving.readings)


async def test_a_cluster_stopping_as_a_whole_stops_its_ticks_once_nobody_is_left(
    database_url: str, store: Store
) -> None:
    """Three members told to leave at once: each stops its ticks on the reading that
    shows no other member live, instead of waiting out LEAVE_SECONDS for a takeover
    nobody will make."""
    async with cluster(database_url, 3) as members:
        await settled(members, 3)
        leavings = [Leaving(store, member) for member in members]
        for leaving in leavings:
            leaving.departure.begin()
        await asyncio.gather(*(leaving.departure.finished() for leaving in leavings))
    for leaving in leavings:
        assert leaving.stops == 1
        assert leaving.readings[-1] == [], leaving.readings
        assert len(leaving.readings) < LEAVE_SECONDS / PEERS_POLL_SECONDS


async def test_alone_or_without_ownership_a_leaver_stops_its_ticks_at_once(
    database_url: str, store: Store
) -> None:
    async with cluster(database_url, 2) as [alone, other]:
        await other.stop()
        await settled([alone], 1)
        leaving = Leaving(store, alone)
        leaving.departure.begin()
        assert leaving.stops == 1  # before any await: begin() itself stopped them
        unowned = Leaving(store, other, hand_over=False)
        unowned.departure.begin()
        assert unowned.stops == 1
        assert leaving.readings == unowned.readings == []
