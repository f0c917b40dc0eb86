"""`Allow` on every route: OPTIONS answers 204 with the path's methods, a wrong method 405 with
the same list (a path served by several routes lists them all); neither needs a token, and
there are no CORS headers."""

from __future__ import annotations

import re
from collections import defaultdict

from fastapi.routing import APIRoute

from tests.server.conftest import Server

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def concrete_paths(server: Server) -> dict[str, set[str]]:
    """Each route path with its parameters filled in, and the methods declared for it."""
    declared: dict[str, set[str]] = defaultdict(set)
    for route in server.client.app.routes:
        if isinstance(route, APIRoute):
            declared[re.sub(r"\{[^}]+\}", "x1", route.path)].update(route.methods)
    return declared


def allow_of(value: str) -> set[str]:
    return {m.strip() for m in value.split(",")}


def test_every_route_answers_options_and_wrong_methods_with_its_full_allow(
    server: Server,
) -> None:
    paths = concrete_paths(server)
    assert len(paths) > 40  # the whole API and the dashboard
    for path, declared in paths.items():
        # What the path takes, found by asking: every method that is not answered 405.
        answers = {m: server.client.request(m, path, follow_redirects=False) for m in METHODS}
        taken = {m for m, answer in answers.items() if answer.status_code != 405}
        assert taken == declared, path
        options = server.client.options(path)
        assert options.status_code == 204, (path, options.text)
        assert allow_of(options.headers["allow"]) == taken | {"OPTIONS"}, path
        assert not [h for h in options.headers if h.startswith("access-control-")]
        for method, answer in answers.items():
            if method not in taken:
                assert allow_of(answer.headers["allow"]) == taken | {"OPTIONS"}, (path, method)
                assert method in answer.json()["detail"]


def test_a_path_with_two_routes_lists_both(server: Server) -> None:
    tenant = server.tenant()
    for path, allow in (
        ("/api/v1/devices", "GET, OPTIONS, POST"),
        ("/api/v1/users", "GET, OPTIONS, POST"),
        ("/api/v1/devices/edge-01/desired", "GET, OPTIONS, PUT"),
        ("/ui/login", "GET, OPTIONS, POST"),
    ):
        wrong = server.client.delete(path, headers=tenant.auth("admin"))
        assert wrong.status_code == 405 and wrong.headers["allow"] == allow, path
        assert server.client.options(path).headers["allow"] == allow, path


def test_options_needs_no_token_and_grants_no_cross_origin_access(server: Server) -> None:
    preflight = server.client.options(
        "/api/v1/devices",
        headers={
            "Origin": "http://attacker.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code == 204 and preflight.content == b""
    assert preflight.headers["allow"] == "GET, OPTIONS, POST"
    assert not [h for h in preflight.headers if h.startswith("access-control-")]
    # A path no route serves is still 404, for OPTIONS too.
    assert server.client.options("/api/v1/nothing-here").status_code == 404
    assert server.client.delete("/api/v1/nothing-here").status_code == 404
