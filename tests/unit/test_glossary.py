"""One word per idea (#43): every word the fire path's names are made of is either a row
of the glossary in docs/concepts.md, once, or plain English listed here. A new name
built of a new word of the trade fails this test until the word has its row (or is
shown to be plain), so the glossary keeps up with the code."""

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"
CONCEPTS = ROOT / "docs" / "concepts.md"
# Where the fire path's names live: the scheduler, and the ports it talks to the store by.
NAMED = [*sorted((ROOT / "service" / "scheduler").glob("*.py")), ROOT / "service/store/ports.py"]

# Words of the names that mean what they mean in English (or in Python, asyncio,
# HTTP, PostgreSQL and Prometheus): no row of the glossary needs to explain them.
PLAIN = frozenset(
    re.findall(
        r"\w+",
        """a aclose account acquire add after all alone and any apply args ask asked assign at
    back background backfill backoff batch begin bounded but by bytes cancel change check
    chars clock close cluster context count counted cursors decide decided
    delay delete deleted deliver demand discard document drop either elsewhere
    end error every executor expire exposition fail failure finish flight follow for forever
    forget found free get give go gone guarded healthy hold hook http idle ignore in
    instant job key land leave left limit line listen listener live liveness load
    local lock log logger look loop lost maintain margin max may membership message metrics
    missed mixed monotonic most name no not note nothing notify of offer offset ok oldest on
    once one order output over page pause peers per poll post probe process progress prune
    public queue readiness read release relisten replica report reset result retry round
    rejoin scheduled scheduler seconds see send sender session since slack slice spawn
    spent split sql start startup status still stop store stored submit synced t take task
    the through time timeout to tracing trigger trip true tzdata undeliverable unlock
    unrecorded unrun until url wait way webhook join tally up which with accepting action
    active age already answer answered awaits before begun booked budget cancelled capped
    current definition elapsed entry exists extra facts fill first fits fn got headers id
    inactive its kept last late level longest made moved next now ours overflow parsed
    period pid policy pool ran reason requested request reserve response rest resumable
    returned running same seen sent shown shutdown size skipped stopped sync taken
    terminate text undecided unnoted update warn while why without work alive complete
    entries open refresh unfinished
    """,
    )
)


def glossary() -> list[str]:
    """The words of the glossary's table, in order."""
    text = CONCEPTS.read_text()
    table = text[text.index("**Glossary.**") :].split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    return [row.split("|")[1].strip() for row in rows]


def _stems(word: str) -> set[str]:
    """The forms a word of a name may take of a glossary word: claims, claimed, claiming."""
    stems = {word}
    for ending in ("ing", "ed", "es", "s", "d", "er", "ers"):
        if word.endswith(ending) and len(word) > len(ending) + 2:
            stems |= {word[: -len(ending)], word[: -len(ending)] + "e"}
    for ending in ("ied", "ies"):
        if word.endswith(ending):
            stems.add(word[:-3] + "y")
    return stems


def _words(name: str) -> list[str]:
    parts = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+", name)
    return [part.lower() for part in parts]


def _names(path: Path) -> Iterator[str]:
    """Every name a module defines: classes, functions, methods, constants, fields."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Assign):
            yield from (t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id


def code_words() -> Counter[str]:
    return Counter(
        word
        for path in NAMED
        for name in _names(path)
        if not name.startswith("__")
        for word in _words(name)
    )


def test_each_glossary_word_has_one_row() -> None:
    twice = [word for word, count in Counter(glossary()).items() if count > 1]
    assert twice == []


def test_every_word_of_the_fire_paths_names_is_in_the_glossary_or_plain() -> None:
    known = {part for word in glossary() for part in word.split()} | PLAIN
    unknown = sorted(word for word in code_words() if not _stems(word) & known)
    assert unknown == [], "add each to the glossary of docs/concepts.md, or to PLAIN"


def test_every_glossary_word_names_something_in_the_code() -> None:
    """A word renamed in the code leaves no row behind."""
    words = code_words()
    named = {stem for word in words for stem in _stems(word)}
    source = "\n".join(path.read_text() for path in SERVICE.rglob("*.py")).lower()
    missing = [
        word
        for word in glossary()
        if not (set(word.split()) <= named or re.search(rf"\b{word}\b", source))
    ]
    assert missing == []


def test_plain_words_are_not_glossary_words() -> None:
    """A word is either of the trade or plain, never both."""
    assert sorted(PLAIN & set(glossary())) == []


# Words that had a second meaning (#43), and the modules whose names may not use them
# for it: the job's start and end are its bounds, not a window; the window fires its
# ticks and files jobs (a HANDOVER is a bucket's, a held lock a session's); a queue_one
# tick waits in a slot (pending is a delivery's status); an orphan is resumed (a
# takeover is the audit's); a chore is taken (a claim is a tick's).
SECOND_MEANINGS = {
    r"window": ["service/domain/jobs.py"],
    r"hand_over|handed": ["service/scheduler/window.py", "service/scheduler/runner.py"],
    r"held": ["service/scheduler/window.py", "service/store/values.py"],
    r"pending": ["service/scheduler", "service/store/ports.py", "harness/memory.py"],
    r"take_?over|taken_?over": ["service/scheduler/orphans.py"],
    r"claim": ["service/store/chores.py", "service/scheduler/overdue.py"],
}


def test_no_word_is_used_for_its_second_meaning() -> None:
    used = [
        f"{path.relative_to(ROOT)}: {name}"
        for word, places in SECOND_MEANINGS.items()
        for place in places
        for path in ([ROOT / place] if place.endswith(".py") else (ROOT / place).glob("*.py"))
        for name in _names(path)
        if re.search(word, name, re.IGNORECASE)
    ]
    assert used == []
