"""The bearer scheme is case-insensitive (RFC 9110 §11.1); anything that is not
`Bearer 1*SP token68` is 401 with `WWW-Authenticate: Bearer`."""

from __future__ import annotations

import pytest

from tests.server.conftest import Server
from trueup.server.api.bearer import bearer_token

ACCEPTED = ["Bearer {t}", "bearer {t}", "BEARER {t}", "bEaReR {t}", "Bearer   {t}", " Bearer {t}\t"]
REFUSED = [
    "",
    "Bearer",
    "Bearer ",
    "Bearer{t}",
    "Bearer\t{t}",
    "Basic {t}",
    "Token {t}",
    "{t}",
    "Bearer {t} {t}",
    "Bearer {t},x",
    "Bearer, {t}",
    "Bearers {t}",
]


def test_the_credential_is_parsed_as_the_rfc_says() -> None:
    token = "tu_u_AbC-9~+/x.y=="
    for form in ACCEPTED:
        assert bearer_token(form.format(t=token)) == token, form
    for form in REFUSED:
        assert bearer_token(form.format(t=token)) is None, form
    assert bearer_token(None) is None


@pytest.mark.parametrize("form", ACCEPTED)
def test_any_case_of_the_scheme_is_accepted(server: Server, form: str) -> None:
    tenant = server.tenant(devices=("edge-01",))
    answer = server.client.get(
        "/api/v1/devices", headers={"Authorization": form.format(t=tenant.tokens["viewer"])}
    )
    assert answer.status_code == 200, answer.text
    assert [d["device"] for d in answer.json()["devices"]] == ["edge-01"]
    # A device credential too.
    answer = server.client.get(
        "/api/v1/agent/desired",
        headers={"Authorization": form.format(t=tenant.devices["edge-01"])},
    )
    assert answer.status_code in (200, 204), answer.text


@pytest.mark.parametrize("form", REFUSED)
def test_anything_else_is_401_with_the_challenge(server: Server, form: str) -> None:
    tenant = server.tenant()
    value = form.format(t=tenant.tokens["viewer"])
    answer = server.client.get("/api/v1/devices", headers={"Authorization": value} if value else {})
    assert answer.status_code == 401, (form, answer.text)
    assert answer.headers["www-authenticate"] == "Bearer"


def test_the_enrollment_exchange_takes_any_case_too(server: Server) -> None:
    tenant = server.tenant()
    tenant_id = server.plane.tenant_id(tenant.name)
    bundle = server.plane.enroll(tenant_id, "edge-07", "test", url="http://testserver")
    refused = server.client.post(
        "/api/v1/agent/enroll", headers={"Authorization": f"Bearer\t{bundle['token']}"}
    )
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    answer = server.client.post(
        "/api/v1/agent/enroll", headers={"Authorization": f"bearer {bundle['token']}"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["credential"]
    # Used once: the same token again is refused, with the challenge.
    again = server.client.post(
        "/api/v1/agent/enroll", headers={"Authorization": f"BEARER {bundle['token']}"}
    )
    assert again.status_code == 401 and again.headers["www-authenticate"] == "Bearer"
