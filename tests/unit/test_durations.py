"""`make test`'s slowest tests are named across its two pytest sessions (tools/durations.py)."""

from pathlib import Path

from tools.durations import render


def junit(path: Path, cases: dict[str, float]) -> Path:
    lines = [
        f'<testcase classname="tests.{name.split("::")[0]}" name="{name.split("::")[1]}"'
        f' time="{seconds}" />'
        for name, seconds in cases.items()
    ]
    path.write_text(
        f'<testsuites><testsuite name="pytest">{"".join(lines)}</testsuite></testsuites>'
    )
    return path


def test_the_slowest_of_both_sessions_are_named_slowest_first(tmp_path: Path) -> None:
    fast = junit(tmp_path / "fast.xml", {"unit.test_a::test_quick": 0.5, "unit.test_a::test_db": 9})
    slow = junit(
        tmp_path / "slow.xml",
        {"acceptance.test_b::test_cluster": 40, "acceptance.test_b::test_cli": 2},
    )

    assert render([fast, slow], 3).splitlines() == [
        "3 slowest of 4 tests (52 s of test time in all):",
        "   40.00s tests/acceptance/test_b.py::test_cluster",
        "    9.00s tests/unit/test_a.py::test_db",
        "    2.00s tests/acceptance/test_b.py::test_cli",
    ]
