"""Whether a sign-in or sign-out form was posted from the dashboard's own origin.

Called by the /ui/login and /ui/logout handlers (`routes`), before anything
else is read. A browser says where a request comes from in two headers, and
each one present must say "this server":

- `Sec-Fetch-Site` (every current browser): `same-origin`, or `none` (a
  navigation the user started, which no other page can cause). `same-site`
  (a sibling host or another port) and `cross-site` are refused.
- `Origin`: one of the server's own origins. `Origin: null` (a sandboxed or
  opaque page) is refused.

A request with neither header (curl, scripts, old browsers) is not refused
here: the form's token decides (the pre-session token for sign-in, the
session's CSRF token for sign-out), which a page on another site cannot read.

The server's own origins are the scheme and `Host` of the request itself (the
origin the browser addressed; behind a reverse proxy the scheme comes from
`X-Forwarded-Proto` when uvicorn trusts the proxy, by default one on
127.0.0.1), and the origin of the configured public URL (`--public-url`,
`TRUEUP_SERVER_PUBLIC_URL`), for a proxy that rewrites `Host`.
`X-Forwarded-Host` is never trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["cross_origin_reason", "origin_of", "own_origins"]

_ACCEPTED_SITES = ("same-origin", "none")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """`scheme://host[:port]` of a URL, lower-case, without the scheme's default port;
    None when it has no http(s) scheme or host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def own_origins(scheme: str, host_header: str | None, public_url: str) -> set[str]:
    """The origins this server answers as: the request's own, and the public URL's."""
    found = {origin_of(public_url)} if public_url else set()
    if host_header:
        found.add(origin_of(f"{scheme}://{host_header}"))
    return {origin for origin in found if origin}


def cross_origin_reason(headers: Mapping[str, str], scheme: str, public_url: str) -> str | None:
    """Why a form post did not come from this server's own pages; None when it may have."""
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in _ACCEPTED_SITES:
        return (
            f"the form was posted from another site (Sec-Fetch-Site: {site[:40]}); "
            "nothing was changed — use this server's own sign-in page"
        )
    origin = headers.get("origin")
    if origin is None:
        return None
    own = own_origins(scheme, headers.get("host"), public_url)
    if origin.strip().lower() == "null":
        return (
            "the form was posted from a page without an origin (Origin: null); "
            "nothing was changed — use this server's own sign-in page"
        )
    if origin_of(origin) not in own:
        return (
            f"the form was posted from {origin[:100]}, not from this server "
            f"({', '.join(sorted(own)) or 'no origin known'}); nothing was changed — "
            "use this server's own sign-in page (behind a proxy that rewrites Host, "
            "set --public-url to the URL you open)"
        )
    return None
