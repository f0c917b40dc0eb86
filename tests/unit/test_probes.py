"""Status' bounded looks at subsystems that may block (`trueup.reconcile.probes`).

A stub subsystem whose `observe` waits on a gate stands in for a daemon that
does not answer; the sources seam yields nothing (the stub reads none).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from trueup.reconcile.probes import StatusProbes


class Gated:
    """A subsystem whose look blocks while `gate` is closed; its facts say which look it was."""

    name = "dns"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.looks = 0

    def observe(self, net: Any, scope: Any) -> dict[str, Any]:
        self.looks += 1
        seen = self.looks
        assert self.gate.wait(30), "the test never opened the gate"
        return {"look": seen}

    def configured(self, document: Any) -> bool:
        return False

    def condition(self, net: Any, document: Any) -> None:
        return None


@contextlib.contextmanager
def _sources() -> Iterator[None]:
    yield None


def _probes() -> StatusProbes:
    # A generous bound: these tests assert which look is served, not how fast.
    return StatusProbes(_sources, fresh_wait=0.5, first_wait=1.0)  # type: ignore[arg-type]


def test_a_finished_look_is_served_fresh_and_a_hung_one_stale() -> None:
    probes, sub = _probes(), Gated()
    served = probes.look([sub], None, None, "rev1")["dns"]  # type: ignore[list-item,arg-type]
    assert served.stale is None and served.look is not None
    assert served.look.facts == {"look": 1}

    sub.gate.clear()  # the daemon stops answering
    served = probes.look([sub], None, None, "rev1")["dns"]  # type: ignore[list-item,arg-type]
    assert served.stale is not None and "did not answer" in served.stale["why"]
    assert served.look is not None and served.look.facts == {"look": 1}
    sub.gate.set()


def test_a_look_taken_against_an_earlier_revision_is_never_served_as_fresh() -> None:
    probes, sub = _probes(), Gated()
    assert probes.look([sub], None, None, "rev1")["dns"].stale is None  # type: ignore[list-item,arg-type]
    sub.gate.clear()
    probes.look([sub], None, None, "rev1")  # type: ignore[list-item,arg-type]  # look 2 hangs

    # rev2 is applied while look 2 (of rev1) still runs: shown stale, and said why.
    served = probes.look([sub], None, None, "rev2")["dns"]  # type: ignore[list-item,arg-type]
    assert served.stale is not None, served
    assert "earlier revision" in served.stale["why"], served.stale

    # Look 2 finishes: it is rev1's, so rev2's request takes a look of its own.
    sub.gate.set()
    served = probes.look([sub], None, None, "rev2")["dns"]  # type: ignore[list-item,arg-type]
    assert served.stale is None, served.stale
    assert served.look is not None and served.look.key == "rev2"
    assert served.look.facts == {"look": 3}
