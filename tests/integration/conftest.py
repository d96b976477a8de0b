"""Fixtures of the in-process fire-path tests (tests/support/fire.py)."""

from tests.support.fire import gates, metrics, runner, sessions

__all__ = ["gates", "metrics", "runner", "sessions"]
