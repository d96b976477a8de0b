"""`greet`: logs a greeting and returns what it said. The smallest useful task."""

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from service.tasks import TaskContext, task


class GreetArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    greeting: str = Field(min_length=1, max_length=200, description="What to say.")
    times: int = Field(1, ge=1, le=10, description="How many times to say it (1..10).")


@task("greet", args=GreetArgs)
async def greet(args: GreetArgs, context: TaskContext) -> JsonValue:
    """Log a greeting `times` times, tagged with the job and run; return what was said."""
    for _ in range(args.times):
        context.logger.info("%s", args.greeting)
    return {"said": args.greeting, "times": args.times, "attempt": context.attempt}
