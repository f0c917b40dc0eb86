"""The evidence bundle the dashboard offers per device, from what the control plane holds.

A gzip'd tar: one JSON file per part and `manifest.json` with the sha256 and
size of every other file, plus the parts the control plane cannot supply (they
live on the router: `trueup evidence` there collects them).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any

from trueup.server.dashboard.data import iso

__all__ = ["MISSING", "build_bundle"]

FORMAT = "trueup-evidence/control-plane-1"

# What only the router has; named in the manifest so nobody takes the bundle as complete.
MISSING = {
    "observed-snapshot": "the full observed state lives on the router (the report carries "
    "only differing paths)",
    "agent-log": "agent log lines are not sent to the control plane",
    "journal-history": "the router's journal; the report carries the open and last transaction",
    "environment": "kernel and daemon versions are not reported",
}


def _encode(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def build_bundle(device: str, parts: dict[str, Any], now: float) -> bytes:
    """The .tar.gz bytes: `<part>.json` for each part, then manifest.json."""
    files = {f"{name}.json": _encode(value) for name, value in parts.items()}
    manifest = {
        "format": FORMAT,
        "device": device,
        "created_at": iso(now),
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for name, data in sorted(files.items())
        },
        "missing": MISSING,
    }
    files["manifest.json"] = _encode(manifest)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{device}-evidence/{name}")
            info.size = len(data)
            info.mtime = int(now)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
