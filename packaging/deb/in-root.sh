#!/bin/sh
# Runs inside the bookworm build root (scripts/build_deb.py), offline: the agent's virtual
# environment at the staging path the package ships, from the wheels in /build/wheels alone.
set -eu
export HOME=/root PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
venv=/opt/trueup/package
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --no-index --find-links /build/wheels --no-compile \
  -c /build/constraints.txt trueup
"$py" -m pip uninstall -q -y pip setuptools
# Console scripts carry the staging path in their shebang; the package runs `python -m trueup.cli`.
find "$venv/bin" -maxdepth 1 -type f ! -name 'python*' -delete
"$py" -m compileall -q -j 0 "$venv/lib"
