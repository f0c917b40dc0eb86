"""Label selectors (Kubernetes syntax) and the label key/value rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trueup.model.layering import (
    Selector,
    SelectorError,
    label_problems,
    parse_selector,
)

AMS_EDGE = {"site": "ams", "role": "edge"}
FRA_CORE_LAB = {"site": "fra", "role": "core", "lab": ""}
BARE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("text", "ams_edge", "fra_core_lab", "bare"),
    [
        ("", True, True, True),
        ("site=ams", True, False, False),
        ("site==ams", True, False, False),
        ("site!=ams", False, True, True),
        ("role in (edge,core)", True, True, False),
        ("role in (core)", False, True, False),
        ("role notin (core)", True, False, True),
        ("lab", False, True, False),
        ("!lab", True, False, True),
        ("lab=", False, True, False),
        ("site=ams,role=edge", True, False, False),
        ("site=ams,role=core", False, False, False),
        ("site in (ams,fra),!lab", True, False, False),
        ("  site = ams ,  role in ( edge , core )  ", True, False, False),
    ],
)
def test_every_operator_matches_as_kubernetes_does(
    text: str, ams_edge: bool, fra_core_lab: bool, bare: bool
) -> None:
    selector = parse_selector(text)
    assert selector.matches(AMS_EDGE) is ams_edge
    assert selector.matches(FRA_CORE_LAB) is fra_core_lab
    assert selector.matches(BARE) is bare


def test_the_empty_selector_selects_everything() -> None:
    selector = parse_selector("")
    assert selector == Selector()
    assert selector.selects_everything
    assert selector.text == ""
    assert parse_selector("   ").selects_everything
    assert not parse_selector("a").selects_everything


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("site==ams", "site=ams"),
        ("role in (edge, core, edge)", "role in (core,edge)"),
        ("site=ams,!lab,role notin(x)", "!lab,role notin (x),site=ams"),
        ("b,a", "a,b"),
        ("a,a", "a"),
        ("example.com/tier=gold", "example.com/tier=gold"),
        ("a=", "a="),
    ],
)
def test_canonical_form_is_stable_and_round_trips(text: str, canonical: str) -> None:
    selector = parse_selector(text)
    assert selector.text == canonical
    assert str(selector) == canonical
    assert parse_selector(canonical) == selector
    assert parse_selector(selector.text).text == canonical


def test_equal_selectors_written_differently_are_equal_and_hash_alike() -> None:
    one = parse_selector("site=ams,role in (core,edge)")
    two = parse_selector(" role in (edge,core) , site==ams")
    assert one == two
    assert hash(one) == hash(two)


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("site=ams,,", 10, "a label key"),
        (",site=ams", 1, "a label key"),
        ("site=ams,", 10, "a label key"),
        ("a in b", 6, "'(' after 'in'"),
        ("a in (b", 8, "',' or ')'"),
        ("a in ()", 7, "a label value"),
        ("a notin (b,)", 12, "a label value"),
        ("a b", 3, "one of = == != in notin"),
        ("a=b c", 5, "',' or the end of the selector"),
        ("a=@", 3, "a label key, a value"),
        ("!", 2, "a label key"),
        ("!=a", 1, "a label key"),
        ("-a=b", 1, "a label key: [prefix/]name"),
        ("a=b-", 3, "a label value"),
        ("Bad_Prefix/a=b", 1, "a label key"),
    ],
)
def test_errors_name_the_position_and_what_was_expected(
    text: str, position: int, expected: str
) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_selector(text)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.position == position
    assert expected in error.expected
    assert f"at position {position}" in str(error)
    assert repr(text) in str(error)


def test_error_says_what_was_found() -> None:
    with pytest.raises(SelectorError) as caught:
        parse_selector("a in (b")
    assert caught.value.found == "the end of the selector"
    with pytest.raises(SelectorError) as caught:
        parse_selector("a b")
    assert caught.value.found == "'b'"


def test_valid_labels_have_no_problems() -> None:
    assert label_problems({}) == []
    assert (
        label_problems(
            {
                "site": "ams",
                "role": "",
                "example.com/tier": "gold",
                "a.b-c_d": "A.b-C_9",
                "k" * 63: "v" * 63,
                ("p" * 63 + ".") * 3 + "p" * 61 + "/n": "x",
            }
        )
        == []
    )


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        ({"": "x"}, "labels.: key empty"),
        ({"-site": "x"}, "labels.-site: key name '-site'"),
        ({"site-": "x"}, "labels.site-: key name 'site-'"),
        ({"si te": "x"}, "labels.si te: key name"),
        ({"k" * 64: "x"}, "name is 64 characters (at most 63)"),
        ({"/a": "x"}, "empty prefix"),
        ({"Example.com/a": "x"}, "prefix 'Example.com' is not a DNS subdomain"),
        ({"a/": "x"}, "empty name"),
        ({"p" * 254 + "/a": "x"}, "prefix is 254 characters (at most 253)"),
        ({"site": "a b"}, "labels.site: value 'a b' has a character not allowed"),
        ({"site": "-ams"}, "labels.site: value '-ams'"),
        ({"site": "v" * 64}, "labels.site: value is 64 characters (at most 63)"),
        ({"site": 3}, "labels.site: value is not a string"),
    ],
)
def test_label_problems_name_the_key_and_what_is_expected(
    labels: dict[str, object], fragment: str
) -> None:
    problems = label_problems(labels)
    assert len(problems) == 1
    assert fragment in problems[0]
    assert "expected" in problems[0]


def test_every_bad_label_is_reported_once_in_key_order() -> None:
    problems = label_problems({"z": "bad value", "ok": "fine", "-a": "x"})
    assert [problem.split(":")[0] for problem in problems] == ["labels.-a", "labels.z"]


_NAMES = st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,6}[a-z0-9])?\Z").filter(
    lambda name: name not in ("in", "notin")
)
_REQUIREMENTS = st.one_of(
    st.builds(lambda k: k, _NAMES),
    st.builds(lambda k: f"!{k}", _NAMES),
    st.builds(lambda k, op, v: f"{k}{op}{v}", _NAMES, st.sampled_from(["=", "==", "!="]), _NAMES),
    st.builds(
        lambda k, op, vs: f"{k} {op} ({' , '.join(vs)})",
        _NAMES,
        st.sampled_from(["in", "notin"]),
        st.lists(_NAMES, min_size=1, max_size=4),
    ),
)
_LABELS = st.dictionaries(_NAMES, st.one_of(st.just(""), _NAMES), max_size=5)


@given(st.lists(_REQUIREMENTS, max_size=5), st.lists(_LABELS, min_size=1, max_size=4))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_any_selector_round_trips_through_its_canonical_form(
    terms: list[str], label_sets: list[dict[str, str]]
) -> None:
    selector = parse_selector(" , ".join(terms))
    again = parse_selector(selector.text)
    assert again == selector
    assert again.text == selector.text
    for labels in label_sets:
        assert again.matches(labels) is selector.matches(labels)
        # comma is AND: the selector matches exactly when every term does
        assert selector.matches(labels) is all(parse_selector(t).matches(labels) for t in terms)
