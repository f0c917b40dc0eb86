"""The audit verifier's engine knows no table: a table declared here (a fact record, an
`AuditedTable`, its `Action`s) is replayed and verified with nothing else added."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, RowMapping

from trueup.server.auditverify import (
    Action,
    AuditedTable,
    Context,
    Each,
    Facts,
    Missing,
    Same,
    replay,
    verify_table,
)
from trueup.server.keys import ServerKey


@dataclass(frozen=True)
class WidgetFact:
    seq: int
    colour: str | None


LIVE: list[dict[str, Any]] = []

WIDGETS = AuditedTable[int, WidgetFact](
    name="widgets",
    rows=lambda _conn: cast(list[RowMapping], LIVE),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"id={row['id']}",
    checks=(Same[WidgetFact]("colour", lambda f: f.colour),),
    missing=Missing("audited at seq={seq} but missing (deleted)", lambda key, _ctx: f"id={key}"),
)

ACTIONS = {
    "widget.create": [
        Action(
            "widget.create",
            WIDGETS,
            lambda r: r.required_int("widget_id"),
            creates=lambda r, _previous: WidgetFact(r.seq, r.optional_str("colour")),
        )
    ],
    "widget.delete": [
        Action("widget.delete", WIDGETS, lambda r: r.required_int("widget_id"), deletes=True)
    ],
    "widget.batch": [
        Action(
            "widget.batch",
            WIDGETS,
            lambda r: r.required_int("widget_id"),
            each=Each("widgets", "a batched widget"),
            creates=lambda r, _previous: WidgetFact(r.seq, r.required_str("colour")),
        )
    ],
}


def entry(seq: int, action: str, detail: object) -> RowMapping:
    detail_text = json.dumps(detail)
    row = {"seq": seq, "tenant_id": 1, "action": action, "target": "widget", "detail": detail_text}
    return cast(RowMapping, row)


def verified(facts: Facts) -> list[str]:
    ctx = Context(cast(Connection, None), cast(ServerKey, None), facts)
    return [str(p) for p in verify_table(WIDGETS, ctx)]


def test_a_declared_table_is_replayed_and_each_row_compared() -> None:
    facts = Facts()
    malformed = replay(
        [
            entry(1, "widget.create", {"widget_id": 1, "colour": "red"}),
            entry(2, "widget.create", {"widget_id": 2, "colour": "blue"}),
            entry(3, "widget.create", {"widget_id": 3}),
            entry(4, "widget.create", {"widget_id": 4, "colour": "green"}),
            entry(5, "widget.delete", {"widget_id": 4}),
            entry(6, "widget.batch", {"widgets": [{"widget_id": 5, "colour": "grey"}]}),
            entry(7, "widget.create", {"colour": "red"}),
            entry(8, "widget.batch", {"widgets": ["six"]}),
            entry(9, "other.action", {"widget_id": 9}),
        ],
        ACTIONS,
        facts,
    )
    assert [str(p) for p in malformed] == [
        "audit_log seq=7 (widget.create widget): detail malformed ('widget_id' is missing); "
        "the rows this entry vouches for are not covered",
        "audit_log seq=8 (widget.batch widget): detail malformed (a batched widget is not an "
        "object); the rows this entry vouches for are not covered",
    ]
    LIVE[:] = [
        {"id": 1, "colour": "red"},
        {"id": 3, "colour": "any"},  # its colour was not recorded: nothing to compare
        {"id": 4, "colour": "green"},
        {"id": 5, "colour": "pink"},
        {"id": 6, "colour": "red"},
    ]
    assert verified(facts) == [
        "widgets id=4: deleted at seq=5 but still present (restored)",
        "widgets id=5: colour is 'pink' but the audit log (seq=6) says 'grey' (changed behind "
        "the server's back)",
        "widgets id=6: has no audit entry (inserted directly)",
        "widgets id=2: audited at seq=2 but missing (deleted)",
    ]
    LIVE[:] = [{"id": 1, "colour": "red"}, {"id": 2, "colour": "blue"}, {"id": 3, "colour": "x"}]
    LIVE.append({"id": 5, "colour": "grey"})
    assert verified(facts) == []
