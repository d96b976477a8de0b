"""The soak's report charges each window's skips to the faults whose span it overlaps,
so the skips of a kill, a restart or a CPU spell are told apart from the policy's."""

from typing import Any

from reliability.soak.attribution import AFTERMATH_SECONDS, skips_by_fault
from reliability.soak.reliability import _skips_table


def window(start: int, **reasons: int) -> dict[str, Any]:
    return {"start": start, "end": start + 60, "skip_reasons": reasons}


def test_each_window_s_skips_go_to_the_faults_it_overlaps_and_the_rest_are_quiet() -> None:
    events = [
        {"at": 100.0, "kind": "kill", "slot": 1},
        {"at": 110.0, "kind": "ready", "slot": 0},  # another slot's: does not end the kill
        {"at": 140.0, "kind": "ready", "slot": 1},
        {"at": 400.0, "kind": "pg_stop"},
        {"at": 430.0, "kind": "cluster_ready"},
    ]
    hot = [{"at": float(t), "box_cpu_percent": 99.0} for t in (600, 610, 620)]
    samples = [{"at": 590.0, "box_cpu_percent": 30.0}, *hot, {"at": 700.0, "box_cpu_percent": 1.0}]
    document = {
        "events": events,
        "samples": samples,
        "windows": [
            window(0, overlap=3),
            window(120, overlap=40),  # the kill's span runs to 140 + the aftermath
            window(300, overlap=2),
            window(420, misfire=7, overlap=1),
            window(600, overlap=500),
        ],
    }
    assert 120 + 60 > 140 + AFTERMATH_SECONDS > 120
    assert skips_by_fault(document) == {
        "cpu_saturated": {"overlap": 500},
        "kill": {"overlap": 40},
        "pg_restart": {"misfire": 7, "overlap": 1},
        "quiet": {"overlap": 3 + 2},
    }
    table = _skips_table({"skips_by_fault": skips_by_fault(document)})
    assert "| cpu_saturated | 0 | 500 |" in table


def test_overlap_skips_are_split_by_the_run_they_were_behind() -> None:
    behind = {"run in progress": 5, "run gone": 2}
    document = {
        "events": [],
        "samples": [],
        "windows": [window(0, overlap=7) | {"overlap_behind": behind}],
    }
    assert skips_by_fault(document) == {
        "quiet": {"overlap": 7, "overlap: run in progress": 5, "overlap: run gone": 2}
    }
