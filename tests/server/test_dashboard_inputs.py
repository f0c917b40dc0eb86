"""The dashboard's forms, query strings and path parameters hold the API's input rules.

Each value goes through the one input layer (trueup/server/inputs.py): a bad one is a 4xx
HTML page naming the field and what is expected, never a server error, and nothing is
stored that the API would refuse — on SQLite (which would store a NUL) and PostgreSQL
(which refuses one with an error). Schemathesis cannot reach these routes (they are not in
the OpenAPI document and need a session), so a Hypothesis test posts and fetches them with
a signed-in session, and the inputs an outside sweep found are explicit cases.
"""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from tests.server.conftest import Server, Tenant, document
from tests.server.test_dashboard import browser, csrf_of
from trueup.server.inputs import ACK_REASON, COMMENT, DEVICE, SUBSYSTEM
from trueup.server.limits import DEVICE_NAME_LENGTH, MAX_INT32
from trueup.server.tables import acks, devices, revisions

DEVICE_NAME = "edge-01"
BIG = str(2**63)


def signed_in(server: Server) -> tuple[Tenant, TestClient, str]:
    """A tenant with one device at revision 1, an operator's browser session and its CSRF
    token."""
    tenant = server.tenant(devices=(DEVICE_NAME,))
    put = server.client.put(
        f"/api/v1/devices/{DEVICE_NAME}/desired",
        json=document(DEVICE_NAME),
        headers={**tenant.auth("operator"), "If-Match": "0"},
    )
    assert put.status_code == 201, put.text
    client = browser(server, tenant, "operator")
    page = client.get(f"/ui/devices/{DEVICE_NAME}")
    assert page.status_code == 200, page.text
    return tenant, client, csrf_of(page.text)


def refused(response: Any, status: int, *needles: str) -> None:
    """A dashboard refusal: an HTML page with `status`, saying each of `needles`."""
    assert response.status_code == status, response.text[:2000]
    assert response.headers["content-type"].startswith("text/html")
    text = html.unescape(response.text)
    for needle in needles:
        assert needle in text, (needle, text[:2000])


def stored(server: Server, tenant: Tenant) -> tuple[list[Any], list[Any]]:
    """The tenant's acknowledgements and revisions, as stored."""
    tenant_id = server.plane.tenant_id(tenant.name)
    with server.plane.db.read() as conn:
        ids = [
            r.id for r in conn.execute(select(devices.c.id).where(devices.c.tenant_id == tenant_id))
        ]
        ack_rows = conn.execute(select(acks).where(acks.c.device_id.in_(ids))).all()
        revision_rows = conn.execute(select(revisions).where(revisions.c.device_id.in_(ids))).all()
    return list(ack_rows), list(revision_rows)


def assert_nothing_stored_the_api_refuses(server: Server, tenant: Tenant) -> None:
    ack_rows, revision_rows = stored(server, tenant)
    for row in ack_rows:
        assert SUBSYSTEM.problems("subsystem", row.subsystem) == [], row
        assert ACK_REASON.problems("reason", row.reason) == [], row
    for row in revision_rows:
        assert COMMENT.problems("comment", row.comment) == [], row


def desired_version(server: Server, tenant: Tenant) -> int:
    answer = server.client.get(
        f"/api/v1/devices/{DEVICE_NAME}/desired", headers=tenant.auth("viewer")
    )
    return int(answer.json()["version"])


# -- the inputs the sweep found -----------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field", "got"),
    [
        ({"a": "²", "b": "1"}, "a", "'²'"),
        ({"a": "\u0663", "b": "1"}, "a", "'\u0663'"),
        ({"a": BIG, "b": "1"}, "a", f"'{BIG}'"),
        ({"a": "1", "b": "2^63"}, "b", "'2^63'"),
        ({"a": "1"}, "b", "''"),
        ({"a": "0", "b": "1"}, "a", "'0'"),
        ({"applied": BIG}, "applied", f"'{BIG}'"),
    ],
)
def test_compare_parameters_are_revision_numbers(
    server: Server, query: dict[str, str], field: str, got: str
) -> None:
    _tenant, client, _csrf = signed_in(server)
    answer = client.get(f"/ui/devices/{DEVICE_NAME}?{urlencode(query)}")
    refused(
        answer,
        422,
        f"{field}: expected a revision number between 1 and {MAX_INT32}; got {got}",
    )
    diff = client.get(f"/ui/devices/{DEVICE_NAME}?a=1&b=1")
    assert diff.status_code == 200 and "Diff v1 → v1" in html.unescape(diff.text)


