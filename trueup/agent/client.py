"""The CLI's client for a running agent's local API (the unix socket in the state directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

__all__ = ["AgentClient", "AgentUnavailable"]


class AgentUnavailable(RuntimeError):
    pass


class AgentClient:
    def __init__(self, socket_path: Path, timeout: float = 120.0) -> None:
        self.socket_path = socket_path
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path)),
            base_url="http://trueup-agent",
            timeout=timeout,
        )

    @classmethod
    def connect(cls, state_dir: Path) -> AgentClient | None:
        """A client when an agent answers on the state directory's socket, else None."""
        path = state_dir / "agent.sock"
        if not path.exists():
            return None
        client = cls(path)
        try:
            client._client.get("/v1/health/management", timeout=2.0)
        except httpx.TransportError:
            client.close()
            return None
        return client

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        try:
            return self._client.request(method, path, json=json, headers=headers, params=params)
        except httpx.TransportError as exc:
            raise AgentUnavailable(f"agent at {self.socket_path} did not answer: {exc}") from exc
