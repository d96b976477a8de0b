"""The `log` task: writes a message with the job and run in context."""

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from service.tasks.base import TaskContext, TaskDefinition

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class LogArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str = Field(max_length=16_384, description="The text to log.")
    level: Literal["debug", "info", "warning", "error"] = "info"


async def run_log(args: LogArgs, context: TaskContext) -> JsonValue:
    context.logger.log(_LEVELS[args.level], args.message)
    return None


LOG_TASK = TaskDefinition(
    name="log",
    description="Write a message to the service log, tagged with the job and run.",
    args_model=LogArgs,
    run=run_log,
)
