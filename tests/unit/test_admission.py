"""Admission: room, claims in flight, one tick per job per batch, bounded and
deadline-bound waiting."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from service.scheduler.admission import Admission

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Tick:
    job_name: str
    deadline: datetime = T0 + timedelta(minutes=1)
    alone: bool = False


def test_take_fits_the_room_and_gives_each_job_one_tick_per_batch() -> None:
    admission: Admission[Tick] = Admission(room=3, claims=10, limit=100)
    admission.offer([Tick("a"), Tick("a"), Tick("b"), Tick("c"), Tick("d")])
    assert [t.job_name for t in admission.take(10)] == ["a", "b", "c"]
    assert admission.room == 0
    assert admission.take(10) == []
    admission.free(2)
    assert [t.job_name for t in admission.take(10)] == ["a", "d"]
    assert len(admission) == 0


def test_a_tick_that_goes_alone_is_a_batch_of_its_own() -> None:
    admission: Admission[Tick] = Admission(room=10, claims=10, limit=100)
    admission.offer([Tick("a"), Tick("capped", alone=True), Tick("b")])
    assert [t.job_name for t in admission.take(10)] == ["a", "b"]
    assert [t.job_name for t in admission.take(10)] == ["capped"]


def test_waiting_is_bounded_and_ends_at_the_deadline() -> None:
    admission: Admission[Tick] = Admission(room=0, claims=1, limit=2)
    soon = Tick("soon", deadline=T0 + timedelta(seconds=1))
    later = Tick("later", deadline=T0 + timedelta(seconds=9))
    assert admission.offer([Tick("oldest"), soon, later]) == [Tick("oldest")]
    assert admission.expired(T0) == []
    assert admission.expired(T0 + timedelta(seconds=2)) == [soon]
    assert admission.expired(T0 + timedelta(seconds=2)) == []
    assert admission.expired(T0 + timedelta(seconds=10)) == [later]
    assert len(admission) == 0


def test_claims_in_flight_are_bounded_apart_from_the_room() -> None:
    admission: Admission[Tick] = Admission(room=100, claims=2, limit=100)
    admission.offer([Tick(name) for name in "abcdef"])
    assert [t.job_name for t in admission.take(2)] == ["a", "b"]
    assert [t.job_name for t in admission.take(2)] == ["c", "d"]
    assert admission.take(2) == []  # two claims in flight: the rest waits for one to answer
    assert (admission.claims, admission.room) == (0, 96)
    admission.claim_ended()
    admission.free(2)  # its ticks turned out not to run here: room back at once
    assert [t.job_name for t in admission.take(10)] == ["e", "f"]
    assert (admission.claims, admission.room) == (0, 96)
    admission.claim_ended()
    assert admission.take(10) == []  # nothing waits: no claim goes out, none is held
    assert admission.claims == 1
