"""Stop the agent that holds a state directory: `python -m scripts.stop_agent STATE_DIR`.

`make demo-stop` uses it, so that an agent the user restarted by hand (tour
step 4) is stopped too. The agent is found by the state directory's agent lock
record (`trueup.journal.agentlock.agent_holder`), never by a process name
pattern, and checked to be an agent (`agent run` on its command line) before
it is signalled: SIGTERM, then SIGKILL after `grace` seconds.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from trueup.journal.agentlock import agent_holder

__all__ = ["stop_agent"]


def _is_agent(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"agent" in argv and b"run" in argv


def stop_agent(state_dir: Path, grace: float = 10.0) -> list[int]:
    """The pids stopped (a second agent waiting for the lock takes over: stop that one too)."""
    stopped: list[int] = []
    for _ in range(3):
        holder = agent_holder(state_dir)
        if holder is None:
            break
        pid = holder.pid
        if pid in stopped or not _is_agent(pid):
            break  # a recycled pid: not an agent, left alone
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _is_agent(pid):
            time.sleep(0.05)
        if _is_agent(pid):
            os.kill(pid, signal.SIGKILL)
        stopped.append(pid)
    return stopped


def main() -> None:
    for pid in stop_agent(Path(sys.argv[1])):
        print(f"stopped the agent (pid {pid}) on {sys.argv[1]}")


if __name__ == "__main__":
    main()
