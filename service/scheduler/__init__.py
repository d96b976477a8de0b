"""The per-replica scheduler: the window of due ticks, fire gates, runner, recovery."""

from service.scheduler.runner import Runner
from service.scheduler.window import Window

__all__ = ["Runner", "Window"]
