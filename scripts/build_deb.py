"""`make package`: the router agent as a Debian package, `dist/trueup-agent_<version>_<arch>.deb`.

1. The wheel is built from a copy of the source stamped with the package
   version (`PACKAGE_VERSION`, else pyproject's), its backend pinned by
   packaging/deb/build-constraints.txt; the distributions it needs are
   fetched beside it, every one pinned by packaging/constraints.txt (the
   agent only: no `server` extra).
2. In a bookworm build root (mmdebstrap, cached under the build cache keyed by
   a hash of what goes into it), offline, a virtual environment is made at
   /opt/trueup/package with bookworm's python3 and the wheels are installed
   into it; pip is removed and everything byte-compiled.
3. The tree (environment, /usr/bin/trueup, the systemd unit, docs, the
   maintainer scripts of packaging/deb/) is built with
   `dpkg-deb --root-owner-group --build`.

A package whose inputs (source, packaging files, version, build root) were
built before is copied from the cache. `python -m scripts.build_deb
[--version V] [--out DIR]`.
"""

from __future__ import annotations

import argparse
import email.utils
import fcntl
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["BuildError", "build", "control_text", "inputs_digest", "package_version"]

REPO = Path(__file__).resolve().parent.parent
PACKAGING = REPO / "packaging"
DEB = PACKAGING / "deb"
NAME = "trueup-agent"
SUITE = "bookworm"
ROOT_PACKAGES = ("python3", "python3-venv")
DEFAULT_CACHE = Path("/var/cache/trueup-build")
# Identical in PEP 440 and Debian, and ordered the same by both: 1.2.3, 1.2.3+t1, 1.2.3+build.7
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*(\+[a-z0-9]+(\.[a-z0-9]+)*)?")
_PYPROJECT_VERSION = re.compile(r'^version = "([^"]*)"$', re.MULTILINE)
_INIT_VERSION = re.compile(r'^__version__ = "([^"]*)"$', re.MULTILINE)

# libc6: the compiled modules are manylinux2014 wheels (glibc 2.17 or later).
DEPENDS = "python3 (>= 3.11~), python3 (<< 3.12), libc6 (>= 2.17), iproute2"
RECOMMENDS = "nftables"
SUGGESTS = (
    "kea-dhcp4-server, kea-dhcp6-server, knot, haproxy, keepalived, wireguard-tools, udhcpc, "
    "frr, frr-pythontools"
)


MAINTAINER = "trueup maintainers <trueup@localhost>"


class BuildError(Exception):
    """A build that cannot go on; the message names what is wrong and where."""


def package_version(pyproject: Path, override: str | None = None) -> str:
    """The package version: `override` (PACKAGE_VERSION) when given, else pyproject's."""
    if override is not None:
        where = "PACKAGE_VERSION"
        version = override.strip()
    else:
        where = str(pyproject)
        try:
            text = pyproject.read_text()
        except OSError as exc:
            raise BuildError(f"{pyproject}: cannot read the project version: {exc}") from exc
        found = _PYPROJECT_VERSION.search(text)
        if found is None:
            raise BuildError(f'{pyproject}: no `version = "..."` line in [project]')
        version = found.group(1)
    if not _VERSION.fullmatch(version):
        raise BuildError(
            f"{where}: version {version!r} is not of the form N.N.N or N.N.N+label "
            "(digits and dots, optionally + and lowercase letters, digits and dots)"
        )
    return version


def control_text(version: str, arch: str, installed_kib: int) -> str:
    return (
        f"Package: {NAME}\n"
        f"Version: {version}\n"
        f"Architecture: {arch}\n"
        f"Maintainer: {MAINTAINER}\n"
        f"Installed-Size: {installed_kib}\n"
        f"Depends: {DEPENDS}\n"
        f"Recommends: {RECOMMENDS}\n"
        f"Suggests: {SUGGESTS}\n"
        "Section: net\n"
        "Priority: optional\n"
        "Description: trueup router agent\n"
        " Keeps a Linux edge router at its desired configuration: management first,\n"
        " then links, addresses, routes, firewall, DHCP, DNS, HA, proxy and WireGuard.\n"
        " An upgrade checks the new release with `trueup preflight` before it\n"
        " replaces the running agent.\n"
    )


