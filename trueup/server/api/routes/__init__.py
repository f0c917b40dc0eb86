"""The HTTP routes, one module per area; each module's `register(app, api)` adds its routes.

Routes are added to the app itself rather than through `APIRouter`/`include_router`:
FastAPI matches an included router's routes with extra bookkeeping per candidate,
which measurably slowed the agents' report and long-poll routes (the hot path).
"""
