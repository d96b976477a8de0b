"""Commit subjects of at most 72 characters, the reasons in the body.

`python -m tools.subjects MESSAGE_FILE` checks one message, as git's `commit-msg` hook
(`make hooks` installs it): a subject over the limit, or a body not parted from it by a
blank line, refuses the commit. `python -m tools.subjects` with no argument lists the
commits since `HABIT_SINCE` (the last one over the limit, when the habit began) whose
subject is over it; `make check` prints them. It warns and never fails there: a landed
subject cannot be changed without rewriting history.
"""

import subprocess
import sys
from pathlib import Path

LIMIT = 72
HABIT_SINCE = "ee0e995"  # the last subject over the limit, 2026-12-06


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (comments, as git strips them, ignored)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    subject = lines[0] if lines else ""
    found = []
    if not subject.strip():
        found.append("the subject is empty")
    if len(subject) > LIMIT:
        found.append(f"the subject has {len(subject)} characters, over {LIMIT}")
    if len(lines) > 1 and lines[1].strip():
        found.append("the body must be parted from the subject by a blank line")
    return found


def long_subjects_since(commit: str) -> list[str]:
    """The commits after `commit` whose subject is over the limit, newest first."""
    log = subprocess.run(  # noqa: S603 - git, with our own constant range
        ["git", "log", "--format=%h %s", f"{commit}..HEAD"],  # noqa: S607 - git from PATH
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in log.splitlines() if len(line.partition(" ")[2]) > LIMIT]


def main(argv: list[str]) -> int:
    if argv:
        found = problems(Path(argv[0]).read_text(encoding="utf-8"))
        for problem in found:
            print(f"commit message: {problem}", file=sys.stderr)
        return 1 if found else 0
    try:
        long = long_subjects_since(HABIT_SINCE)
    except (OSError, subprocess.CalledProcessError):
        print(f"commit subjects: no history since {HABIT_SINCE} here; not checked")
        return 0
    for line in long:
        print(f"warning: commit subject over {LIMIT} characters: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
