"""/v1/tasks: what a job may run, with the JSON schema of its args."""

from fastapi import APIRouter

from service.api.deps import ServicesDep
from service.api.errors import GUARDED
from service.api.models import TaskList, TaskOut

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])


@router.get("", operation_id="list_tasks", responses=GUARDED)
async def list_tasks(services: ServicesDep) -> TaskList:
    """Every task a job may name, with its args JSON schema."""
    return TaskList(
        items=[
            TaskOut(
                name=task.name,
                description=task.description,
                args_schema=task.args_model.model_json_schema(),
            )
            for task in services.tasks
        ]
    )
