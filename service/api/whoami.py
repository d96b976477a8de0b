"""/v1/whoami: what the presented token may do, so a client (the dashboard) can offer
only the actions its token allows."""

from fastapi import APIRouter, Request

from service.api.errors import GUARDED
from service.api.guards import TOKEN_SCOPES_STATE
from service.api.models import WhoAmI

router = APIRouter(tags=["auth"])


@router.get("/v1/whoami", operation_id="whoami", responses=GUARDED)
async def whoami(request: Request) -> WhoAmI:
    """The scopes of the bearer token sent; a server without tokens grants both."""
    scopes = getattr(request.state, TOKEN_SCOPES_STATE, None)
    if scopes is None:  # BearerAuth is installed only when tokens are configured
        return WhoAmI(scopes=["read", "write"], tokens_required=False)
    return WhoAmI(scopes=sorted(scopes), tokens_required=True)
