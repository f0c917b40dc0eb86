# trueup — every target installs what it needs on a fresh Debian machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
APT_PKGS := iproute2 procps curl postgresql-client nftables kea-dhcp4-server kea-dhcp6-server kea-common knot knot-dnsutils udhcpc keepalived haproxy wireguard-tools wireguard-go frr frr-pythontools chromium podman podman-compose golang-github-containernetworking-plugin-dnsname runc catatonit mmdebstrap python3-pip-whl

.PHONY: all demo demo-stop test bench lint unit integration system-deps clean image package

all: test

system-deps:
	@bash scripts/install-system-deps.sh $(APT_PKGS)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check trueup tests scripts
	$(BIN)/ruff format --check trueup tests scripts
	$(BIN)/mypy trueup
	$(BIN)/lint-imports

test: system-deps $(STAMP) lint
	bash scripts/run-tests.sh

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

demo: system-deps $(STAMP)
	bash scripts/demo.sh

demo-stop:
	bash scripts/demo.sh stop

# The control plane's OCI image, localhost/trueup-server:<version> (cached by its inputs' hash).
image: system-deps $(STAMP)
	$(BIN)/python -m scripts.build_image server

# dist/trueup-agent_<version>_<arch>.deb (PACKAGE_VERSION=... overrides pyproject's version)
package: $(STAMP)
	@bash scripts/install-system-deps.sh mmdebstrap
	$(BIN)/python -m scripts.build_deb

bench: system-deps $(STAMP)
	$(BIN)/python -m scripts.bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
