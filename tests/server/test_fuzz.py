"""A schema-driven fuzzer (schemathesis) against the served /openapi.json, on both databases.

Every operation — user, device and agent routes — is called with valid
credentials for its declared role (`x-trueup-role`) and with inputs generated
from its schema, valid and invalid. A run fails on any 5xx, on a status the
operation does not document, and on a response body that does not match the
documented schema. Generation is derandomized (the same cases every run) and
bounded (`EXAMPLES` per operation and mode), so it is deterministic and takes
seconds, well under the two minutes it may take.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import Server, document

EXAMPLES = 25  # per operation and generation mode
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _sometimes(value: Any) -> bool:
    """A deterministic coin per generated value: half the cases name things that exist."""
    return zlib.crc32(repr(value).encode()) % 2 == 0


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)
def test_no_input_gets_a_server_error_or_an_undocumented_answer(server: Server) -> None:
    """On SQLite; tests/server/test_fuzz_postgres.py runs the same on PostgreSQL (a file
    of its own, so the two run side by side)."""
    fuzz_every_operation(server)


def fuzz_every_operation(server: Server) -> None:
    tenant = server.tenant("fuzz", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    admin_token_id = next(
        t["id"] for t in server.plane.list_tokens(tenant_id) if t["user"] == "admin-user"
    )
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
            bundle = server.plane.enroll(tenant_id, "edge-02", "fuzz", url="http://testserver")
            return {"Authorization": f"Bearer {bundle['token']}"}
        if role == "public":
            return {}
        return tenant.auth("admin")

    def aim(case: Any, role: str) -> None:
        """Point half the cases at things that exist, and keep the run's own footing."""
        params = case.path_parameters or {}
        if "device" in params and role != "admin" and _sometimes(params["device"]):
            params["device"] = "edge-01"
        if "user" in params and _sometimes(params["user"]):
            params["user"] = "viewer-user"
        if params.get("token_id") == admin_token_id:
            params["token_id"] = admin_token_id + 1_000_000
        if case.query and "wait" in case.query:
            case.query["wait"] = 0  # a long poll would only spend the time budget

    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    called: dict[str, set[int]] = {}

    def fuzz(operation: Any) -> None:
        role = spec["paths"][operation.path][operation.method.lower()]["x-trueup-role"]
        strategy = st.one_of(
            operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
            operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
        )

        @given(case=strategy)
        @settings(
            max_examples=2 * EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            aim(case, role)
            kwargs = case.as_transport_kwargs(base_url="http://testserver")
            kwargs.pop("cookies", None)  # no route reads cookies
            if isinstance(kwargs.get("data"), (bytes, str)):
                kwargs["content"] = kwargs.pop("data")
            headers = {**(kwargs.pop("headers", None) or {}), **credentials(role)}
            response = server.client.request(**kwargs, headers=headers)
            called.setdefault(operation.label, set()).add(response.status_code)
            case.validate_response(response, checks=CHECKS)

        run()

    for operation in operations:
        fuzz(operation)
    assert len(called) == len(operations)
    # The run reached the routes themselves, not only their refusals.
    assert any(s < 300 for s in set().union(*called.values()))
    assert any(s == 422 for s in set().union(*called.values()))
    print({label: sorted(codes) for label, codes in sorted(called.items())})
