"""The HTTP routes, one module per area; each module's `router(api)` returns an APIRouter."""
