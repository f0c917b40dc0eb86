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
from collections.abc import Mapping
from urllib.parse import quote

from trueup.server.dashboard.data import iso
from trueup.server.dashboard.html import esc
from trueup.server.service.evidence import EvidenceListing

__all__ = ["MISSING", "build_bundle", "render_evidence_section"]

FORMAT = "trueup-evidence/control-plane-1"

# What only the router has; named in the manifest so nobody takes the bundle as complete.
MISSING = {
    "observed-snapshot": "the full observed state lives on the router (the report carries "
    "only differing paths)",
    "agent-log": "agent log lines are not sent to the control plane",
    "journal-history": "the router's journal; the report carries the open and last transaction",
    "environment": "kernel and daemon versions are not reported",
}


def _encode(value: object) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def build_bundle(device: str, parts: Mapping[str, object], now: float) -> bytes:
    """The .tar.gz bytes: `<part>.json` for each part (any JSON value), then manifest.json."""
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


def render_evidence_section(device: str, listed: EvidenceListing, csrf: str | None) -> str:
    """The device page's evidence section: the bundles the router uploaded (full evidence,
    built there by `trueup evidence`), the pending requests, the request button (`csrf`
    given: the caller is an operator), and the control plane's own bundle as a fallback."""
    base = f"/ui/devices/{quote(device)}/evidence"
    rows = "".join(
        f'<tr><td><time datetime="{iso(e["uploaded_at"])}">{iso(e["uploaded_at"])}</time></td>'
        f"<td>{int(e['size'])} bytes</td><td><code>{esc(e['sha256'])}</code></td>"
        f'<td><a href="{base}/{int(e["id"])}" download>download</a></td></tr>'
        for e in listed.get("evidence") or []
    )
    out = '<h2 id="evidence">Evidence</h2>'
    if rows:
        out += (
            '<table class="evidence-list"><thead><tr><th>Uploaded</th><th>Size</th>'
            f"<th>sha256</th><th></th></tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        out += '<p class="muted" id="no-evidence">No bundle uploaded by the router yet.</p>'
    pending = listed.get("pending_requests") or []
    if pending:
        since = iso(pending[0]["requested_at"])
        out += (
            f'<p class="notice" id="evidence-pending">Fresh evidence requested at {since} '
            f"by {esc(pending[0]['requested_by'])}; the agent uploads it after its next "
            "report.</p>"
        )
    if csrf is not None:
        out += (
            f'<form method="post" action="{base}-requests" class="evidence-request-form">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            '<button type="submit">Request fresh evidence</button></form>'
        )
    return out + (
        f'<p><a class="button" href="{base}" download>Download the control plane\'s bundle</a> '
        '<span class="muted">(what the control plane stores; the router-side parts are '
        "listed as missing)</span></p>"
    )
