"""`make image`: the control plane's OCI image, built from Debian packages without a registry.

    python -m scripts.build_image [server|postgres|all] [--force]

The server image is a Debian bookworm root made by mmdebstrap (variant `essential`
plus python3 and ca-certificates; no apt, no lists, docs, man pages or locales), a
virtual environment at /opt/trueup holding the trueup wheel with its `server` extra
(pinned by packaging/constraints.txt, byte-compiled), the user `trueup` (uid/gid
10001, no login shell) and its data directory /var/lib/trueup-server. `podman
import` turns the root into an image whose entry point is `trueup server run`.

The PostgreSQL image (for trials and tests: nothing can be pulled here) is built
the same way from Debian's postgresql-15 and honours the official image's
environment contract: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB and PGDATA;
an empty PGDATA is initialised; it listens on 0.0.0.0:5432 with password
(scram-sha-256) authentication for network clients.

Both images are cached: each is also tagged `<version>-<inputs hash>` and
labelled with the hash of everything it is built from, so a re-run with the same
inputs returns at once. Every podman call uses CONTAINERS_CONF=packaging/containers.conf.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build" / "oci"
CONTAINERS_CONF = REPO / "packaging" / "containers.conf"
CONSTRAINTS = REPO / "packaging" / "constraints.txt"
SUITE = "bookworm"
SERVER_REPO = "localhost/trueup-server"
# Tagged so that the shipped manifests' `postgres:15-bookworm` resolves to it locally.
POSTGRES_REPO = "localhost/postgres"
POSTGRES_TAG = "15-bookworm"
INPUTS_LABEL = "org.trueup.inputs"
UID = 10001
# Where the source is published, for the org.opencontainers.image.source label (none by default).
SOURCE_ENV = "TRUEUP_IMAGE_SOURCE"
# Debian's pip wheel (python3-pip-whl, bookworm) installs the venv; the image keeps no pip.
PIP_WHEEL_GLOB = "/usr/share/python-wheels/pip-*.whl"

# Left out of every root: nothing in the image reads them.
DPKG_EXCLUDES = [
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
    "/usr/share/linda/*",
    "/usr/share/bug/*",
]
DPKG_INCLUDES = ["/usr/share/doc/*/copyright"]

SERVER_ENV = {
    "PATH": "/opt/trueup/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "TRUEUP_SERVER_LISTEN": "0.0.0.0:8443",
    "TRUEUP_SERVER_KEY_FILE": "/run/secrets/trueup/server.key",
    "TRUEUP_SERVER_DATA_DIR": "/var/lib/trueup-server",
    "TRUEUP_SERVER_CREATE_KEY": "false",
    # uvicorn's start-up lines and errors reach `podman logs` (warning, the CLI's default, is silent).
    "TRUEUP_SERVER_LOG_LEVEL": "info",
    "HOME": "/var/lib/trueup-server",
}

POSTGRES_ENTRYPOINT = r"""#!/bin/sh
# The official postgres image's environment contract, on Debian's postgresql-15.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres: POSTGRES_PASSWORD is not set (the password network clients log in with)" >&2
    exit 1
fi
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /run/postgresql
    chown postgres:postgres "$PGDATA" /run/postgresql
    chmod 0700 "$PGDATA"
else
    as_postgres() { "$@"; }
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    chown postgres "$pwfile" 2>/dev/null || true
    as_postgres initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        as_postgres pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
        as_postgres psql -v ON_ERROR_STOP=1 -q --username="$POSTGRES_USER" --dbname=postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\""
        as_postgres pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
    fi
    echo "postgres: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid=postgres --regid=postgres --init-groups \
        postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
