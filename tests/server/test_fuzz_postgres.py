"""The schema-driven fuzzer of test_fuzz.py on PostgreSQL: a file of its own, so that the
two databases' runs go to different workers."""

from __future__ import annotations

import pytest

from tests.server.conftest import Server
from tests.server.test_fuzz import fuzz_every_operation


@pytest.mark.parametrize("server", ["postgres"], indirect=True)
def test_no_input_gets_a_server_error_or_an_undocumented_answer_on_postgres(
    server: Server,
) -> None:
    fuzz_every_operation(server)
