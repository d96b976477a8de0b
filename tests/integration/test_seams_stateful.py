"""Every seam holds (#41): random sequences of user actions and faults against real
PostgreSQL and two replicas in process (each with its scheduler), with the invariants
checked after every step.

Rules: create (cron, interval, daily, once; every overlap policy; retries; skip and
misfire hooks with a secret header; start and end windows; jitter; outputs big enough to
trim), patch (schedule, window, args, overlap, the hook's URL sent back with `***`),
pause, resume, delete, create again under a deleted name, trigger with args, backfill a
range ending at a skip or misfire row, cancel a run, cancel a queued tick; an app's two
processes running ticks of a job they fire through the APScheduler gate
(service/store/gate.py), and the API asked to change, trigger, backfill, pause, resume
or delete that job; and faults: a lock session terminated, the process stalled, a
replica restarted, every replica down.

Invariants (the accounting through `harness.accounting.tick_problems`, which the soak's
judge uses too):
- every nominal tick of every job before its cursor has exactly one outcome, and no
  (job, tick) has two rows;
- no attempt starts after its job was deleted or paused, or runs a definition older than
  the one stored when it started (the `probe` task says which it ran; a run triggered
  with args of its own keeps them through an edit);
- a `queue_one` tick due while a run of its job was in flight is not a misfire, unless a
  fault came near it;
- every answer is below 500, and none shows a secret header's value;
- a hook's secret header reaches only the origin it was stored for (#42);
- each job keeps no more output than `TICKGATE_OUTPUT_BYTES_PER_JOB` beyond a
  retention round (#42), and trimming removes no row;
- no job lock is held (for longer than a claim or a finish takes) with no `running` row;
- each tick of the app's job runs once across its processes, and every row of it is an
  app process's (no replica fires it); a change, trigger or backfill of it is a 409
  that changes nothing.

The API runs on PostgreSQL alone; the scheduler's part of the seams runs on both
backends too (`SchedulerSeams`, at the ports: the same machine on PostgreSQL and on the
in-memory fake of harness/memory.py).

`make check` runs a few examples of a few steps (`SEAMS_EXAMPLES`, `SEAMS_STEPS`);
`make soak` many more. On failure Hypothesis prints the seed and the shrunk steps; a
failure seen once is replayed with TICKGATE_SEAMS_SEED.
"""

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, Phase, note, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.accounting import Ticks, judge_ticks, lock_problems, tick_problems
from harness.postgres import Sql, with_database
from harness.receiver import Receiver
from service.config import Settings
from service.domain.jobs import (
    Job,
    JobSpec,
    Overlap,
    create_job,
    pause_job,
    replace_job,
    resume_job,
)
from service.domain.names import lock_key
from service.domain.runs import RunStatus
from service.domain.schedules import CHECKED, IntervalSchedule
from service.metrics import Metrics
from service.scheduler import Window
from service.store import Store
from service.store.gate import AppGate, Claim
from service.store.ports import ClaimOutcome
from tests.support.backends import Backend, MemoryBackend, PostgresBackend, RecordingPool
from tests.support.db import TemplateDatabases
from tests.support.fire import Gates, lock_pool, running
from tests.support.seams import Definitions, LoopThread, Probe, Replica

EXAMPLES = int(os.environ.get("SEAMS_EXAMPLES", "2"))
STEPS = int(os.environ.get("SEAMS_STEPS", "12"))
STEP_SECONDS = float(os.environ.get("SEAMS_STEP_SECONDS", "0.5"))
SEED = int(os.environ.get("TICKGATE_SEAMS_SEED", random.randrange(2**32)))
NAMES = ("alpha", "beta", "gamma")
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + [Phase.shrink] * (
    os.environ.get("SEAMS_SHRINK") == "1"
)
# Checks to leave out, by name (comma-separated): to look past a failure already known,
# on an old commit say (`answers`: every answer below 500; the others, the invariants).
IGNORED = frozenset(filter(None, os.environ.get("SEAMS_IGNORE", "").split(",")))
FAULT_SHADOW_SECONDS = 10.0  # a misfire this near a fault may be the fault's
LOCK_PATIENCE_SECONDS = 5.0  # a claim's lock before its row, a finish's before its unlock
OUTPUT_BOUND = 3000  # bytes of output a job keeps: two or three padded runs
TRIM_PATIENCE_SECONDS = 6.0  # a few retention rounds (one a second, on one replica)
# A hook's secret header, by the host it was stored for: a hook moved to another origin
# must restate it (`***` there is a 422), and each secret may arrive at its host only.
SECRETS = {"127.0.0.1": "Bearer seams-hook-secret-1", "localhost": "Bearer seams-hook-secret-2"}

