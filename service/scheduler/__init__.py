"""The per-replica scheduler: mirror of active jobs, fire gates, runner, recovery."""

from service.scheduler.runner import Runner
from service.scheduler.window import Window

__all__ = ["Runner", "Window"]