@pytest.mark.parametrize("evidence_id", ["1" + "0" * 30, "²", "0", "-1", str(MAX_INT32 + 1)])
def test_an_evidence_id_beyond_the_column_is_422(server: Server, evidence_id: str) -> None:
    _tenant, client, _csrf = signed_in(server)
    answer = client.get(f"/ui/devices/{DEVICE_NAME}/evidence/{quote(evidence_id)}")
    refused(answer, 422, "evidence id: expected an id between 1 and", repr(evidence_id))
    missing = client.get(f"/ui/devices/{DEVICE_NAME}/evidence/{MAX_INT32}")
    refused(missing, 404)


@pytest.mark.parametrize("expected", [str(2**31), BIG, "²", "-1", " 1x", ""])
def test_apply_with_an_expected_version_beyond_int32_is_422_and_stores_nothing(
    server: Server, expected: str
) -> None:
    tenant, client, csrf = signed_in(server)
    draft = yaml.safe_dump(document(DEVICE_NAME, address="198.51.100.9/24"))
    answer = client.post(
        f"/ui/devices/{DEVICE_NAME}/apply",
        data={"csrf": csrf, "expected": expected, "document": draft},
    )
    refused(answer, 422, "expected: expected the version you expect to replace", "198.51.100.9")
    assert desired_version(server, tenant) == 1


@pytest.mark.parametrize("bad", ["\x00", "\x1b[31m", "\x7f"])
def test_comments_and_acknowledgements_with_control_characters_are_422(
    server: Server, bad: str
) -> None:
    tenant, client, csrf = signed_in(server)
    draft = yaml.safe_dump(document(DEVICE_NAME, address="198.51.100.9/24"))
    applied = client.post(
        f"/ui/devices/{DEVICE_NAME}/apply",
        data={"csrf": csrf, "expected": "1", "document": draft, "comment": f"why{bad}"},
    )
    refused(applied, 422, "comment: expected text of at most 10000 characters")
    long_comment = client.post(
        f"/ui/devices/{DEVICE_NAME}/apply",
        data={"csrf": csrf, "expected": "1", "document": draft, "comment": "c" * 10_001},
    )
    refused(long_comment, 422, "comment: expected text of at most 10000 characters")
    for text in (f"{bad}", f"spec: {bad}"):  # the YAML reader refuses it as the loader starts
        document_text = client.post(
            f"/ui/devices/{DEVICE_NAME}/apply",
            data={"csrf": csrf, "expected": "1", "document": text},
        )
        refused(document_text, 422, "(document): not valid YAML")
        api = server.client.put(
            f"/api/v1/devices/{DEVICE_NAME}/desired",
            content=text.encode(),
            headers={
                **tenant.auth("operator"),
                "If-Match": "1",
                "Content-Type": "application/yaml",
            },
        )
        assert api.status_code == 422 and "not valid YAML" in api.text, api.text
    for form, field in (
        ({"subsystem": "links", "for_seconds": "60", "reason": f"why{bad}"}, "reason"),
        ({"subsystem": f"links{bad}", "for_seconds": "60", "reason": "why"}, "subsystem"),
        ({"subsystem": "<script>", "for_seconds": "60", "reason": "why"}, "subsystem"),
        ({"subsystem": "links", "for_seconds": "nan", "reason": "why"}, "for_seconds"),
        ({"subsystem": "links", "for_seconds": "\u0663", "reason": "why"}, "for_seconds"),
        ({"subsystem": "s" * 101, "for_seconds": "60", "reason": "why"}, "subsystem"),
    ):
        answer = client.post(f"/ui/devices/{DEVICE_NAME}/ack", data={"csrf": csrf, **form})
        refused(answer, 422, "not acknowledged", f"{field}: expected")
    assert stored(server, tenant)[0] == []
    assert desired_version(server, tenant) == 1
    # The same form with good values is stored.
    good = client.post(
        f"/ui/devices/{DEVICE_NAME}/ack",
        data={"csrf": csrf, "subsystem": "links", "for_seconds": "60", "reason": "INC-7"},
    )
    assert good.status_code == 200 and len(stored(server, tenant)[0]) == 1
    assert_nothing_stored_the_api_refuses(server, tenant)


@pytest.mark.parametrize(
    "device", ["edge\x00-01", "edge-01\x00", "e" * (DEVICE_NAME_LENGTH + 1), "<script>", "é"]
)
def test_a_device_path_that_cannot_be_a_name_is_422_before_any_query(
    server: Server, device: str
) -> None:
    _tenant, client, csrf = signed_in(server)
    path = f"/ui/devices/{quote(device, safe='')}"
    expected = "device: expected a device name"
    for suffix in ("", "/stream", "/evidence", "/evidence/1"):
        refused(client.get(path + suffix), 422, expected)
    for suffix, form in (
        ("/apply", {"expected": "1", "document": "x"}),
        ("/ack", {"subsystem": "links", "for_seconds": "60", "reason": "r"}),
        ("/evidence-requests", {}),
    ):
        refused(client.post(path + suffix, data={"csrf": csrf, **form}), 422, expected)


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ({"q": "edge\x00"}, "q: expected search text"),
        ({"q": "e" * 201}, "q: expected search text"),
        ({"page": "1" + "0" * 30}, "page: expected a page number"),
        ({"page": "²"}, "page: expected a page number"),
        ({"status": "\x00"}, "unknown status"),
    ],
)
def test_fleet_filters_are_bounded(server: Server, query: dict[str, str], needle: str) -> None:
    _tenant, client, _csrf = signed_in(server)
    answer = client.get(f"/?{urlencode(query)}")
    refused(answer, 422, needle)
    assert 'name="q"' in answer.text  # the filter form, to correct the URL
    refused(client.get(f"/ui/fleet/stream?{urlencode(query)}"), 422, needle)


