"""`python -m bench.versus [--baseline REF] [--smoke] [--out DIR] [--render VERSUS.json]
[--before VERSUS.json]`: issue #22's scale table, measured side by side in one run.

The baseline commit (by default `versus.json`'s, the one the issue was filed against) is
cloned into a scratch directory with a venv of its own; the table's scenarios run there
first, under this harness (`TICKGATE_SERVED_TREE` makes the replicas that tree's), then
the same scenarios here. Each run is a plain `python -m bench` with the same sizes; this
module only judges the two documents with the rows' checks (`versus.json` names rows of
`bench/targets.json`) and writes `<out>/versus-<date>.md` and `.json`, the section of
BENCHMARKS.md between its markers, and the current table again (`bench/current.py`).
`--before` measures this checkout only and takes the baseline's figures from a stored
run, which the table then dates.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import current
from bench.reading import mark, replaced, table
from bench.targets import CHECKS, named, why_not
from harness.replicas import REPO

ROWS = Path(__file__).with_name("versus.json")
MARKERS = ("<!-- versus:begin -->", "<!-- versus:end -->")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__)
    parser.add_argument("--baseline", help="the commit to measure against")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the harness only")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="VERSUS.json",
        help="measure nothing: judge a stored run again (after editing versus.json's rows)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        metavar="VERSUS.json",
        help="measure this checkout only; the baseline's figures are this stored run's",
    )
    return parser


def checkout(ref: str, into: Path) -> Path:
    """A clone of this repository at `ref`, with its own venv (`make .venv/.bench`)."""
    tree = into / "baseline"
    subprocess.run(["git", "clone", "-q", str(REPO), str(tree)], check=True)  # noqa: S603,S607
    subprocess.run(["git", "-C", str(tree), "checkout", "-q", ref], check=True)  # noqa: S603,S607
    subprocess.run(["make", "-C", str(tree), ".venv/.bench"], check=True)  # noqa: S603,S607
    return tree


def measure(rows: dict[str, Any], out: Path, smoke: bool, tree: Path | None) -> dict[str, Any]:
    """One `python -m bench` of the rows' scenarios, serving `tree` (None: this one)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "bench", "--out", str(out)]
    command += [f"--scenario={name}" for name in rows["scenarios"]]
    command += [] if smoke else [f"--set={setting}" for setting in rows["set"]]
    command += ["--smoke"] if smoke else []
    env = os.environ | ({"TICKGATE_SERVED_TREE": str(tree)} if tree else {})
    subprocess.run(command, env=env, cwd=REPO, check=False)  # noqa: S603 - our own bench
    [results] = sorted(out.glob("*.json"))
    document: dict[str, Any] = json.loads(results.read_text())
    return document


def section(
    rows: dict[str, Any], before: dict[str, Any], after: dict[str, Any], reused: bool = False
) -> list[str]:
    """The table: each row judged on the baseline's figures and on this commit's
    (`reused`: the baseline's from an earlier run, which the intro dates)."""
    lines = []
    for row in named(rows["rows"]):
        check = CHECKS[row["check"]]
        then, was = check(before, **row.get("args", {}))
        now, met = check(after, **row.get("args", {}))
        if after["meta"].get("smoke"):
            was = met = None
        cells = (row["measure"], row["target"], f"{then} {mark(was)}", f"{now} {mark(met)}")
        lines.append((*cells, why_not(row, met)))
    commits = [doc["meta"]["machine"].get("git_commit") or "?" for doc in (before, after)]
    header = ["measure", "target", f"before (`{commits[0]}`)", f"after (`{commits[1]}`)"]
    header.append("why not")
    when, then = after["meta"]["date"], before["meta"]["date"]
    smoke = " (smoke sizes: not judged)" if after["meta"].get("smoke") else ""
    earlier = f"; the baseline's figures are from the run of {then}" if reused else ""
    intro = f"{rows['intro']} This run: {when}{earlier}{smoke}."
    return [f"## {rows['title']}", "", intro, "", *table(header, lines)]


def measure_both(rows: dict[str, Any], baseline: str, smoke: bool) -> dict[str, Any]:
    """The rows' scenarios on `baseline`, then on this checkout: both documents."""
    with tempfile.TemporaryDirectory(prefix="tickgate-versus-") as scratch:
        tree = checkout(baseline, Path(scratch))
        before = measure(rows, Path(scratch) / "before", smoke, tree)
        after = measure(rows, Path(scratch) / "after", smoke, None)
    return {"before": before, "after": after}


def measured(rows: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Both documents: measured side by side, or this checkout's against `--before`'s."""
    if not args.before:
        return measure_both(rows, args.baseline or rows["baseline"], args.smoke)
    before = json.loads(args.before.read_text())["before"]
    with tempfile.TemporaryDirectory(prefix="tickgate-versus-") as scratch:
        after = measure(rows, Path(scratch), args.smoke, None)
    return {"before": before, "after": after, "reused": True}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rows: dict[str, Any] = json.loads(ROWS.read_text())
    if args.render:
        both = json.loads(args.render.read_text())
        stem, args.out = args.render.stem, args.render.parent
    else:
        both = measured(rows, args)
        # A run against stored baseline figures never overwrites the run they came from.
        again = f"-{time.strftime('%H%M')}" if args.before else ""
        stem = f"{'smoke-' if args.smoke else ''}versus-{time.strftime('%Y-%m-%d')}{again}"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.json").write_text(json.dumps(both))
    lines = section(rows, both["before"], both["after"], both.get("reused", False))
    (args.out / f"{stem}.md").write_text("\n".join(lines))
    if not both["after"]["meta"].get("smoke"):
        current.PAGE.write_text(replaced(current.PAGE.read_text(), MARKERS, lines))
        current.refresh()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
