"""Watches: what subsystems declare, and the event sources built from them (no root needed)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from trueup.subsystems.registry import default_subsystems
from trueup.system.events import NetlinkEvent
from trueup.system.watches import (
    CommandEventSource,
    FileEventSource,
    PeriodicEventSource,
    Watch,
    event_source_for,
    every,
    files,
    rtnetlink,
)


class Collector:
    def __init__(self) -> None:
        self.events: list[NetlinkEvent] = []
        self.arrived = threading.Event()

    def __call__(self, event: NetlinkEvent) -> None:
        self.events.append(event)
        self.arrived.set()

    def wait(self, predicate: object = None, timeout: float = 10.0) -> list[NetlinkEvent]:
        assert self.arrived.wait(timeout), "no event within the bound"
        return self.events


def test_subsystems_declare_what_they_watch() -> None:
    watched = {s.name: s.watch_kinds for s in default_subsystems()}
    assert watched["addresses"] == {"address", "link"}
    assert watched["routes"] == {"route", "link", "address"}
    assert watched["sysctl"] == frozenset()
    sysctl = next(s for s in default_subsystems() if s.name == "sysctl")
    assert sysctl.watches == (Watch("periodic", seconds=10.0),)
    with pytest.raises(ValueError):
        rtnetlink("neighbour")
    with pytest.raises(ValueError):
        every(0)


def test_a_file_change_is_an_event_even_by_atomic_rename(tmp_path: Path) -> None:
    watched = tmp_path / "kea-dhcp4.conf"
    watched.write_text("{}")
    source = FileEventSource([str(watched)])
    got = Collector()
    source.start(got)
    try:
        (tmp_path / "unrelated").write_text("x")  # another file in the directory: no event
        tmp = tmp_path / ".kea-dhcp4.conf.tmp"
        tmp.write_text('{"Dhcp4": {}}')
        tmp.rename(watched)
        events = got.wait()
        assert events[0].kind == "file"
        assert events[0].detail["path"] == str(watched)
        assert all(e.detail["path"] == str(watched) for e in events)
    finally:
        source.stop()


def test_periodic_and_command_sources_and_their_composite() -> None:
    tick = Collector()
    periodic = PeriodicEventSource(0.05)
    periodic.start(tick)
    try:
        assert tick.wait()[0].kind == "tick"
    finally:
        periodic.stop()
    lines = Collector()
    command = CommandEventSource((sys.executable, "-c", "print('add rule inet trueup x')"))
    command.start(lines)
    try:
        first = lines.wait()[0]
        assert first.kind == "command" and first.detail["line"] == "add rule inet trueup x"
    finally:
        command.stop()
    composite = event_source_for([rtnetlink("link"), files("/etc/hosts"), every(30), every(5)])
    assert [type(s).__name__ for s in composite.sources] == [
        "KernelEventSource",
        "FileEventSource",
        "PeriodicEventSource",
    ]
    assert composite.sources[2].seconds == 5  # type: ignore[attr-defined]


def test_paths_under_the_state_directory_are_resolved_and_their_directory_made(
    tmp_path: Path,
) -> None:
    from trueup.system.watches import STATE_DIR, FileEventSource, event_source_for, files

    watch = files(f"{STATE_DIR}/run/haproxy/haproxy.cfg")
    assert not any(isinstance(s, FileEventSource) for s in event_source_for([watch]).sources)
    composite = event_source_for([watch], tmp_path)
    (source,) = [s for s in composite.sources if isinstance(s, FileEventSource)]
    assert source.paths == [str(tmp_path / "run" / "haproxy" / "haproxy.cfg")]
    assert (tmp_path / "run" / "haproxy").is_dir()
