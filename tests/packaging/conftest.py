from __future__ import annotations

import pytest

from tests.packaging.images import postgres_image, server_image


@pytest.fixture(scope="session")
def server_image_name() -> str:
    """The control plane image, built once (cached on disk by its inputs' hash)."""
    return server_image()


@pytest.fixture(scope="session")
def postgres_image_name() -> str:
    """The PostgreSQL trial image (`localhost/postgres:15-bookworm`)."""
    return postgres_image()