# The runs whose output and log, with those of their job's newer runs, pass the bound:
# what the retention round trims (chores_sql.TRIM_OUTPUTS, from the other side).
OVER_BOUND = """SELECT run_id FROM (
    SELECT o.run_id, sum(coalesce(pg_column_size(o.output), 0) + coalesce(pg_column_size(o.log), 0))
        OVER (PARTITION BY r.job ORDER BY r.scheduled_for DESC, r.id DESC) AS with_newer
    FROM tickgate_runs r JOIN tickgate_run_outputs o ON o.run_id = r.id
    WHERE o.output IS NOT NULL OR o.log IS NOT NULL) sized WHERE with_newer > $1"""

SCHEDULES = ("cron1", "cron2", "every1", "every3", "once", "daily")
SHAPES = st.fixed_dictionaries(
    {
        # Mostly a tick a second: the seams are where ticks crowd a run.
        "schedule": st.sampled_from(("cron1", "every1", *SCHEDULES)),
        "overlap": st.sampled_from(("skip", "allow", "queue_one")),
        "attempts": st.integers(1, 3),
        # A run longer than the grace and the period, often: ticks wait behind it.
        "sleep": st.sampled_from((0.0, 0.3, 2.5, 2.5)),
        "fail": st.integers(0, 2),
        "hook": st.sampled_from(("skip", None, "misfire")),
        "start": st.sampled_from((None, -30, 2, 3600)),
        "end": st.sampled_from((None, 4, 3600)),
        "jitter": st.sampled_from((0, 1)),
        "grace": st.sampled_from((1, 1, 3)),
        "pad": st.sampled_from((1200, 0)),
    }
)
PATCHES = st.one_of(
    st.tuples(st.just("schedule"), st.sampled_from(SCHEDULES)),
    st.tuples(st.just("start_at"), st.sampled_from((None, -30, 2, 3600))),
    st.tuples(st.just("end_at"), st.sampled_from((None, 3, 3600))),
    st.tuples(st.just("overlap"), st.sampled_from(("skip", "allow", "queue_one"))),
    st.tuples(st.just("sleep"), st.sampled_from((0.0, 0.3, 2.5))),
    st.tuples(st.just("hook"), st.sampled_from(("same", "path", "moved", "restated"))),
)


# The job an app fires through the APScheduler gate, from two processes of its own.
APP_JOB = "app-job"
APP_SPEC = JobSpec.model_validate(
    {"schedule": {"kind": "app", "trigger": "cron[second='*']"}, "task": "app:seams:tick"},
    context={CHECKED: True},
)
APP_REFUSED = {  # what the API may not do to an app's job: 409, nothing changed
    "patch": ("PATCH", "", {"description": "x"}),
    "put": ("PUT", "", {"schedule": {"kind": "cron", "expression": "* * * * *"}, "task": "probe"}),
    "trigger": ("POST", "/trigger", None),
    "backfill": (
        "POST",
        "/backfill",
        {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:05Z"},
    ),
}


def _at(offset: float | None) -> str | None:
    if offset is None:
        return None
    return (datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=offset)).isoformat()


def schedule_of(kind: str) -> dict[str, Any]:
    """A schedule whose ticks are whole seconds (the ledger's floats compare exactly)."""
    now = datetime.now(UTC).replace(microsecond=0)
    schedules: dict[str, dict[str, Any]] = {
        "cron1": {"kind": "cron", "expression": "* * * * * *"},
        "cron2": {"kind": "cron", "expression": "*/2 * * * * *"},
        "every1": {"kind": "interval", "every_seconds": 1, "anchor": now.isoformat()},
        "every3": {"kind": "interval", "every_seconds": 3, "anchor": now.isoformat()},
        "once": {"kind": "once", "at": (now + timedelta(seconds=2)).isoformat()},
        "daily": {"kind": "daily", "at": [(now + timedelta(minutes=1)).strftime("%H:%M")]},
    }
    return schedules[kind]


def ticks_of(job: Job) -> Ticks:
    """The job's nominal ticks as it stands (its schedule, window and threshold)."""

    def ticks(after: float, before: float) -> Any:
        at = datetime.fromtimestamp(after, UTC)
        while (tick := job.tick_after(at)) is not None and tick.timestamp() < before:
            yield round(tick.timestamp(), 6)
            at = tick

    return ticks


