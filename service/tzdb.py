"""The time-zone database this process computes ticks with.

A tick's instant depends on it: when a country changes its offset or its daylight-saving
rules, the ticks of every job in its zones move. Replicas that read different releases put
those ticks at different instants, so a release is reported (readiness, a metric, each
member's row) and a mix of them is warned about.

Python's zoneinfo reads the operating system's database first (`zoneinfo.TZPATH`) and
falls back to the `tzdata` package. The image sets `PYTHONTZPATH` empty, so it uses the
package, whose release requirements/runtime.lock pins (the image installs from it).
"""

import zoneinfo
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# A zone every database has: where it is found, zoneinfo reads every zone from there.
_PROBE_ZONE = "Etc/UTC"
_VERSION_PREFIX = "# version "


@dataclass(frozen=True)
class TzDatabase:
    version: str  # the IANA release, e.g. "2025b"; "unknown" if the files do not say
    source: str  # a directory of zoneinfo.TZPATH, or "tzdata package"

    def __str__(self) -> str:
        return f"{self.version} ({self.source})"


def tz_database() -> TzDatabase:
    """The database zoneinfo reads here."""
    for directory in map(Path, zoneinfo.TZPATH):
        if (directory / _PROBE_ZONE).is_file():
            return TzDatabase(_release_in(directory), str(directory))
    with resources.as_file(resources.files("tzdata") / "zoneinfo") as package:
        return TzDatabase(_release_in(package), "tzdata package")


def _release_in(directory: Path) -> str:
    """The release a system zoneinfo directory holds, from its `tzdata.zi` header."""
    try:
        with (directory / "tzdata.zi").open(encoding="utf-8") as source:
            first = source.readline()
    except OSError:
        return "unknown"
    if not first.startswith(_VERSION_PREFIX):
        return "unknown"
    return first.removeprefix(_VERSION_PREFIX).strip()
