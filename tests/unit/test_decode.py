"""Decoding untrusted documents: bounded in size, depth and expansion, with short messages."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from trueup.model.decode import DecodeError, check_tree, decode_json, decode_yaml
from trueup.model.document import DocumentError, load_document
from trueup.model.limits import DOCUMENT_BYTES, MAX_DEPTH, excerpt

LAUGHS = (
    "a: &a ["
    + ",".join(['"lol"'] * 9)
    + "]\n"
    + "".join(
        f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n"
        for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    )
)


def test_billion_laughs_is_refused_with_bounded_memory() -> None:
    assert len(LAUGHS) < 500
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="aliases"):
            decode_yaml(LAUGHS)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024


def test_anchors_without_aliases_are_accepted() -> None:
    assert decode_yaml("a: &x 1\nb: 2\n") == {"a": 1, "b": 2}


def test_depth_limit_for_yaml_and_json() -> None:
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert decode_json(ok) is not None and decode_yaml(ok) is not None
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    for decode in (decode_json, decode_yaml):
        with pytest.raises(DecodeError, match="nested deeper"):
            decode(deep)
    with pytest.raises(DecodeError, match="nested deeper"):
        decode_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DecodeError, match="nested deeper"):
        check_tree({"a": [{"b": [[]]}]}, max_depth=4)


def test_size_limit_is_checked_before_decoding() -> None:
    with pytest.raises(DecodeError, match="too large"):
        decode_json(b" " * (DOCUMENT_BYTES + 1))
    with pytest.raises(DecodeError, match="too large"):
        decode_yaml("é" * (DOCUMENT_BYTES // 2 + 1))  # counted in UTF-8 bytes


def test_messages_are_short() -> None:
    for text in ("a: " + "9" * 10_000, "x: [" + "y" * 100_000):
        with pytest.raises(DecodeError) as caught:
            decode_yaml(text)
        assert len(str(caught.value)) < 300
    assert excerpt("z" * 1000).startswith("z" * 200) and len(excerpt("z" * 1000)) < 240


def test_document_files_are_bounded(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(LAUGHS)
    with pytest.raises(DocumentError, match="aliases"):
        load_document(bomb)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (DOCUMENT_BYTES + 1))
    with pytest.raises(DocumentError, match="larger than"):
        load_document(big)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(DocumentError, match="nested deeper"):
        load_document(deep)


def test_lone_surrogates_are_refused_in_keys_and_values() -> None:
    for decode, text in (
        (decode_json, '{"\\ud800": 1}'),
        (decode_json, '{"a": ["\\udfff"]}'),
        (decode_yaml, '"\\ud800": 1'),
        (decode_yaml, 'a: ["\\udfff"]'),
    ):
        with pytest.raises(DecodeError, match="lone surrogate"):
            decode(text)
    assert decode_json('["\\ud83d\\ude00"]') == ["\U0001f600"]  # a pair is one character
