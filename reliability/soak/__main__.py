"""`python -m reliability.soak [--minutes 30] [--jobs 2000] [--churn 10]`, or `--report FILE`.

A run: the embedded PostgreSQL, the receiver, a TCP proxy, three replicas (the third
through the proxy, all with `TICKGATE_RUN_HISTORY=50` and `TICKGATE_RECONCILE_SECONDS=10`
so retention bites within minutes); the jobs in one bulk `PUT`; then, for `--minutes`,
the churn, the faults, the sampler and the accountant side by side. Then the last
windows are judged, the whole run's deliveries checked for duplicates, and the results
written: `bench/results/soak-<date>.json` (`soak-<date>-<N>min` for another length),
its PNG plot beside it, and the soak section of RELIABILITY.md. The exit status is 1
when a check failed or the harness broke.

`--report FILE` renders the plot and the RELIABILITY.md section of an earlier run again
(re-judging it from the JSON; `--note TEXT` adds a line under the table).
"""

import argparse
import asyncio
import json
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

from bench.context import EMBEDDED_SETTINGS
from bench.jobs import apply_jobs
from bench.machine import machine_info, temp_workdir
from harness.accounting import first_arrivals
from harness.cluster import Slot, start_slots
from harness.postgres import EmbeddedServer, execute, with_database
from harness.receiver import ReceiverProcess
from harness.replicas import REPO, stop_all, wait_ready
from harness.tcpproxy import TcpProxy, Upstream
from reliability.soak import plot, reliability, verdicts
from reliability.soak.faults import EventLog, Faults, timeline
from reliability.soak.plan import GRACE_SECONDS, Churn, Fleet, fires_per_second, initial_jobs
from reliability.soak.sampler import Sampler
from reliability.soak.windows import MARGIN_SECONDS, SETTLE_SECONDS, Accountant

RUN_HISTORY = 50
RECONCILE_SECONDS = 10
DATABASE = "soak"
REPLICA_ENV = {
    "TICKGATE_RUN_HISTORY": str(RUN_HISTORY),
    "TICKGATE_RECONCILE_SECONDS": str(RECONCILE_SECONDS),
}
LOAD_SECONDS = 10.0  # after the bulk apply, before the run's clock starts
PROGRESS_SECONDS = 60.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reliability.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--churn", type=float, default=10.0, help="API changes per second")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument(
        "--reliability",
        type=Path,
        default=REPO / "RELIABILITY.md",
        help="the Markdown file whose soak section is (re)written",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="render an earlier run's plot and section again, then exit",
    )
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        help="with --report: a line shown under the table (repeatable)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    return parser


def window_seconds(minutes: float) -> int:
    return int(min(60, max(15, 60 * minutes / 30)))


def _stem(minutes: float) -> str:
    date = time.strftime("%Y-%m-%d")
    return f"soak-{date}" if minutes == 30 else f"soak-{date}-{minutes:g}min"


