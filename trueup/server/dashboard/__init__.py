"""The fleet dashboard, served by the control plane at `/` (server-rendered HTML).

session.py   the sealed session cookie and its CSRF token
data.py      what the pages show, read through the service layer
html.py      escaping, the layout, the login page, the fleet table
device.py    the device page's HTML
timeline.py  the device timeline as inline SVG
evidence.py  the per-device evidence bundle (tar.gz with a sha256 manifest)
pages.py     how a page route is declared: session, role, CSRF, rendering, error pages
routes.py    the routes: one registrar per page (fleetpage, devicepage, fleetroutes,
             rolloutroutes, evidenceroutes, loginroutes), `register(app, api)` adds them
static/      the page's CSS and JavaScript (no build step, no CDN)
"""

from trueup.server.dashboard.routes import register

__all__ = ["register"]
