"""/v1/cluster: the live replicas and the overdue count, as the scheduler already knows
them (membership rows, heartbeat every second; the overdue book, filed once per round)."""

from fastapi import APIRouter

from service.api.deps import ServicesDep
from service.api.errors import GUARDED, UNAVAILABLE_DOC
from service.api.models import ClusterMember, ClusterOut, OverdueOut

router = APIRouter(tags=["cluster"])


@router.get("/v1/cluster", operation_id="get_cluster", responses=GUARDED | UNAVAILABLE_DOC)
async def cluster(services: ServicesDep) -> ClusterOut:
    """The replicas that are up (those whose membership lock is held) with what each last
    reported, and the overdue count of the last check. Ages are on the database clock."""
    store = services.store
    as_of = await store.clock()
    members = [ClusterMember.of(member, as_of) for member in await store.live_members()]
    overdue = await store.overdue_summary()
    return ClusterOut(
        as_of=as_of,
        members=members,
        overdue=OverdueOut(count=overdue.count, checked_at=overdue.checked_at),
    )
