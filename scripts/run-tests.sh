#!/usr/bin/env bash
# The whole suite: unit tests, then the real-kernel and database tests.
# Root and PostgreSQL are required; their absence fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "trueup tests: the integration suite needs root (network namespaces); run as root" >&2
  exit 1
fi
exec .venv/bin/pytest -q -p no:cacheprovider tests "$@"