"""


class BuildError(RuntimeError):
    """A build step failed; the message names the step and its output."""


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        env=podman_env(),
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise BuildError(f"podman {shlex.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def _run(argv: list[str], what: str, **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise BuildError(
            f"{what} failed ({proc.returncode}): {shlex.join(argv)}\n{proc.stdout}{proc.stderr}"
        )


def version() -> str:
    for line in (REPO / "trueup" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise BuildError("trueup/__init__.py: no __version__ line")


def _hash_files(paths: list[Path], extra: str) -> str:
    digest = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def server_inputs() -> str:
    """Hash of everything the server image is built from."""
    files = [
        p
        for p in (REPO / "trueup").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    ]
    files += [REPO / "pyproject.toml", CONSTRAINTS, Path(__file__).resolve()]
    return _hash_files(files, f"server {SUITE}")


def postgres_inputs() -> str:
    """Hash of what the PostgreSQL image is built from (its entry point and build steps)."""
    import inspect

    steps = inspect.getsource(build_postgres_image) + inspect.getsource(_mmdebstrap)
    return _hash_files([], f"postgres {SUITE} {POSTGRES_ENTRYPOINT} {steps} {CLEANUP_HOOK}")


def _image_label(name: str) -> str | None:
    proc = podman(
        "image", "inspect", "--format", f'{{{{index .Labels "{INPUTS_LABEL}"}}}}', name, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


@contextmanager
def _lock(name: str) -> Iterator[None]:
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _require_tools() -> None:
    missing = [tool for tool in ("mmdebstrap", "podman") if shutil.which(tool) is None]
    if missing:
        raise BuildError(
            f"image builds need {', '.join(missing)} (apt-get install {' '.join(missing)})"
        )
    if os.geteuid() != 0:
        raise BuildError("image builds run mmdebstrap in root mode: run as root")


def _mmdebstrap(
    out: Path, includes: list[str], customize: list[str], essential: list[str] | None = None
) -> None:
    argv = ["mmdebstrap", "--variant=essential", "--mode=root", "--format=tar", "--quiet"]
    # Merged /usr set up by mmdebstrap's own hook (with usr-is-merged), not by the usrmerge
    # package and the 50 MB of perl it pulls in.
    argv.append("--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr")
    argv.append("--include=" + ",".join(includes))
    argv.append("--aptopt=APT::Install-Recommends false")
    argv += [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
    argv += [f"--dpkgopt=path-include={p}" for p in DPKG_INCLUDES]
    for hook in essential or []:
        argv.append(f"--essential-hook={hook}")
    for hook in customize:
        argv.append(f"--customize-hook={hook}")
    argv += [SUITE, str(out)]
    # The host's pip settings (index, find-links) do not apply inside the root.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    _run(argv, "mmdebstrap", env=env)


CLEANUP_HOOK = (
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old '
    '"$1"/var/log/* "$1"/usr/share/doc/*/changelog* "$1"/tmp/* '
    '"$1"/var/lib/dpkg/*-old "$1"/usr/share/common-licenses'
)
# glibc's iconv modules: Python's codecs are its own.
GCONV_HOOK = 'rm -rf "$1"/usr/lib/x86_64-linux-gnu/gconv'


def _wheelhouse(work: Path) -> Path:
    wheels = work / "wheels"
    wheels.mkdir()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(wheels),
            "--constraint",
            str(CONSTRAINTS),
            f"{REPO}[server]",
        ],
        "building the wheels (pip wheel)",
        env={**os.environ, "PIP_CONSTRAINT": ""},
    )
    pips = sorted(Path("/").glob(PIP_WHEEL_GLOB.lstrip("/")))
    if not pips:
        raise BuildError(f"no pip wheel at {PIP_WHEEL_GLOB} (apt-get install python3-pip-whl)")
    shutil.copy(pips[-1], wheels / pips[-1].name)
    shutil.copy(CONSTRAINTS, wheels / "constraints.txt")
    return wheels


def _provenance() -> list[str]:
    """Labels naming the commit the image was built from and, if set, where it is published."""
    labels = []
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode == 0:
        labels.append(f"LABEL org.opencontainers.image.revision={head.stdout.strip()}")
    if os.environ.get(SOURCE_ENV):
        labels.append(f"LABEL org.opencontainers.image.source={os.environ[SOURCE_ENV]}")
    return labels


def _import(tarball: Path, names: list[str], changes: list[str]) -> None:
    argv = ["import", "--quiet"]
    for change in changes:
        argv += ["--change", change]
    argv += [str(tarball), names[0]]
    podman(*argv)
    for name in names[1:]:
        podman("tag", names[0], name)


def _prune(repo: str, keep: str, older_than: float = 6 * 3600) -> None:
    """Remove this repository's `<version>-<hash>` images other than `keep` once they are
    older than `older_than` seconds (never one a container uses: no --force), so rebuilds
    after code changes do not fill the disk while a concurrent run's image stays."""
    listing = podman("images", "--format", "json", repo, check=False)
    if listing.returncode != 0:
        return
    now = time.time()
    for entry in json.loads(listing.stdout or "[]"):
        if now - float(entry.get("Created", now)) < older_than:
            continue
        for name in entry.get("Names") or []:
            if name != keep and name.startswith(f"{repo}:") and "-" in name.rsplit(":", 1)[1]:
                podman("rmi", name, check=False)