def changelog_text(version: str, when: float) -> str:
    """The package's Debian changelog: one entry for this build."""
    return (
        f"{NAME} ({version}) unstable; urgency=medium\n\n"
        f"  * trueup {version}.\n\n"
        f" -- {MAINTAINER}  {email.utils.format_datetime(datetime.fromtimestamp(when, UTC))}\n"
    )


def _files_under(path: Path) -> Iterator[Path]:
    for item in sorted(path.rglob("*")):
        if item.is_file() and "__pycache__" not in item.parts and item.suffix != ".pyc":
            yield item


def _hash_files(paths: list[Path], extra: str) -> str:
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
        digest.update(str(name).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def root_digest() -> str:
    return hashlib.sha256(f"{SUITE} apt {' '.join(ROOT_PACKAGES)}".encode()).hexdigest()[:16]


def inputs_digest(version: str) -> str:
    """Hash of everything that goes into the package: a change to any of it means a new build."""
    paths = [
        *_files_under(REPO / "trueup"),
        *_files_under(DEB),
        REPO / "pyproject.toml",
        REPO / "README.md",
        PACKAGING / "constraints.txt",
        PACKAGING / "trueup-agent.service",
        REPO / "docs" / "startup.md",
        Path(__file__).resolve(),
    ]
    return _hash_files(paths, f"{version} {root_digest()}")


def _run(argv: list[str], **kwargs: object) -> None:
    try:
        subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]
    except FileNotFoundError as exc:
        raise BuildError(f"{argv[0]} is not installed (apt-get install {argv[0]})") from exc
    except subprocess.CalledProcessError as exc:
        raise BuildError(f"{' '.join(argv[:3])}… failed with exit code {exc.returncode}") from exc


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build_root(cache: Path) -> Path:
    """The extracted bookworm build root, made once per root digest."""
    digest = root_digest()
    root = cache / f"deb-root-{digest}"
    if (root / ".complete").exists():
        return root
    tarball = cache / f"deb-root-{digest}.tar"
    if not tarball.exists():
        partial = tarball.with_suffix(".tar.partial")
        _run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=apt",
                "--format=tar",
                f"--include={','.join(ROOT_PACKAGES)}",
                SUITE,
                str(partial),
            ]
        )
        partial.rename(tarball)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    _run(["tar", "-C", str(root), "-xf", str(tarball)])
    (root / ".complete").touch()
    return root


def _stamped_source(dest: Path, version: str) -> None:
    shutil.copytree(
        REPO / "trueup", dest / "trueup", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    shutil.copy2(REPO / "README.md", dest / "README.md")
    pyproject = (REPO / "pyproject.toml").read_text()
    (dest / "pyproject.toml").write_text(
        _PYPROJECT_VERSION.sub(f'version = "{version}"', pyproject, count=1)
    )
    init = dest / "trueup" / "__init__.py"
    init.write_text(_INIT_VERSION.sub(f'__version__ = "{version}"', init.read_text(), count=1))


def _wheelhouse(dest: Path, version: str) -> None:
    """The stamped wheel and every distribution it needs, pinned, fetched on the build host.

    The build root stays offline: it installs from this directory alone.
    """
    if sys.version_info[:2] != (3, 11):
        raise BuildError(
            f"{sys.executable} is Python {sys.version_info[0]}.{sys.version_info[1]}; the package's "
            "wheels are fetched for bookworm's Python 3.11 (run `make package` on Debian 12)"
        )
    with tempfile.TemporaryDirectory(prefix="trueup-src-") as src:
        _stamped_source(Path(src), version)
        env = {**os.environ, "PIP_CONSTRAINT": str(DEB / "build-constraints.txt")}
        pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
        _run([*pip, "wheel", "--no-deps", "-w", str(dest), src], env=env)
    wheel = next(dest.glob("trueup-*.whl"))
    _run(
        [
            *pip,
            "download",
            "--only-binary=:all:",
            "-c",
            str(PACKAGING / "constraints.txt"),
            "-d",
            str(dest),
            str(wheel),
        ]
    )


def _make_venv(root: Path, version: str) -> Path:
    """Build /opt/trueup/package inside the build root; returns its path on the host."""
    work = root / "build"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(root / "opt" / "trueup", ignore_errors=True)
    work.mkdir()
    _wheelhouse(work / "wheels", version)
    shutil.copy2(PACKAGING / "constraints.txt", work / "constraints.txt")
    shutil.copy2(DEB / "in-root.sh", work / "in-root.sh")
    # A private mount namespace: the mounts vanish with the process, whatever happens.
    script = (
        'set -e; r="$1"; '
        'mount --rbind /dev "$r/dev"; mount -t proc proc "$r/proc"; '
        'exec chroot "$r" /bin/sh /build/in-root.sh'
    )
    _run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(root)],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )
    return root / "opt" / "trueup" / "package"


