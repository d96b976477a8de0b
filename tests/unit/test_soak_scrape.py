"""The soak judges the `/metrics` scrape between two crowds of ticks (half a second past
the whole second): each incarnation's median under the bound."""

from typing import Any

from reliability.soak.verdicts import SCRAPE_BETWEEN_BOUND_MS, scrape_between


def document(between: list[list[float | None]]) -> dict[str, Any]:
    samples = [
        {"t": 10.0 * n, "runner": ["a-0", "b-0"], "scrape_mid_ms": pair}
        for n, pair in enumerate(between, 1)
    ]
    slots = [
        {"slot": 0, "incarnations": [{"runner_id": "a-0"}]},
        {"slot": 1, "incarnations": [{"runner_id": "b-0"}]},
    ]
    return {"meta": {"minutes": 1, "began": 0.0}, "samples": samples, "slots": slots}


def test_each_incarnation_s_median_is_judged_and_a_missing_sample_is_left_out() -> None:
    slow = SCRAPE_BETWEEN_BOUND_MS + 50
    judged = scrape_between(document([[20.0, slow], [None, slow], [40.0, 10.0]]))
    assert judged["incarnations"] == {
        "a-0": {"judged": True, "median": 30.0, "ok": True},
        "b-0": {"judged": True, "median": slow, "ok": False},
    }
    assert judged["ok"] is False


def test_a_run_without_the_samples_is_not_judged() -> None:
    old = document([[1.0, 2.0]])
    for sample in old["samples"]:
        del sample["scrape_mid_ms"]
    assert scrape_between(old) == {"incarnations": {}, "ok": None}
