"""Static checks of the deployment artefacts: the Dockerfile and the Helm chart.

Shared here: the repository paths and a small Dockerfile reader (no Docker needed).
"""

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART_DIR = ROOT / "helm" / "tickgate"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper-cased, e.g. "RUN"
    args: str  # the rest of the logical line, continuations joined


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """Every ENV of the stage, in order (the `key=value ...` and `key value` forms)."""
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            words = shlex.split(instruction.args)
            if words and "=" not in words[0]:
                values[words[0]] = instruction.args.split(None, 1)[1].strip()
                continue
            for word in words:
                key, _, value = word.partition("=")
                values[key] = value
        return values


def instructions(text: str) -> list[Instruction]:
    """The logical instructions of a Dockerfile: comments dropped, `\\` continuations joined.

    Heredocs are not supported (the Dockerfile uses none)."""
    result: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        keyword, _, args = logical.partition(" ")
        result.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return result


def stages(text: str) -> list[Stage]:
    """The build stages, each with the instructions after its FROM."""
    found: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(base=words[0], name=name))
        elif found:
            found[-1].instructions.append(instruction)
    return found


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON (exec) form of CMD/ENTRYPOINT; fails on the shell form."""
    parsed = json.loads(instruction.args)
    assert isinstance(parsed, list), f"{instruction.keyword} is not in exec form"
    assert all(isinstance(word, str) for word in parsed)
    return parsed


def final_stage() -> Stage:
    return stages(DOCKERFILE.read_text())[-1]


def exposed_ports(stage: Stage) -> set[int]:
    ports: set[int] = set()
    for instruction in stage.all("EXPOSE"):
        for word in instruction.args.split():
            port, _, protocol = word.partition("/")
            assert protocol in {"", "tcp"}, word
            ports.add(int(port))
    return ports


def user_ids(stage: Stage) -> tuple[int, int | None]:
    """The numeric uid (and gid, if given) of the stage's last USER."""
    user = stage.last("USER")
    assert user is not None, "the final stage sets no USER, so it runs as root"
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit(), f"USER {user.args!r} is not numeric (runAsNonRoot needs a uid)"
    assert not gid or gid.isdigit(), f"USER {user.args!r}: the group is not numeric"
    return int(uid), int(gid) if gid else None
