"""/v1/schedules/preview: fire times of a schedule before committing to it."""

from fastapi import APIRouter

from service.api.deps import ServicesDep
from service.api.errors import WRITE
from service.api.models import PreviewRequest, PreviewResponse
from service.api.schedule_words import schedule_text
from service.domain.errors import InvalidInput
from service.domain.jobs import zone
from service.domain.schedules import fire_times, resolve_schedule

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


@router.post("/preview", operation_id="preview_schedule", responses=WRITE)
async def preview(body: PreviewRequest, services: ServicesDep) -> PreviewResponse:
    """The next `count` nominal ticks strictly after `after`, as a job would fire them."""
    try:
        tz = zone(body.timezone)
    except ValueError as error:
        raise InvalidInput.one(("body", "timezone"), str(error), body.timezone) from error
    now = await services.store.clock()
    after = body.after or now
    schedule = resolve_schedule(body.schedule, tz, now, None)
    ticks = fire_times(schedule, tz, after, body.count)
    return PreviewResponse(fire_times=ticks, schedule_text=schedule_text(schedule))
