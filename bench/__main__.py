"""`python -m bench [--smoke] [--scenario NAME ...] [--out bench/results]`.

Runs the scenarios in order against one PostgreSQL, writes `<out>/<stem>.json` after each
(so a crash keeps what was measured), then the Markdown report and the plots. The exit
status is 1 when a scenario raised (the harness broke) or Tickgate delivered a tick twice
(a correctness bug); never because something was slow.
"""

import argparse
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import report
from bench.context import Context, Sizes, start_postgres
from bench.loadgen import generator_version
from bench.machine import machine_info, temp_workdir
from bench.scenarios import SCENARIOS
from harness.replicas import REPO


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, under 4 minutes (CI)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"run only these (repeatable): {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a size, e.g. --set steady_rates=1000,2000 --set steady_seconds=30 "
        "(fields of bench.context.Sizes); the results then go to partial-<date>.*",
    )
    return parser


def _stem(smoke: bool, complete: bool) -> str:
    date = time.strftime("%Y-%m-%d")
    if smoke:
        return f"smoke-{date}"
    return date if complete else f"partial-{date}"


def _run_one(ctx: Context, name: str) -> dict[str, Any]:
    began = time.monotonic()
    ctx.say(f"== {name}")
    try:
        result = SCENARIOS[name](ctx)
    except Exception as error:  # noqa: BLE001 - recorded, reported, and fails the run
        ctx.say(f"{name} FAILED: {error!r}")
        result = {"status": "error", "error": repr(error), "traceback": traceback.format_exc()}
    result["wall_seconds"] = round(time.monotonic() - began, 1)
    if result.get("status") == "skipped":
        ctx.say(f"{name} skipped: {result.get('reason')}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = args.scenario or list(SCENARIOS)
    sizes = (Sizes.smoke() if args.smoke else Sizes.full()).overridden(args.set)
    stem = _stem(args.smoke, complete=not args.scenario and not args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = temp_workdir()
    began = time.monotonic()
    document: dict[str, Any] = {"meta": {}, "scenarios": {}}
    postgres = start_postgres(workdir)
    try:
        ctx = Context(args.smoke, sizes, workdir, args.out, postgres, document["scenarios"])
        document["meta"] = _meta(ctx, names)
        ctx.say(f"PostgreSQL {document['meta']['postgres']['version_short']}; work dir {workdir}")
        for name in names:
            document["scenarios"][name] = _run_one(ctx, name)
            report.write_json(document, args.out / f"{stem}.json")
    finally:
        postgres.stop()
    document["meta"]["wall_seconds"] = round(time.monotonic() - began, 1)
    failures = report.failures(document)
    markdown = REPO / "BENCHMARKS.md" if stem == time.strftime("%Y-%m-%d") else None
    written = report.write_all(document, args.out, stem, markdown)
    for path in written:
        print(f"[bench] wrote {path}")
    _finish_workdir(workdir, keep=args.keep or bool(failures))
    for failure in failures:
        print(f"[bench] FAIL: {failure}", file=sys.stderr)
    print(f"[bench] done in {document['meta']['wall_seconds']} s")
    return 1 if failures else 0


def _meta(ctx: Context, names: list[str]) -> dict[str, Any]:
    version = ctx.postgres.version()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "smoke": ctx.smoke,
        "scenarios": names,
        "sizes": ctx.sizes.__dict__,
        "machine": machine_info(),
        "postgres": {
            "version": version,
            "version_short": " ".join(version.split()[:2]),
            "embedded": ctx.postgres.embedded,
            "settings": ctx.postgres.settings(),
        },
        "replicas": {
            "count": 3,
            "env": "TICKGATE_LOG_LEVEL=WARNING, TICKGATE_LOG_FORMAT=json, other settings default",
            "ownership": "on (the default) in every scenario",
        },
        "load_generator": generator_version(),
    }


def _finish_workdir(workdir: Path, *, keep: bool) -> None:
    if keep:
        print(f"[bench] logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
