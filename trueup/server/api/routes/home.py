"""`/`: what this server is and where to go next, without a token (like a health probe).

A browser or `curl` pointed at the control plane gets an answer instead of a
404: the service, its version, the API and probe paths, and the CLI that
reads the fleet. It names no tenant, device or user.
"""

from __future__ import annotations

from fastapi import FastAPI

from trueup.server.api.context import Api, role

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:
    del api

    @app.get("/", openapi_extra=role("public"))
    async def home() -> dict[str, str]:
        from trueup import __version__

        return {
            "service": "trueup control plane",
            "version": __version__,
            "api": "/api/v1 (Authorization: Bearer TOKEN)",
            "health": "/healthz, /readyz",
            "openapi": "/openapi.json (viewer token)",
            "cli": "trueup fleet --server URL --token-file FILE",
        }
