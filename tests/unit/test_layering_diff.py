"""`diff_documents`: paths that name list items by their key, sorted, old → new."""

from __future__ import annotations

import copy

from tests.unit.layering_examples import full_document
from trueup.model.document import document_digest, parse_document
from trueup.model.layering import PathChange, diff_documents


def _canonical(document: dict[str, object]) -> dict[str, object]:
    return parse_document(copy.deepcopy(document)).canonical()


def test_changes_are_named_by_item_key_and_sorted() -> None:
    old = full_document()
    new = copy.deepcopy(old)
    spec = new["spec"]
    spec["interfaces"][0]["mtu"] = 9000
    spec["interfaces"][0]["addresses"].append("203.0.113.5/24")
    spec["interfaces"][1]["addresses"].remove("192.0.2.1/25")
    spec["routes"][0]["via"] = "203.0.113.3"
    spec["dhcp"]["subnets"][0]["reservations"][0]["hostname"] = "printer"
    spec["firewall"]["chains"][1]["rules"] = ["counter"]
    del spec["proxies"]
    changes = diff_documents(_canonical(old), _canonical(new))
    assert changes == [
        PathChange(
            "spec.dhcp.subnets[203.0.113.0/24].reservations[203.0.113.20].hostname",
            "add",
            None,
            "printer",
        ),
        PathChange(
            "spec.firewall.chains[web].rules",
            "change",
            ["tcp dport { 80, 443 } accept"],
            ["counter"],
        ),
        PathChange(
            "spec.interfaces[lan0].addresses[203.0.113.5/24]", "add", None, "203.0.113.5/24"
        ),
        PathChange("spec.interfaces[lan0].mtu", "change", 1500, 9000),
        PathChange("spec.interfaces[lan1].addresses[192.0.2.1/25]", "remove", "192.0.2.1/25", None),
        PathChange(
            "spec.proxies",
            "remove",
            _canonical(old)["spec"]["proxies"],  # type: ignore[index]
            None,
        ),
        PathChange(
            "spec.routes[to=203.0.113.128/25,table=main,metric=0].via",
            "change",
            "203.0.113.2",
            "203.0.113.3",
        ),
    ]


def test_added_and_removed_items_and_a_new_order() -> None:
    old = full_document()
    new = copy.deepcopy(old)
    new["spec"]["interfaces"].reverse()
    new["spec"]["interfaces"].append({"name": "lan2"})
    del new["spec"]["dns"]["records"][1]
    changes = {c.path: c for c in diff_documents(_canonical(old), _canonical(new))}
    assert changes["spec.interfaces"] == PathChange(
        "spec.interfaces", "change", ["lan0", "lan1"], ["lan1", "lan0"]
    )
    assert changes["spec.interfaces[lan2]"].op == "add"
    assert changes["spec.interfaces[lan2]"].new == {"name": "lan2", "state": "up", "addresses": []}
    removed = changes["spec.dns.records[name=www,type=CNAME,value=router]"]
    assert (removed.op, removed.old["ttl"]) == ("remove", 60)
    assert len(changes) == 3


def test_the_version_is_not_a_change_and_equal_documents_have_none() -> None:
    old = _canonical(full_document())
    new = copy.deepcopy(old)
    new["metadata"]["version"] = 12  # type: ignore[index]
    assert diff_documents(old, new) == []
    renamed = copy.deepcopy(old)
    renamed["metadata"]["device"] = "edge-02"  # type: ignore[index]
    assert diff_documents(old, renamed) == [
        PathChange("metadata.device", "change", "edge-01", "edge-02")
    ]


def test_a_device_without_a_document_adds_each_section() -> None:
    new = _canonical(full_document())
    changes = diff_documents(None, new)
    assert [c.path for c in changes] == sorted(f"spec.{name}" for name in new["spec"])  # type: ignore[union-attr]
    assert all(c.op == "add" and c.old is None for c in changes)
    assert [c.path for c in diff_documents(None, new)] == [c.path for c in changes]


def test_a_value_that_changes_type_but_compares_equal_in_python_is_a_change() -> None:
    # 1 == True == 1.0 in Python, but the documents (and their digests) differ.
    old, new = full_document(), full_document()
    old["spec"]["dhcp"]["subnets"][0]["options"] = {"ip-forwarding": 1}
    new["spec"]["dhcp"]["subnets"][0]["options"] = {"ip-forwarding": True}
    old_doc, new_doc = _canonical(old), _canonical(new)
    assert document_digest(parse_document(old_doc)) != document_digest(parse_document(new_doc))
    path = "spec.dhcp.subnets[203.0.113.0/24].options.ip-forwarding"
    assert diff_documents(old_doc, new_doc) == [PathChange(path, "change", 1, True)]
    assert diff_documents({"spec": {"x": {"a": [0, 1]}}}, {"spec": {"x": {"a": [False, 1.0]}}}) == [
        PathChange("spec.x.a", "change", [0, 1], [False, 1.0])
    ]
    assert diff_documents(old_doc, copy.deepcopy(old_doc)) == []
