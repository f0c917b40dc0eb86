#!/usr/bin/env bash
# The whole suite: unit tests, then the real-kernel and database tests.
# Root and PostgreSQL are required; their absence fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "trueup tests: the integration suite needs root (network namespaces); run as root" >&2
  exit 1
fi
# Three workers, a test file each at a time: the real-kernel and real-daemon tests
# spend most of their time waiting for agents, daemons and namespaces (more
# workers than cores), and every test has its own namespaces, ports, databases
# and state directories.
exec .venv/bin/pytest -q -p no:cacheprovider -n "${TRUEUP_TEST_WORKERS:-3}" --dist loadfile --durations=25 tests "$@"