def _assemble(tree: Path, venv: Path, version: str, arch: str) -> None:
    shutil.copytree(venv, tree / "opt" / "trueup" / "package", symlinks=True)
    usr_bin = tree / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    shutil.copy2(DEB / "trueup", usr_bin / "trueup")
    completions = tree / "usr" / "share" / "bash-completion" / "completions"
    completions.mkdir(parents=True)
    shutil.copy2(DEB / "trueup.bash-completion", completions / "trueup")
    unit_dir = tree / "lib" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    shutil.copy2(PACKAGING / "trueup-agent.service", unit_dir / "trueup-agent.service")
    doc = tree / "usr" / "share" / "doc" / NAME
    (doc / "examples").mkdir(parents=True)
    shutil.copy2(DEB / "copyright", doc / "copyright")
    shutil.copy2(REPO / "docs" / "startup.md", doc / "startup.md")
    shutil.copy2(DEB / "desired.yaml.example", doc / "examples" / "desired.yaml")
    changelog = changelog_text(version, time.time()).encode()
    (doc / "changelog.gz").write_bytes(gzip.compress(changelog, compresslevel=9, mtime=0))
    control = tree / "DEBIAN"
    control.mkdir()
    for script in ("postinst", "prerm", "postrm"):
        text = (DEB / script).read_text().replace("@VERSION@", version)
        (control / script).write_text(text)
        (control / script).chmod(0o755)
    for path in tree.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    size = subprocess.run(
        ["du", "-sk", "--exclude=DEBIAN", str(tree)], check=True, capture_output=True, text=True
    )
    (control / "control").write_text(control_text(version, arch, int(size.stdout.split()[0])))


def prune_cache(debs: Path, keep: int = 12) -> None:
    """Keep the `keep` most recently built packages in the cache (each input change adds one)."""
    if not debs.is_dir():
        return
    entries = sorted(debs.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in entries[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def build(version: str, out: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """Build (or take from the cache) the package; returns the path of the .deb in `out`."""
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], check=True, capture_output=True, text=True
    ).stdout.strip()
    filename = f"{NAME}_{version}_{arch}.deb"
    cached = cache / "debs" / inputs_digest(version) / filename
    out.mkdir(parents=True, exist_ok=True)
    with _locked(cache / "deb-build.lock"):
        if not cached.exists():
            root = _build_root(cache)
            venv = _make_venv(root, version)
            with tempfile.TemporaryDirectory(prefix="trueup-deb-") as tmp:
                tree = Path(tmp) / "tree"
                _assemble(tree, venv, version, arch)
                built = Path(tmp) / filename
                _run(
                    ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(built)],
                    stdout=subprocess.DEVNULL,
                )
                cached.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, cached.with_suffix(".partial"))
                cached.with_suffix(".partial").rename(cached)
            prune_cache(cache / "debs")
    target = out / filename
    shutil.copy2(cached, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", help="package version (default: $PACKAGE_VERSION, pyproject)")
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("TRUEUP_BUILD_CACHE", DEFAULT_CACHE))
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        version = package_version(
            REPO / "pyproject.toml", args.version or os.environ.get("PACKAGE_VERSION") or None
        )
        deb = build(version, args.out, args.cache)
    except BuildError as exc:
        print(f"make package: {exc}", file=sys.stderr)
        return 1
    size = deb.stat().st_size
    print(f"{deb} ({size / 1e6:.1f} MB, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
