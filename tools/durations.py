"""The slowest tests of a whole suite run in several pytest sessions.

`make test` runs the fast tests and the slow folders as two pytest sessions (each on
its own number of xdist workers), so neither session's `--durations` names the suite's
slowest. Each session writes a JUnit XML report; `python -m tools.durations N a.xml ...`
prints the N slowest tests across them, each with its time (setup, call and teardown, as
the report counts it) and the sessions' total.
"""

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree


@dataclass(frozen=True)
class Timed:
    test: str
    seconds: float


def timed_tests(report: Path) -> list[Timed]:
    """Every test case of a JUnit XML report, named as pytest names it (path::name)."""
    cases = ElementTree.parse(report).iter("testcase")  # noqa: S314 - our own report
    return [Timed(_node_id(case), float(case.get("time", 0))) for case in cases]


def _node_id(case: ElementTree.Element) -> str:
    module = case.get("classname", "").replace(".", "/")
    return f"{module}.py::{case.get('name', '')}"


def slowest(tests: Iterable[Timed], count: int) -> list[Timed]:
    return sorted(tests, key=lambda timed: timed.seconds, reverse=True)[:count]


def render(reports: Sequence[Path], count: int) -> str:
    tests = [timed for report in reports for timed in timed_tests(report)]
    lines = [f"{timed.seconds:8.2f}s {timed.test}" for timed in slowest(tests, count)]
    total = sum(timed.seconds for timed in tests)
    heading = f"{count} slowest of {len(tests)} tests ({total:,.0f} s of test time in all):"
    return "\n".join([heading, *lines])


def main(argv: Sequence[str]) -> None:
    count, *reports = argv
    print(render([Path(report) for report in reports], int(count)))


if __name__ == "__main__":
    main(sys.argv[1:])