def build_server_image(force: bool = False) -> str:
    """Build (or reuse) the control plane image; returns its inputs-specific name."""
    _require_tools()
    digest = server_inputs()
    ver = version()
    name = f"{SERVER_REPO}:{ver}-{digest[:12]}"
    with _lock("server"):
        if not force and _image_label(name) == digest:
            if _image_label(f"{SERVER_REPO}:{ver}") != digest:
                podman("tag", name, f"{SERVER_REPO}:{ver}")
            return name
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=BUILD, prefix="server-") as tmp:
            work = Path(tmp)
            wheels = _wheelhouse(work)
            pip = next(wheels.glob("pip-*.whl")).name
            customize = [
                f'mkdir -p "$1/tmp/wheels" && cp -a {shlex.quote(str(wheels))}/. "$1/tmp/wheels/"',
                'chroot "$1" python3 -m venv --without-pip /opt/trueup',
                'chroot "$1" /opt/trueup/bin/python /tmp/wheels/'
                + pip
                + "/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check --no-compile"
                " --find-links /tmp/wheels -c /tmp/wheels/constraints.txt 'trueup[server]'",
                # Every module byte-compiled now: the root file system is read-only at run time.
                # Unchecked hashes: the tarball clamps file times, which would make every
                # timestamp-checked .pyc stale (and each start compile from source).
                'chroot "$1" python3 -m compileall -f -q -j 0 --invalidation-mode unchecked-hash'
                " /usr/lib/python3.11 /opt/trueup >/dev/null",
                # The `essential` root has no useradd: the entries are written directly.
                f'echo "trueup:x:{UID}:{UID}:trueup control plane:/var/lib/trueup-server:'
                f'/usr/sbin/nologin" >> "$1/etc/passwd"',
                f'echo "trueup:x:{UID}:" >> "$1/etc/group"',
                'mkdir -p "$1/var/lib/trueup-server" "$1/run/secrets/trueup"',
                f'chown {UID}:{UID} "$1/var/lib/trueup-server" && chmod 0700 "$1/var/lib/trueup-server"',
                CLEANUP_HOOK,
                GCONV_HOOK,
            ]
            tarball = work / "root.tar"
            _mmdebstrap(tarball, ["python3", "ca-certificates"], customize)
            env = [f"ENV {key}={value}" for key, value in SERVER_ENV.items()]
            _import(
                tarball,
                [name, f"{SERVER_REPO}:{ver}"],
                [
                    f"USER {UID}:{UID}",
                    "WORKDIR /var/lib/trueup-server",
                    *env,
                    "EXPOSE 8443",
                    'ENTRYPOINT ["/opt/trueup/bin/trueup", "server", "run"]',
                    "STOPSIGNAL SIGTERM",
                    f"LABEL {INPUTS_LABEL}={digest}",
                    f"LABEL org.opencontainers.image.version={ver}",
                    *_provenance(),
                    "LABEL org.opencontainers.image.title=trueup-server",
                    "LABEL org.opencontainers.image.base.name=debian:bookworm",
                ],
            )
        print(f"built {name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        _prune(SERVER_REPO, name)
        return name


def build_postgres_image(force: bool = False) -> str:
    """Build (or reuse) the PostgreSQL trial image; returns `localhost/postgres:15-bookworm`."""
    _require_tools()
    digest = postgres_inputs()
    name = f"{POSTGRES_REPO}:{POSTGRES_TAG}"
    keyed = f"{POSTGRES_REPO}:{POSTGRES_TAG}-{digest[:12]}"
    with _lock("postgres"):
        if not force and _image_label(keyed) == digest:
            if _image_label(name) != digest:
                podman("tag", keyed, name)
            return name
        with tempfile.TemporaryDirectory(dir=BUILD, prefix="postgres-") as tmp:
            work = Path(tmp)
            entry = work / "docker-entrypoint.sh"
            entry.write_text(POSTGRES_ENTRYPOINT)
            entry.chmod(0o755)
            customize = [
                # Debian creates a cluster on install; the entry point makes its own in PGDATA.
                'rm -rf "$1/etc/postgresql/15" "$1/var/lib/postgresql/15"',
                'mkdir -p "$1/var/lib/postgresql/data" "$1/run/postgresql"',
                'chroot "$1" chown postgres:postgres /var/lib/postgresql/data /run/postgresql',
                f'install -m 0755 {shlex.quote(str(entry))} "$1/usr/local/bin/docker-entrypoint.sh"',
                CLEANUP_HOOK,
            ]
            tarball = work / "root.tar"
            _mmdebstrap(tarball, ["postgresql-15"], customize)
            _import(
                tarball,
                [keyed, name],
                [
                    "ENV PATH=/usr/lib/postgresql/15/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "ENV PGDATA=/var/lib/postgresql/data",
                    "ENV LANG=C.UTF-8",
                    "EXPOSE 5432",
                    "STOPSIGNAL SIGINT",
                    'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
                    f"LABEL {INPUTS_LABEL}={digest}",
                    "LABEL org.opencontainers.image.title=postgres (Debian postgresql-15, trial)",
                ],
            )
        return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build_image", description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="?", choices=("server", "postgres", "all"), default="server")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    try:
        if args.which in ("server", "all"):
            print(build_server_image(args.force))
        if args.which in ("postgres", "all"):
            print(build_postgres_image(args.force))
    except BuildError as exc:
        print(f"build_image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