class Seams(RuleBasedStateMachine):
    """No rule has a precondition on what the replicas answered: on a replay Hypothesis
    must draw the same data whatever they answer (timing differs), so a rule that finds
    nothing to act on does nothing."""

    templates: TemplateDatabases
    receiver: Receiver

    def __init__(self) -> None:
        super().__init__()
        self.loop = LoopThread()
        self.database = self.loop.run(self.templates.clone())
        url = with_database(self.templates.server_url, self.database)
        self.sql = Sql(url)
        self.store = self.loop.run(Store.open(url, max_size=2))
        self.probe = Probe()
        self.replicas = [
            Replica(self._settings(url, f"seam-{i}", self.receiver), self.probe) for i in (0, 1)
        ]
        for replica in self.replicas:
            self.loop.run(replica.start())
        self.definitions = Definitions()
        self.jobs: dict[str, dict[str, Any]] = {}  # name -> its body as stored
        self.paused: set[str] = set()
        self.faults: list[float] = []
        self.over_bound: set[Any] = set()  # the runs past their bound at the last check
        self.tags = count()
        self.gates = [self.loop.run(AppGate.open(url, f"app:seams:{i}")) for i in (0, 1)]
        self.app_claims: dict[datetime, list[Claim]] = {}  # since the app's job was made

    @staticmethod
    def _settings(url: str, runner: str, receiver: Receiver) -> Settings:
        # A cluster default hook on skips and misfires: every skip row a backfill crosses
        # has a delivery that refers to it (finding 2 needed only that).
        action = {"kind": "http", "args": {"url": receiver.url_for("/default-hook")}}
        settings = Settings(
            database_url=url,
            scheduler=True,
            runner_id=runner,
            http_allow="127.0.0.1",
            reconcile_seconds=1,
            shutdown_grace_seconds=0,
            default_hooks=[{"on": ["skip", "misfire"], "action": action}],
        )
        # Below the setting's floor (1 MiB), so that a few runs pass it: trimming meets
        # retries, backfills and edits within a short example.
        return settings.model_copy(update={"output_bytes_per_job": OUTPUT_BOUND})

    def teardown(self) -> None:
        try:
            for replica in self.replicas:
                self.loop.run(replica.stop())
            for gate in self.gates:
                self.loop.run(gate.close())
            self.loop.run(self.store.close())
            self.sql.close()
            self.loop.run(self.templates.drop(self.database))
        finally:
            self.loop.close()

    # -- speaking to the API: any replica, every answer below 500

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        replica = random.choice([r for r in self.replicas if r.http is not None])
        assert replica.http is not None
        answer = self.loop.run(replica.http.request(method, path, json=body))
        note(f"{method} {path} {body} -> {answer.status_code} {answer.text[:300]}")
        if "answers" not in IGNORED:
            assert answer.status_code < 500, f"{method} {path}: {answer.status_code} {answer.text}"
            shown = [secret for secret in SECRETS.values() if secret in answer.text]
            assert not shown, f"{method} {path} answered a secret: {answer.text}"
        return answer

    def write(self, name: str, method: str, path: str, body: Any = None) -> httpx.Response:
        """A write that stores the job's definition as `self.jobs[name]` if it succeeds."""
        sent = time.time()
        answer = self.call(method, path, body)
        if answer.is_success:
            stored = self.jobs[name]
            if name not in self.paused:
                tag = stored["args"]["tag"]
                self.definitions.store(name, tag, stored["overlap"], sent, time.time())
        return answer

    def _tag(self, name: str) -> str:
        return f"{name}.{next(self.tags)}"

    def _name(self, index: int, alive: bool = True) -> str | None:
        names = [n for n in NAMES if (n in self.jobs) == alive]
        return names[index % len(names)] if names else None

    # -- rules: what users do

    @initialize(shape=SHAPES)
    def first_job(self, shape: dict[str, Any]) -> None:
        self.create(0, shape)

    @rule(index=st.integers(0, 2), shape=SHAPES)
    def create(self, index: int, shape: dict[str, Any]) -> None:
        if (name := self._name(index, alive=False)) is None:
            return
        body = {
            "name": name,
            "schedule": schedule_of(shape["schedule"]),
            "task": "probe",
            "args": {
                "tag": self._tag(name),
                "sleep": shape["sleep"],
                "fail": shape["fail"],
                "pad": shape["pad"],
            },
            "overlap": shape["overlap"],
            "retry": {
                "max_attempts": shape["attempts"],
                "min_backoff_seconds": 1,
                "max_backoff_seconds": 2,
            },
            "start_at": _at(shape["start"]),
            "end_at": _at(shape["end"]),
            "jitter_seconds": shape["jitter"],
            "misfire_grace_seconds": shape["grace"],
            "hooks": self._hooks(shape["hook"]),
        }
        self.jobs[name] = body
        if not self.write(name, "POST", "/v1/jobs", body).is_success:
            del self.jobs[name]  # a window that ends before it starts: a 422

    def _hooks(self, event: str | None) -> list[dict[str, Any]]:
        if event is None:
            return []
        return [{"on": [event], "action": self._hook_action("/hook", "127.0.0.1")}]

    def _hook_action(self, path: str, host: str, secret: str | None = None) -> dict[str, Any]:
        """An http hook action to the receiver under `host`, with its secret header (or
        `secret` in its place: `***` to keep the stored one)."""
        url = self.receiver.url_for(path).replace("127.0.0.1", host, 1)
        headers = {"Authorization": secret or SECRETS[host]}
        args = {"url": url, "headers": headers, "secret_headers": ["Authorization"]}
        return {"kind": "http", "args": args}

    def _hook_patch(self, name: str, move: str) -> dict[str, Any] | None:
        """The job's hook as `GET` shows it (`***`): at its URL, at another path, at the
        other origin; or at the other origin with that origin's secret restated."""
        hooks = self.jobs[name]["hooks"]
        if not hooks:
            return None
        url = urlsplit(hooks[0]["action"]["args"]["url"])
        host = url.hostname or ""
        other = next(h for h in SECRETS if h != host)
        path = url.path if move == "same" else f"/hook-{next(self.tags)}"
        where = other if move in ("moved", "restated") else host
        secret = SECRETS[other] if move == "restated" else "***"
        return {"hooks": [{"on": hooks[0]["on"], "action": self._hook_action(path, where, secret)}]}

    @rule(index=st.integers(0, 2), change=PATCHES)
    def patch(self, index: int, change: tuple[str, Any]) -> None:
        if (name := self._name(index)) is None:
            return
        field, value = change
        args = self.jobs[name]["args"] | {"tag": self._tag(name)}
        body: dict[str, Any] = {"args": args}
        if field == "hook":
            if (hooks := self._hook_patch(name, value)) is None:
                return
            body |= hooks
        elif field == "schedule":
            body["schedule"] = schedule_of(value)
        elif field in ("start_at", "end_at"):
            body[field] = _at(value)
        elif field == "sleep":
            body["args"] = args | {"sleep": value}
        else:
            body[field] = value
        before = self.jobs[name]
        self.jobs[name] = before | body
        answer = self.write(name, "PATCH", f"/v1/jobs/{name}", body)
        if not answer.is_success:
            self.jobs[name] = before
        if field == "hook":  # `***` keeps a hook's secret for its own URL only
            assert answer.status_code == (422 if value in ("path", "moved") else 200), answer.text

    @rule(index=st.integers(0, 2))
    def pause(self, index: int) -> None:
        if (name := self._name(index)) is None:
            return
        answer = self.call("POST", f"/v1/jobs/{name}/pause", {"note": "seams"})
        if answer.is_success:
            self.definitions.end(name, time.time())
            self.paused.add(name)

    @rule(index=st.integers(0, 2))
    def resume(self, index: int) -> None:
        if not self.paused:
            return
        name = sorted(self.paused)[index % len(self.paused)]
        self.paused.discard(name)
        if not self.write(name, "POST", f"/v1/jobs/{name}/resume").is_success:
            self.paused.add(name)

    @rule(index=st.integers(0, 2))
    def delete(self, index: int) -> None:
        if (name := self._name(index)) is None:
            return
        if self.call("DELETE", f"/v1/jobs/{name}").is_success:
            self.definitions.end(name, time.time())
            del self.jobs[name]
            self.paused.discard(name)

    @rule(index=st.integers(0, 2), sleep=st.sampled_from((0.0, 2.5)), fail=st.integers(0, 2))
    def trigger(self, index: int, sleep: float, fail: int) -> None:
        if not (names := sorted(set(self.jobs) - self.paused)):
            return
        name = names[index % len(names)]
        tag = f"{self.jobs[name]['args']['tag']}:manual.{next(self.tags)}"
        self.definitions.add_run(name, tag, self.jobs[name]["overlap"], time.time())
        args = {"tag": tag, "sleep": sleep, "fail": fail}
        self.call("POST", f"/v1/jobs/{name}/trigger", {"args": args})

    @rule(
        index=st.integers(0, 2),
        row=st.integers(0, 9),
        gaps=st.booleans(),
        back=st.sampled_from((0, 1, 2, 4)),
        width=st.sampled_from((0, 1, 3)),
    )
    def backfill(self, index: int, row: int, gaps: bool, back: int, width: int) -> None:
        """A range ending at (or just before) one of the job's skip or misfire rows, so
        that it crosses a skip that sent a hook (every skip has the default hook), or the
        ticks a gap row sums up: with `gaps`, the rows that stand for several ticks, the
        rarest kind, if there are any."""
        if (name := self._name(index)) is None:
            return
        skips = self.sql.fetch(
            """SELECT scheduled_for FROM tickgate_runs WHERE job = $1 AND status = 'skipped'
               AND (NOT $2 OR missed_ticks > 1) ORDER BY scheduled_for DESC LIMIT 10""",
            name,
            gaps,
        ) or self.sql.fetch(
            """SELECT scheduled_for FROM tickgate_runs WHERE job = $1 AND status = 'skipped'
               ORDER BY scheduled_for DESC LIMIT 10""",
            name,
        )
        end = skips[row % len(skips)]["scheduled_for"] if skips else datetime.now(UTC)
        end -= timedelta(seconds=back if skips else back + 1)
        start = end - timedelta(seconds=width)
        body = {"from": start.isoformat(), "to": end.isoformat()}
        if name in self.paused:  # asked of a paused job, it runs as asked (docs/api.md)
            stored = self.jobs[name]
            self.definitions.add_run(name, stored["args"]["tag"], stored["overlap"], time.time())
        self.call("POST", f"/v1/jobs/{name}/backfill", body)

    @rule(index=st.integers(0, 9))
    def cancel_run(self, index: int) -> None:
        running = self.sql.fetch("SELECT id FROM tickgate_runs WHERE status = 'running'")
        if running:
            run = running[index % len(running)]["id"]
            self.call("POST", f"/v1/runs/{run}/cancel", {"reason": "seams"})

    @rule(index=st.integers(0, 2))
    def cancel_queued(self, index: int) -> None:
        if (name := self._name(index)) is None:
            return
        self.call("POST", f"/v1/jobs/{name}/queued/cancel", {"reason": "seams"})

    @rule(process=st.integers(0, 1), back=st.integers(0, 3), fail=st.booleans())
    def app_runs_a_tick(self, process: int, back: int, fail: bool) -> None:
        """One of the app's processes is handed a run time (now, or a little past: the
        other may have had it) and runs it through the gate."""
        tick = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=back)
        found = self.loop.run(self._app_run(self.gates[process], tick, fail))
        note(f"app process {process} tick {tick:%H:%M:%S} -> {found.value}")
        self.app_claims.setdefault(tick, []).append(found)

    async def _app_run(self, gate: AppGate, tick: datetime, fail: bool) -> Claim:
        async with gate.session() as session:
            found, run = await session.claim(APP_JOB, tick, lock_key=lock_key(APP_JOB))
            if found is Claim.UNKNOWN:  # new, or deleted from the API: made again
                await gate.register(APP_JOB, APP_SPEC)
                self.app_claims.clear()
                found, run = await session.claim(APP_JOB, tick, lock_key=lock_key(APP_JOB))
            if run is not None:
                status = RunStatus.FAILED if fail else RunStatus.SUCCEEDED
                await session.finish(run, status, "failed" if fail else None)
                await session.unlock()
        return found

    @rule(action=st.sampled_from((*APP_REFUSED, "pause", "resume", "delete")))
    def operate_the_app_job(self, action: str) -> None:
        if action in APP_REFUSED:
            method, tail, body = APP_REFUSED[action]
            before = self.sql.fetch("SELECT version FROM tickgate_jobs WHERE name = $1", APP_JOB)
            answer = self.call(method, f"/v1/jobs/{APP_JOB}{tail}", body)
            assert answer.status_code == (409 if before else 404), answer.text
            after = self.sql.fetch("SELECT version FROM tickgate_jobs WHERE name = $1", APP_JOB)
            assert before == after
        elif action == "delete":
            if self.call("DELETE", f"/v1/jobs/{APP_JOB}").is_success:
                self.app_claims.clear()
        else:
            self.call("POST", f"/v1/jobs/{APP_JOB}/{action}", {} if action == "pause" else None)

    @rule(seconds=st.sampled_from((0.5, 1.5, 3.0)))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    # -- rules: faults

    @rule(index=st.integers(0, 9))
    def terminate_lock_session(self, index: int) -> None:
        holders = self.sql.fetch(
            """SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND objsubid = 1 ORDER BY pid"""
        )
        if holders:
            self.faults.append(time.time())
            pid = holders[index % len(holders)]["pid"]
            self.sql.fetch("SELECT pg_terminate_backend($1)", pid)

    @rule(seconds=st.sampled_from((1.5, 4.0)))
    def stall(self, seconds: float) -> None:
        self.faults.append(time.time() + seconds)
        self.loop.stall(seconds)

    @rule(index=st.integers(0, 1))
    def restart(self, index: int) -> None:
        self.faults.append(time.time())
        self.loop.run(self.replicas[index].stop())
        self.loop.run(self.replicas[index].start())
        self.faults.append(time.time())

    @rule(seconds=st.sampled_from((3.0, 6.0)))
    def outage(self, seconds: float) -> None:
        """Every replica down for a while (a deploy of all pods, say): the ticks due
        meanwhile are the audit's to record, a run of them in one gap row, which a
        backfill may then cross."""
        self.faults.append(time.time())
        for replica in self.replicas:
            self.loop.run(replica.stop())
        time.sleep(seconds)
        for replica in self.replicas:
            self.loop.run(replica.start())
        self.faults.append(time.time())

    # -- invariants

    @invariant()
    def time_passes(self) -> None:
        """Not a check: each step lasts a moment, so that the replicas fire, retry, skip
        and audit between the user's actions. Without it a whole example passed in a few
        seconds, before any tick had waited behind a run, been skipped or misfired."""
        time.sleep(STEP_SECONDS)

    @invariant()
    def every_tick_has_one_outcome(self) -> None:
        if "every_tick_has_one_outcome" in IGNORED:
            return
        jobs = self.loop.run(self.store.get_jobs(sorted(self.jobs)))
        problems = tick_problems(self.sql, {job.name: ticks_of(job) for job in jobs})
        assert not problems, problems[:10]

    @invariant()
    def every_attempt_ran_the_definition_stored(self) -> None:
        if "every_attempt_ran_the_definition_stored" in IGNORED:
            return
        problems = self.definitions.problems(list(self.probe.attempts))
        assert not problems, problems[:10]

    @invariant()
    def no_queue_one_tick_waiting_behind_a_run_misfires(self) -> None:
        """Behind any run: of a tick, a manual run or a backfill (a tick due during a
        backfill run was recorded `misfire` until the claim counted it busy)."""
        if "no_queue_one_tick_waiting_behind_a_run_misfires" in IGNORED:
            return
        misfires = self.sql.fetch(
            """SELECT m.job, extract(epoch FROM m.scheduled_for)::float8 AS at
               FROM tickgate_runs m WHERE m.skip_reason = 'misfire' AND EXISTS (
                   SELECT 1 FROM tickgate_runs r WHERE r.job = m.job AND r.status <> 'skipped'
                   AND r.started_at < m.scheduled_for - interval '0.5 s'
                   AND (r.finished_at IS NULL
                        OR r.finished_at > m.scheduled_for + interval '0.5 s'))"""
        )
        wrong = [
            f"{row['job']} tick {row['at']} waited behind a run and misfired"
            for row in misfires
            if self.definitions.queue_one(row["job"], row["at"])
            and not any(fault > row["at"] - FAULT_SHADOW_SECONDS for fault in self.faults)
        ]
        assert not wrong, wrong

    @invariant()
    def secrets_reach_their_own_origin_only(self) -> None:
        if "secrets_reach_their_own_origin_only" in IGNORED:
            return
        wrong = [
            f"{receipt.path} on {receipt.headers.get('host')} got the secret of {host}"
            for receipt in self.receiver.receipts()
            for host, secret in SECRETS.items()
            if receipt.headers.get("authorization") == secret
            and receipt.headers.get("host", "").rsplit(":", 1)[0] != host
        ]
        assert not wrong, wrong

    @invariant()
    def outputs_stay_within_their_bound(self) -> None:
        """A run whose output is past its job's bound is trimmed within a few retention
        rounds (its row stays: the accounting invariant sees to that). The runs past it
        at the previous check have had a step: those are waited for, the new ones are
        left to the next check (waiting for every run past the bound at each step made
        the soak's 800 steps 40 % longer)."""
        if "outputs_stay_within_their_bound" in IGNORED:
            return
        deadline = time.monotonic() + TRIM_PATIENCE_SECONDS
        while overdue := self.over_bound & self._over_bound():
            assert time.monotonic() < deadline, f"outputs kept past the bound: {sorted(overdue)}"
            time.sleep(0.2)
        self.over_bound = self._over_bound()

    def _over_bound(self) -> set[Any]:
        return {row["run_id"] for row in self.sql.fetch(OVER_BOUND, OUTPUT_BOUND)}

    @invariant()
    def app_ticks_run_once_by_the_app(self) -> None:
        """Each tick the app's processes were handed ran in one of them (or found its job
        paused), never twice, and no replica fired the app's job."""
        if "app_ticks_run_once_by_the_app" in IGNORED:
            return
        rows = self.sql.fetch(
            "SELECT scheduled_for, status, runner FROM tickgate_runs WHERE job = $1", APP_JOB
        )
        assert all(row["runner"].startswith("app:seams:") for row in rows), rows
        twice = {t: a for t, a in self.app_claims.items() if a.count(Claim.CLAIMED) > 1}
        assert not twice, twice
        claimed = {t for t, answers in self.app_claims.items() if Claim.CLAIMED in answers}
        assert {row["scheduled_for"] for row in rows} == claimed, (rows, self.app_claims)

    @invariant()
    def no_lock_is_held_without_its_run(self) -> None:
        if "no_lock_is_held_without_its_run" in IGNORED:
            return
        deadline = time.monotonic() + LOCK_PATIENCE_SECONDS
        while problems := lock_problems(self.sql, lock_key):
            assert time.monotonic() < deadline, problems
            time.sleep(0.2)