# -- any input ------------------------------------------------------------------------------

_NASTY = [
    "",
    "\x00",
    "a\x00b",
    "\x1b[2J",
    "\x7f",
    "\t\n",
    "²",
    "\u0663",
    "١٢",
    "1_0",
    " 1",
    "1.0",
    "-1",
    "0",
    "1",
    "2",
    str(2**31 - 1),
    str(2**31),
    BIG,
    "1" + "0" * 30,
    "9" * 5000,
    "nan",
    "inf",
    "1e400",
    "<script>alert(1)</script>",
    "links",
    "why",
    "x" * 10_001,
    "é" * 300,
    "\ud7ff\ufffd",
    "edge-01",
]
TEXT = st.one_of(
    st.sampled_from(_NASTY),
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
DEVICES = st.one_of(st.just(DEVICE_NAME), st.just(DEVICE_NAME), TEXT.filter(lambda t: "/" not in t))
APPLY_DOCUMENT = yaml.safe_dump(document(DEVICE_NAME, address="198.51.100.7/24"))

REQUESTS = st.one_of(
    st.tuples(
        st.just("page"),
        DEVICES,
        st.fixed_dictionaries({}, optional={"a": TEXT, "b": TEXT, "applied": TEXT}),
    ),
    st.tuples(st.just("evidence"), DEVICES, TEXT),
    st.tuples(
        st.just("apply"),
        DEVICES,
        st.fixed_dictionaries(
            {
                "expected": st.one_of(st.just("CURRENT"), TEXT),
                "comment": TEXT,
                "document": st.one_of(st.just(APPLY_DOCUMENT), TEXT),
            }
        ),
    ),
    st.tuples(
        st.just("ack"),
        DEVICES,
        st.fixed_dictionaries(
            {
                "subsystem": st.one_of(st.just("links"), TEXT),
                "for_seconds": st.one_of(st.just("60"), TEXT),
                "reason": st.one_of(st.just("why"), TEXT),
            }
        ),
    ),
    st.tuples(st.just("evidence-request"), DEVICES, st.just({})),
    st.tuples(
        st.just("fleet"),
        st.just(""),
        st.fixed_dictionaries(
            {}, optional={"q": TEXT, "page": TEXT, "status": TEXT, "reason": TEXT}
        ),
    ),
)


def test_no_form_query_or_path_gets_a_server_error_or_stores_what_the_api_refuses(
    server: Server,
) -> None:
    tenant, client, csrf = signed_in(server)
    statuses: dict[str, set[int]] = {}

    @given(request=REQUESTS)
    @settings(
        max_examples=250,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(request: tuple[str, str, Any]) -> None:
        kind, device, values = request
        path = f"/ui/devices/{quote(device, safe='')}"
        if kind == "page":
            answer = client.get(f"{path}?{urlencode(values)}")
        elif kind == "evidence":
            answer = client.get(f"{path}/evidence/{quote(values, safe='')}")
        elif kind == "apply":
            form = dict(values)
            if form["expected"] == "CURRENT":
                form["expected"] = str(desired_version(server, tenant))
            answer = client.post(f"{path}/apply", data={"csrf": csrf, **form})
        elif kind == "ack":
            answer = client.post(f"{path}/ack", data={"csrf": csrf, **values})
        elif kind == "evidence-request":
            answer = client.post(f"{path}/evidence-requests", data={"csrf": csrf})
        else:
            answer = client.get(f"/?{urlencode(values)}")
        statuses.setdefault(kind, set()).add(answer.status_code)
        assert answer.status_code < 500, (request, answer.text[:2000])

    run()
    assert_nothing_stored_the_api_refuses(server, tenant)
    # The run reached the routes' work, not only their refusals.
    every = set().union(*statuses.values())
    assert any(s < 400 for s in every) and 422 in every, statuses
    assert set(statuses) == {"page", "evidence", "apply", "ack", "evidence-request", "fleet"}
    ack_rows, revision_rows = stored(server, tenant)
    assert ack_rows and len(revision_rows) > 1, "no good input was stored"
    assert DEVICE.problems("device", DEVICE_NAME) == []
