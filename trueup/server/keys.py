"""Keys: the server key file, per-tenant data keys and the secret box.

The server key (32 random bytes in a 0600 file) never touches the database. It
wraps each tenant's AEAD data key (AES-256-GCM, tenant id as associated data)
and keys the audit chain's HMAC. A tenant secret is sealed with its tenant's
data key and `tenant id + secret id` as associated data, so a ciphertext
copied into another tenant's row, or onto another secret, fails to open.
The audit chain's checkpoint file is kept next to the key file (anchor.py).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "MissingServerKey",
    "SecretBox",
    "SecretRefused",
    "ServerKey",
    "load_or_create_server_key",
    "new_data_key",
]

_KEY_BYTES = 32


class SecretRefused(Exception):
    """A ciphertext that does not authenticate under this tenant and secret id."""


class ServerKey:
    def __init__(self, key: bytes, path: Path | None = None, data_dir: Path | None = None) -> None:
        if len(key) != _KEY_BYTES:
            raise ValueError("server key must be 32 bytes")
        self._key = key
        # The key file, when the key came from one, and the writable directory that holds
        # the audit checkpoint file: beside the key file unless the key is on a read-only
        # mount (a Kubernetes or podman secret), when the server is given a data directory.
        self.path = path
        self.data_dir = data_dir if data_dir is not None else (path.parent if path else None)

    def derive(self, purpose: str) -> bytes:
        return hmac.new(self._key, b"trueup:" + purpose.encode(), hashlib.sha256).digest()

    def wrap_tenant_key(self, tenant_id: int, data_key: bytes) -> bytes:
        nonce = os.urandom(12)
        aead = AESGCM(self.derive("tenant-key-wrap"))
        return nonce + aead.encrypt(nonce, data_key, f"tenant:{tenant_id}".encode())

    def unwrap_tenant_key(self, tenant_id: int, wrapped: bytes) -> bytes:
        aead = AESGCM(self.derive("tenant-key-wrap"))
        try:
            return aead.decrypt(wrapped[:12], wrapped[12:], f"tenant:{tenant_id}".encode())
        except InvalidTag:
            raise SecretRefused(
                f"tenant {tenant_id}: data key does not open with this server key"
            ) from None


class SecretBox:
    """AES-256-GCM with one tenant's data key."""

    def __init__(self, tenant_id: int, data_key: bytes) -> None:
        self.tenant_id = tenant_id
        self._aead = AESGCM(data_key)

    def _associated(self, secret_id: str) -> bytes:
        return f"trueup-secret:tenant={self.tenant_id}:secret={secret_id}".encode()

    def seal(self, secret_id: str, plaintext: bytes) -> tuple[bytes, bytes]:
        nonce = os.urandom(12)
        return nonce, self._aead.encrypt(nonce, plaintext, self._associated(secret_id))

    def open(self, secret_id: str, nonce: bytes, ciphertext: bytes) -> bytes:
        try:
            return self._aead.decrypt(nonce, ciphertext, self._associated(secret_id))
        except InvalidTag:
            raise SecretRefused(
                f"secret {secret_id}: ciphertext does not belong to tenant {self.tenant_id} "
                "and this secret id (AEAD authentication failed); decryption refused"
            ) from None


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


class MissingServerKey(ValueError):
    """The key file does not exist and the server was told not to create one."""


def load_or_create_server_key(
    path: Path, *, create: bool = True, data_dir: Path | None = None
) -> ServerKey:
    """Read the key file, creating it (0600, 32 random bytes) if it does not exist and
    `create` is true. `data_dir` is where the audit checkpoint lives (default: beside
    the key file)."""
    if not path.exists() and not create:
        raise MissingServerKey(
            f"server key {path}: no such file (creating it is turned off). Mount the key "
            "(64 hex digits, e.g. from `openssl rand -hex 32`) at this path, or set "
            "TRUEUP_SERVER_KEY_FILE to where it is"
        )
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(_KEY_BYTES).hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process created it first; theirs wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path}: not a trueup server key (expected 64 hex digits)") from None
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{path}: not a trueup server key (expected 64 hex digits)")
    return ServerKey(key, path, data_dir)