def _say(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------- checks at the end

_LEDGER_DUPLICATES = """SELECT count(*) FROM (SELECT 1 FROM tickgate_runs
    GROUP BY job, scheduled_for HAVING count(*) > 1) AS twice"""
_ATTEMPTS = """SELECT t.job, t.at, r.attempts
    FROM unnest($1::text[], $2::float8[]) AS t (job, at)
    LEFT JOIN tickgate_runs r ON r.job = t.job AND r.scheduled_for = to_timestamp(t.at)"""


async def _final_ledger(
    url: str, repeated: dict[tuple[str, float], int]
) -> tuple[int, dict[tuple[str, float], int]]:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        duplicates = await connection.fetchval(_LEDGER_DUPLICATES, timeout=120)
        keys = list(repeated)
        rows = await connection.fetch(
            _ATTEMPTS, [k[0] for k in keys], [k[1] for k in keys], timeout=120
        )
    finally:
        await connection.close()
    return int(duplicates), {(row["job"], row["at"]): row["attempts"] for row in rows}


def final_checks(url: str, receiver: ReceiverProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole ledger's duplicate (job, tick) rows, and the whole run's deliveries of a
    (job, tick) beyond the first, each explained or not by its ledger row's attempts."""
    receipts = receiver.receipts()
    counts = first_arrivals(receipts)[1]
    repeated = {key: count for key, count in counts.items() if count > 1}
    duplicates, attempts = asyncio.run(_final_ledger(url, repeated))
    unexplained = {
        key: count for key, count in repeated.items() if (attempts.get(key) or 0) < count
    }
    receiver_figures = {
        "receipts": len(receipts),
        "distinct_ticks": len(counts),
        "duplicates": sum(count - 1 for count in repeated.values()),
        "duplicates_unexplained": sum(count - 1 for count in unexplained.values()),
        "examples": [
            f"{job} @ {tick:.0f} x{n} (ledger attempts {attempts.get((job, tick))})"
            for (job, tick), n in list(repeated.items())[:10]
        ],
    }
    return {"ledger_duplicate_ticks": duplicates}, receiver_figures


# ---------------------------------------------------------------------------- the run


def cluster_ready(slots: list[Slot]) -> Callable[[float], bool]:
    """Whether every live slot answers /readyz within the deadline (seconds)."""

    def ready(deadline: float) -> bool:
        live = [slot.replica for slot in slots if slot.alive and slot.replica is not None]
        try:
            wait_ready(live, "/readyz", deadline)
        except AssertionError:
            return False
        return True

    return ready


def _progress(sampler: Sampler, accountant: Accountant, fleet: Fleet, began: float) -> None:
    samples = sampler.snapshot()
    last = samples[-1] if samples else {}
    windows = accountant.windows
    problems = sum(
        w.http["succeeded_not_delivered"] + w.http["duplicates"] + w.http["delivered_but_skipped"]
        for w in windows
    )
    _say(
        f"+{time.time() - began:5.0f}s jobs {fleet.live_count()} rss {last.get('rss_mib')} "
        f"rows {last.get('ledger_rows')} p99 {last.get('lateness_p99_ms')} ms "
        f"runs/s {last.get('runs_per_s')} scrape {last.get('scrape_ms')} ms; "
        f"windows {len(windows)}, unaccounted {sum(w.unaccounted for w in windows)}, "
        f"http problems {problems}"
    )


def run(args: argparse.Namespace) -> int:
    workdir = temp_workdir()
    stem = _stem(args.minutes)
    args.out.mkdir(parents=True, exist_ok=True)
    _say(f"work dir {workdir}; results {args.out / stem}.json")
    database = EmbeddedServer(workdir / "pg", EMBEDDED_SETTINGS, delete=False)
    asyncio.run(execute(database.url, f"CREATE DATABASE {DATABASE}"))
    url = with_database(database.url, DATABASE)
    receiver = ReceiverProcess.start(workdir / "receiver.log")
    proxy = TcpProxy(Upstream.of_dsn(url)).start()
    slots = [Slot("soak", i, url, workdir, REPLICA_ENV) for i in range(2)]
    slots.append(Slot("soak", 2, proxy.dsn_for(url), workdir, REPLICA_ENV, proxied=True))
    document: dict[str, Any] = {}
    harness_errors: list[str] = []
    return_code = 1
    try:
        start_slots(slots)
        document = soak(
            args,
            slots=slots,
            database=database,
            receiver=receiver,
            proxy=proxy,
            harness_errors=harness_errors,
        )
    except Exception as error:
        harness_errors.append(repr(error))
        _say(f"harness failed: {error!r}")
        raise
    finally:
        stop_all([slot.replica for slot in slots if slot.replica is not None])
        proxy.close()
        receiver.stop()
        database.close()
        if document:
            document["slots"] = [slot.as_dict() for slot in slots]
            return_code = finish(document, args, stem)
        keep = args.keep or not document or document.get("verdicts", {}).get("ok") is not True
        if keep:
            _say(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return return_code


def soak(
    args: argparse.Namespace,
    *,
    slots: list[Slot],
    database: EmbeddedServer,
    receiver: ReceiverProcess,
    proxy: TcpProxy,
    harness_errors: list[str],
) -> dict[str, Any]:
    url = with_database(database.url, DATABASE)
    fleet = Fleet()
    jobs = initial_jobs(args.jobs, receiver.url)
    asked = time.time()
    apply_jobs(slots[0].url, jobs)
    for body in jobs:
        fleet.created(body, asked, time.time())
    began = math.ceil(time.time() + LOAD_SECONDS)
    time.sleep(max(0.0, began - time.time()))
    length = args.minutes * 60
    end = began + length
    log = EventLog(began)
    window = window_seconds(args.minutes)
    planned = timeline(args.minutes, killable=[0, 1])
    accountant = Accountant(fleet, url, receiver, began, window, faults=log.session_faults)
    accountant.end = int(end)
    sampler = Sampler(slots, url, began)
    churn = Churn(
        fleet,
        lambda: [s.url for s in slots],
        receiver.url,
        rate=args.churn,
        deadline=end,
        target_jobs=args.jobs,
    )
    faults = Faults(
        planned,
        began=began,
        slots=slots,
        database=database,
        proxy=proxy,
        log=log,
        cluster_ready=cluster_ready(slots),
    )
    log.note("start", jobs=len(jobs), minutes=args.minutes)
    for thread in (sampler, accountant, churn, faults):
        thread.start()
    while time.time() < end:
        time.sleep(min(PROGRESS_SECONDS, max(0.0, end - time.time())))
        _progress(sampler, accountant, fleet, began)
    churn.join(60)
    log.note("churn_stopped", **fleet.summary())
    faults.join(180)
    if faults.is_alive() or faults.error is not None:
        harness_errors.append(f"faults: {faults.error!r}" if faults.error else "faults overran")
        faults.stop()
    accountant.join(window + SETTLE_SECONDS + 180)
    if accountant.is_alive():
        harness_errors.append("the accountant did not judge every window in time")
        accountant.stop()
    sampler.stop()
    sampler.join(30)
    log.note("judged", windows=len(accountant.windows))
    final, receiver_figures = final_checks(url, receiver)
    samples = sampler.snapshot()
    return {
        "meta": _meta(args, began=began, end=end, window=window, planned=planned, samples=samples),
        "events": log.snapshot(),
        "samples": samples,
        "windows": [w.as_dict() for w in accountant.windows],
        "accounting_errors": accountant.errors,
        "churn": churn.stats.summary(),
        "fleet": fleet.summary(),
        "receiver": receiver_figures,
        "final": final,
        "harness_errors": harness_errors,
        "notes": [],
    }


def _meta(
    args: argparse.Namespace,
    *,
    began: float,
    end: float,
    window: int,
    planned: list[Any],
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    machine = machine_info()
    cpu = [s["box_cpu_percent"] for s in samples if s.get("box_cpu_percent") is not None]
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "minutes": args.minutes,
        "jobs": args.jobs,
        "churn_per_s": args.churn,
        "nominal_fires_per_s": round(fires_per_second(args.jobs), 1),
        "began": began,
        "end": end,
        "window_s": window,
        "settle_s": SETTLE_SECONDS,
        "margin_s": MARGIN_SECONDS,
        "warmup_s": args.minutes * 60 / 6,
        "retention_horizon_s": GRACE_SECONDS + 300 + RECONCILE_SECONDS,
        "replica_env": REPLICA_ENV,
        "replica_env_text": ", ".join(f"{k}={v}" for k, v in REPLICA_ENV.items())
        + ", TICKGATE_OWNERSHIP=on (default)",
        "faults_planned": [p.__dict__ for p in planned],
        "machine": machine,
        "git_commit": machine["git_commit"],
        "median_box_cpu_percent": statistics.median(cpu) if cpu else None,
        "results": "",
    }


def finish(document: dict[str, Any], args: argparse.Namespace, stem: str) -> int:
    path = args.out / f"{stem}.json"
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    document["meta"]["results"] = str(shown)
    return write_outputs(document, path, args.reliability)


def write_outputs(document: dict[str, Any], path: Path, markdown: Path) -> int:
    document["verdicts"] = verdicts.judge(document)
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    picture = plot.draw(document, path.with_suffix(".png"))
    reliability.write_section(markdown, reliability.render(document, picture, markdown))
    for line in (f"wrote {path}", f"plot {picture}", f"section in {markdown}"):
        _say(line)
    v = document["verdicts"]
    _say(
        json.dumps(
            {k: v[k] for k in ("duplicates", "accounted", "ledger", "lateness")}, default=str
        )[:3000]
    )
    _say(f"rss {json.dumps(v['rss'])}")
    _say(f"scrape {json.dumps(v['scrape'])}")
    if not v["ok"]:
        print(f"[soak] FAIL: {', '.join(v['failed'])}", file=sys.stderr)
    return 0 if v["ok"] else 1


def report_only(args: argparse.Namespace) -> int:
    document = json.loads(args.report.read_text())
    if args.note:
        document["notes"] = list(document.get("notes") or []) + args.note
    return write_outputs(document, args.report, args.reliability)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report:
        return report_only(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
