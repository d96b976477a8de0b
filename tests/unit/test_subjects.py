"""The commit-message habit (tools/subjects.py): subjects of at most 72 characters, the
body parted from them by a blank line."""

from tools.subjects import LIMIT, problems


def test_a_subject_at_the_limit_with_a_body_after_a_blank_line_passes() -> None:
    assert problems("x" * LIMIT + "\n\nWhy, with the figures.\n") == []


def test_a_subject_over_the_limit_is_refused_with_its_length() -> None:
    assert problems("x" * (LIMIT + 1)) == [f"the subject has {LIMIT + 1} characters, over 72"]


def test_a_body_glued_to_the_subject_or_an_empty_subject_is_refused() -> None:
    assert problems("Subject\nbody") == ["the body must be parted from the subject by a blank line"]
    assert problems("# only git's comments\n") == ["the subject is empty"]
