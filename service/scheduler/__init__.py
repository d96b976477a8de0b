"""The per-replica scheduler: mirror of active jobs, fire gates, runner, recovery."""

from service.scheduler.mirror import Mirror
from service.scheduler.runner import Runner

__all__ = ["Mirror", "Runner"]
