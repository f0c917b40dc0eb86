"""Request schemas are exactly as strict as the service: data the OpenAPI document accepts
is not refused with 422, on SQLite and PostgreSQL.

Schemathesis generates only schema-valid requests (positive mode) for every operation, with
valid credentials for its role. The service may still refuse, with 422, what no JSON Schema
can say:

- what depends on stored state: a name that already exists, a target a rule uses;
- the desired-state document of `PUT …/desired`: its schema is the published DeviceState
  schema (trueup.model), not restated in the API's;
- a body's sha256 that does not match the `X-Trueup-…-Sha256` header sent with it, and the
  JSON carried in the `X-Trueup-…-Metadata` headers (its fields are checked once decoded);
- a webhook URL's target policy (what its name resolves to);
- a label selector's grammar (`?selector=`, a plan's `selector`): the parser names the
  position and what it expected, which a pattern could not;
- a proposed profile in a plan (`change.document`): the profile model checks it, like a
  desired document (every problem with its path).
- a rollout's targets (desired-state documents) and waves, judged against the stored fleet;
  and that it names either targets or the plan (a choice the schema states only in prose).

Every other 422 is a field the schema lets through and the service refuses: the test names
it. Generation is derandomized and bounded, so the run is deterministic.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.server.conftest import Server, document
from tests.server.test_fuzz import _sometimes

EXAMPLES = 10  # per operation

# Refusals that depend on what is stored, or on meaning no schema states: a webhook URL
# or an allowlist entry judged by the target policy (what the host is, how it parses).
_BEYOND_A_SCHEMA = re.compile(
    r"already exists|is used by rules|the body's sha256 is"
    r"|^header\.X-Trueup-(Backup|Evidence)-Metadata|^url: |^entries\[[0-9]+\]: "
    r"|^query\.selector: selector |^body\.selector: selector |^change\.document\."
    # A rollout's targets: each document is a desired-state document (its schema is the
    # published one), the devices and waves are judged against the stored fleet.
    r"|^targets\[[0-9]+\]\.(document|device): |nothing to roll out|give either targets or plan|^waves(\[[0-9]+\]\.\w+)?: "
)
# The desired-state document: its schema is the published one (trueup.model), not the API's.
_DOCUMENT_ROUTES = {
    ("PUT", "/api/v1/devices/{device}/desired"),
    ("PUT", "/api/v1/profiles/{name}"),
}


def _schema_refusals(response: Any, method: str, path: str) -> list[str]:
    """The problems of a 422 that a schema could have said, [] for other answers."""
    if response.status_code != 422:
        return []
    problems = response.json().get("problems") or [response.json().get("detail", "")]
    if (method, path) in _DOCUMENT_ROUTES:
        problems = [p for p in problems if p.startswith("header.")]
    return [p for p in problems if not _BEYOND_A_SCHEMA.search(p)]


def test_schema_valid_requests_are_not_refused_as_invalid(server: Server) -> None:
    tenant = server.tenant("strict", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    put = server.client.put(
        "/api/v1/devices/edge-01/desired",
        json=document("edge-01"),
        headers={**tenant.auth("operator"), "If-Match": "0"},
    )
    assert put.status_code == 201, put.text
    spec = server.client.get("/openapi.json", headers=tenant.auth("viewer")).json()
    schema = schemathesis.openapi.from_dict(spec)

    def credentials(role: str) -> dict[str, str]:
        if role == "device":
            return tenant.device_auth("edge-01")
        if role == "enrollment":
            bundle = server.plane.enroll(tenant_id, "edge-02", "strict", url="http://testserver")
            return {"Authorization": f"Bearer {bundle['token']}"}
        if role == "public":
            return {}
        return tenant.auth("admin")

    def aim(case: Any, role: str) -> None:
        params = case.path_parameters or {}
        if "device" in params and role != "admin" and _sometimes(params["device"]):
            params["device"] = "edge-01"
        if case.query and "wait" in case.query:
            case.query["wait"] = 0

    found: dict[str, list[str]] = {}
    answered: set[int] = set()

    def walk(operation: Any) -> None:
        role = spec["paths"][operation.path][operation.method.lower()]["x-trueup-role"]

        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            aim(case, role)
            kwargs = case.as_transport_kwargs(base_url="http://testserver")
            kwargs.pop("cookies", None)
            if isinstance(kwargs.get("data"), (bytes, str)):
                kwargs["content"] = kwargs.pop("data")
            headers = {**(kwargs.pop("headers", None) or {}), **credentials(role)}
            response = server.client.request(**kwargs, headers=headers)
            answered.add(response.status_code)
            refusals = _schema_refusals(response, operation.method.upper(), operation.path)
            if refusals:
                found.setdefault(operation.label, []).extend(refusals[:1])

        run()

    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        walk(operation)
    assert any(s < 300 for s in answered)
    assert not found, "accepted by the schema, refused by the service: " + repr(
        {label: problems[:3] for label, problems in found.items()}
    )