def test_every_seam_holds(templates: TemplateDatabases, receiver: Receiver) -> None:
    Seams.templates, Seams.receiver = templates, receiver
    print(f"TICKGATE_SEAMS_SEED={SEED}")  # shown with a failure: replays its examples
    run_state_machine_as_test(
        seed(SEED)(Seams),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            # Each replay of a failing example takes as long as the example did: make
            # check reports the steps as they came (and the seed); SEAMS_SHRINK=1 shrinks.
            phases=PHASES,
        ),
    )


# --- the scheduler's seams on both backends ---------------------------------------------

PORT_STEPS = int(os.environ.get("SEAMS_PORT_STEPS", "8"))
PORT_WINDOW_SECONDS = 2.0  # read again every second: edits race refills and hand-overs


class SchedulerSeams(RuleBasedStateMachine):
    """The scheduler's part of the seams, at its ports: jobs created, edited, paused,
    resumed and deleted through a backend's job writes while two replicas (a `Window`
    and a `Runner` each, both owning every job) fire them. The same machine runs on
    PostgreSQL and on the in-memory fake (harness/memory.py), which the API cannot run
    on, with the same invariants:
    - every nominal tick of every job before its cursor has exactly one outcome
      (`harness.accounting.judge_ticks`, on the rows each backend holds);
    - the gate lets no (job, tick) through twice, whichever replica asks."""

    backend_name: str
    templates: TemplateDatabases

    def __init__(self) -> None:
        super().__init__()
        self.loop = LoopThread()
        self.stack = AsyncExitStack()
        self.database: str | None = None
        self.backend = self.loop.run(self._backend())
        self.pools: list[RecordingPool] = []
        for name in ("a", "b"):
            self.loop.run(self._replica(name))
        self.jobs: set[str] = set()

    async def _backend(self) -> Backend:
        if self.backend_name == "memory":
            return MemoryBackend(wall_clock=True)
        self.database = await self.templates.clone()
        url = with_database(self.templates.server_url, self.database)
        store = await Store.open(url, max_size=2)
        self.stack.push_async_callback(store.close)
        sessions = await self.stack.enter_async_context(lock_pool(url, 4))
        return PostgresBackend(url, store, sessions)

    async def _replica(self, name: str) -> None:
        backend = self.backend
        async with AsyncExitStack() as opening:
            pool = RecordingPool(await opening.enter_async_context(backend.lock_pool(2)))
            runner = await opening.enter_async_context(
                running(backend.ledger, pool, Gates(), Metrics(), runner_id=name)
            )
            window = Window(
                store=backend.window,
                listen=backend.listen,
                runner=runner,
                window_seconds=PORT_WINDOW_SECONDS,
            )
            opening.push_async_callback(window.stop)
            await window.start()
            self.stack.push_async_callback(opening.pop_all().aclose)
        self.pools.append(pool)

    def teardown(self) -> None:
        try:
            self.loop.run(self.stack.aclose())
            if self.database is not None:
                self.loop.run(self.templates.drop(self.database))
        finally:
            self.loop.close()

    def _name(self, index: int, alive: bool = True) -> str | None:
        names = [n for n in NAMES if (n in self.jobs) == alive]
        return names[index % len(names)] if names else None

    def _put(self, name: str, change: Callable[[Job | None, datetime], Job | None]) -> None:
        written = self.loop.run(self.backend.put(name, change))
        note(f"{name}: {written and (written.state, written.schedule, written.overlap)}")

    # -- rules

    @initialize(
        shapes=st.lists(
            st.tuples(st.sampled_from((1, 2)), st.sampled_from(list(Overlap))),
            min_size=len(NAMES),
            max_size=len(NAMES),
        )
    )
    def first_jobs(self, shapes: list[tuple[int, Overlap]]) -> None:
        """A job of each name: every step has ticks to account for from the start."""
        for every, overlap in shapes:
            self.create(0, every, overlap)

    @rule(
        index=st.integers(0, 2),
        every=st.sampled_from((1, 2)),
        overlap=st.sampled_from(list(Overlap)),
    )
    def create(self, index: int, every: int, overlap: Overlap) -> None:
        if (name := self._name(index, alive=False)) is None:
            return
        spec = _port_spec(every, overlap)
        self._put(name, lambda _, now: create_job(name, spec, now))
        self.jobs.add(name)

    @rule(index=st.integers(0, 2), every=st.sampled_from((1, 2)))
    def edit(self, index: int, every: int) -> None:
        if (name := self._name(index)) is None:
            return

        def edited(current: Job | None, now: datetime) -> Job | None:
            if current is None:
                return None
            spec = current.spec().model_copy(update={"schedule": _every(every)})
            return replace_job(current, spec, now)

        self._put(name, edited)

    @rule(index=st.integers(0, 2))
    def pause(self, index: int) -> None:
        if (name := self._name(index)) is not None:
            self._put(name, lambda current, now: current and pause_job(current, now))

    @rule(index=st.integers(0, 2))
    def resume(self, index: int) -> None:
        if (name := self._name(index)) is not None:
            self._put(name, lambda current, now: current and resume_job(current, now))

    @precondition(lambda self: len(self.jobs) > 1)  # a job is left to account for
    @rule(index=st.integers(0, 2))
    def delete(self, index: int) -> None:
        if (name := self._name(index)) is not None:
            self._put(name, lambda _, __: None)
            self.jobs.discard(name)

    @rule(seconds=st.sampled_from((0.5, 1.5)))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    # -- invariants

    @invariant()
    def time_passes(self) -> None:
        """Not a check: the replicas fire between the steps."""
        time.sleep(STEP_SECONDS)

    @invariant()
    def every_tick_has_one_outcome(self) -> None:
        jobs = self.loop.run(self.backend.ledger.get_jobs(sorted(self.jobs)))
        cursors, outcomes = self.loop.run(self.backend.accounted(sorted(self.jobs)))
        problems = judge_ticks(cursors, outcomes, {job.name: ticks_of(job) for job in jobs})
        assert not problems, problems[:10]

    @invariant()
    def no_tick_is_let_through_twice(self) -> None:
        claimed = Counter(
            (job, at)
            for pool in self.pools
            for job, at, outcome in pool.claims
            if outcome is ClaimOutcome.CLAIMED
        )
        twice = [tick for tick, times in claimed.items() if times > 1]
        assert not twice, twice[:10]


def _every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule(kind="interval", every_seconds=seconds)


def _port_spec(every: int, overlap: Overlap) -> JobSpec:
    return JobSpec(schedule=_every(every), task="log", args={"message": "tick"}, overlap=overlap)


@pytest.mark.parametrize("backend_name", ["postgres", "memory"])
def test_the_scheduler_s_seams_hold_on_both_backends(
    templates: TemplateDatabases, backend_name: str
) -> None:
    SchedulerSeams.templates, SchedulerSeams.backend_name = templates, backend_name
    print(f"TICKGATE_SEAMS_SEED={SEED}")
    run_state_machine_as_test(
        seed(SEED)(SchedulerSeams),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=PORT_STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=PHASES,
        ),
    )
