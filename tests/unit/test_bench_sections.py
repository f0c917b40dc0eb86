"""`python -m scripts.bench NAME`: which sections run, and that only their figures are replaced."""

from __future__ import annotations

from scripts.bench import SECTIONS, _merge, _selected

HEADER = ["# Benchmarks", "", "header"]


def _block(name: str, title: str, body: str) -> str:
    return f"<!-- bench: {name} -->\n## {title}\n\n{body}\n<!-- /bench -->"


def test_a_section_is_named_short_long_or_by_module() -> None:
    for spelling in ("boot", "bench_boot", "scripts.bench_boot"):
        assert _selected("scripts.bench_boot", [spelling])
    assert not _selected("scripts.bench_boot", ["dhcp"])
    assert not _selected("scripts.bench_boot", ["boo"])
    assert _selected("scripts.bench_boot", [])
    assert "scripts.bench_boot" in SECTIONS


def test_a_filtered_run_replaces_its_section_and_keeps_the_others() -> None:
    previous = "# Benchmarks\n\nold header\n\n## Boot\n\nold boot\n\n## DHCP\n\nold dhcp\n"
    once = _merge(
        previous, HEADER, {"scripts.bench_boot": _block("scripts.bench_boot", "Boot", "new")}
    )
    assert "old boot" not in once and "new" in once
    assert "## DHCP\n\nold dhcp" in once
    assert once.count("## Boot") == 1
    twice = _merge(
        once, HEADER, {"scripts.bench_boot": _block("scripts.bench_boot", "Boot", "newer")}
    )
    assert "newer" in twice and "\nnew\n" not in twice and twice.count("## Boot") == 1
    assert "## DHCP\n\nold dhcp" in twice


def test_a_new_section_is_appended_and_a_file_without_header_gets_one() -> None:
    merged = _merge(
        "## DHCP\n\nold dhcp\n", HEADER, {"scripts.bench_x": _block("scripts.bench_x", "X", "x")}
    )
    assert merged.startswith("# Benchmarks")
    assert merged.index("## DHCP") < merged.index("## X")
