"""The proxy subsystem on fakes: section paths, rendering, plans, steps, observation, rollback."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

import trueup.subsystems.proxy.subsystem as proxy_module
from tests.routers import base_document
from trueup.model.document import DocumentError, parse_document
from trueup.model.health import SubsystemHealth
from trueup.subsystems.base import Scope, StepError
from trueup.subsystems.proxy.section import ProxySection, split_endpoint
from trueup.subsystems.proxy.subsystem import CONFIG, LOADED, RUNNING, ProxySubsystem
from trueup.system.daemonspec import DaemonStatus
from trueup.system.fake import FakeDaemons, FakeFiles, FakeNetlink, FakeRunner
from trueup.system.haproxy import (
    HaproxyError,
    haproxy_paths,
    parse_proc,
    parse_stat,
    render_config,
)
from trueup.system.runner import Completed
from trueup.system.sources import Sources

STAT_HEADER = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight\n"
PROC = (
    "#<PID>          <type>          <reloads>       <uptime>        <version>\n"
    "100             master          {reloads} [failed: {failed}]   0d00h00m02s     2.6.12-1\n"
    "# workers\n"
    "{worker}            worker          0               0d00h00m01s     2.6.12-1\n"
    "# programs\n"
)


def proxy(**extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": "web",
        "bind": "203.0.113.1:80",
        "backend": {
            "servers": [{"name": "app1", "address": "192.0.2.10:8080"}],
            "health_check": {"path": "/healthz", "interval": "2s"},
        },
    }
    out.update(extra)
    return out


def document(proxies: list[dict[str, Any]] | None) -> Any:
    extra = {} if proxies is None else {"proxies": proxies}
    return parse_document(base_document(**extra), "test")


def errors(proxies: list[dict[str, Any]]) -> str:
    with pytest.raises(DocumentError) as info:
        document(proxies)
    return str(info.value)


# -- section ---------------------------------------------------------------------------
def test_section_errors_name_their_path() -> None:
    assert "spec.proxies[1].name" in errors([proxy(), proxy(bind="203.0.113.1:81")])
    assert "duplicate proxy name web" in errors([proxy(), proxy(bind="203.0.113.1:81")])
    text = errors([proxy(), proxy(name="other")])
    assert "spec.proxies[1].bind" in text and "also bound by [0]" in text
    assert "spec.proxies[1].bind" in errors([proxy(bind="*:80"), proxy(name="b")])
    assert "spec.proxies[0].bind" in errors([proxy(bind="203.0.113.1")])
    assert "spec.proxies[0].bind" in errors([proxy(bind="2001:db8::1:80")])
    assert "spec.proxies[0].bind" in errors([proxy(bind="203.0.113.1:70000")])
    empty = proxy(backend={"servers": []})
    assert "spec.proxies[0].backend.servers" in errors([empty])
    twice = proxy(
        backend={"servers": [{"name": "a", "address": "192.0.2.1:1"}] * 2},
    )
    assert "spec.proxies[0].backend.servers[1].name" in errors([twice])
    bad = proxy(backend={"servers": [{"name": "a", "address": "nowhere:80"}]})
    assert "spec.proxies[0].backend.servers[0].address" in errors([bad])
    tcp = proxy(mode="tcp")
    assert "spec.proxies[0].backend.health_check.path" in errors([tcp])
    assert "spec.proxies[0].timeouts.client" in errors([proxy(timeouts={"client": "soon"})])
    assert "spec.proxies[0].tls.certificate" in errors([proxy(tls={"certificate": "rel.pem"})])


def test_section_canonical_forms() -> None:
    doc = document([proxy(bind="[2001:DB8::1]:443", timeouts={"client": 500})])
    section = doc.spec.section("proxies", ProxySection)
    assert section is not None
    entry = section.canonical()[0]
    assert entry["bind"] == "[2001:db8::1]:443"
    assert entry["timeouts"] == {"connect": "5s", "client": "500ms", "server": "30s"}
    assert split_endpoint("[2001:db8::1]:443") == ("2001:db8::1", 443)
    assert split_endpoint("*:80") == ("*", 80)


# -- rendering -------------------------------------------------------------------------
def canonical(*proxies: dict[str, Any]) -> list[dict[str, Any]]:
    section = document(list(proxies)).spec.section("proxies", ProxySection)
    assert section is not None
    return section.canonical()


def test_render_leaves_out_frontends_whose_address_is_absent(tmp_path: Path) -> None:
    paths = haproxy_paths(tmp_path)
    entries = canonical(
        proxy(),
        proxy(
            name="api",
            bind="*:8443",
            mode="tcp",
            backend={"servers": [{"name": "a", "address": "[2001:db8::5]:9000", "check": False}]},
        ),
    )
    text, omitted = render_config(paths, entries, present={"198.51.100.2"})
    assert omitted == ["web"]
    assert "frontend api" in text and "frontend web" not in text
    assert (
        "server a [2001:db8::5]:9000 weight 1" in text
        and "check" not in text.split("server a")[1].splitlines()[0]
    )
    assert f"stats socket {paths.stats} mode 600 level admin expose-fd listeners" in text
    full, none = render_config(paths, entries, present=None)
    assert none == [] and "bind 203.0.113.1:80" in full
    assert "option httpchk GET /healthz" in full and "default-server inter 2s" in full
    tls = canonical(proxy(tls={"certificate": "/etc/trueup/tls/web.pem"}))
    assert (
        "bind 203.0.113.1:80 ssl crt /etc/trueup/tls/web.pem" in render_config(paths, tls, None)[0]
    )


def test_parse_stat_and_proc() -> None:
    stats = parse_stat(
        STAT_HEADER
        + "web,FRONTEND,,,0,0,9979,0,0,0,0,0,0,,,,,OPEN,\n"
        + "web,app1,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN,1\n"
        + "web,BACKEND,0,0,0,0,998,0,0,0,0,0,,0,0,0,0,DOWN,0\n"
    )
    assert stats.frontends == {"web": "OPEN"}
    assert stats.servers == {"web": {"app1": "DOWN"}}
    with pytest.raises(HaproxyError):
        parse_stat("Unknown command\n")
    proc = parse_proc(PROC.format(reloads=3, failed=1, worker=200))
    assert (proc.reloads, proc.failed, proc.workers, proc.version) == (3, 1, (200,), "2.6.12-1")


# -- the subsystem on fakes ------------------------------------------------------------
class FakeHaproxy:
    """HAProxy's sockets in memory: `show proc` and `show stat` from what was 'loaded'."""

    def __init__(self, daemons: FakeDaemons) -> None:
        self.daemons = daemons
        self.reloads = 0
        self.failed = 0
        self.frontends: list[str] = []

    def load(self) -> None:
        paths = haproxy_paths(self.daemons.run_dir("haproxy"))
        text = paths.config.read_text()
        self.frontends = [ln.split()[1] for ln in text.splitlines() if ln.startswith("frontend")]

    def query(self, path: Path, command: str, timeout: float = 5.0) -> str:
        if not self.daemons.alive.get("haproxy"):
            raise HaproxyError(f"{path}: connection refused")
        if command == "show proc":
            return PROC.format(reloads=self.reloads, failed=self.failed, worker=300 + self.reloads)
        rows = "".join(f"{n},FRONTEND,,,0,0,1,0,0,0,0,0,0,,,,,OPEN,\n" for n in self.frontends)
        return STAT_HEADER + rows


class CheckingRunner(FakeRunner):
    """`haproxy -c` answers valid unless `refusal` is set."""

    refusal = ""

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        self.calls.append(tuple(argv))
        if argv[:2] == ["haproxy", "-c"]:
            if self.refusal:
                return Completed(tuple(argv), 1, "", self.refusal)
            return Completed(tuple(argv), 0, "", "")
        return super().run(argv, input=input, timeout=timeout)


class SignalledDaemons(FakeDaemons):
    def __init__(self, run_root: Path) -> None:
        super().__init__(run_root)
        self.haproxy = FakeHaproxy(self)
        self.signals: list[int] = []

    def run_dir(self, name: str) -> Path:
        path = self.run_root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def ensure(self, spec: Any) -> DaemonStatus:
        started = not self.alive.get(spec.name)
        status = super().ensure(spec)
        if started:
            self.haproxy.load()
        return status

    def signal(self, name: str, sig: int) -> bool:
        self.signals.append(sig)
        if not self.alive.get(name):
            return False
        self.haproxy.reloads += 1
        self.haproxy.load()
        return True


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sources, SignalledDaemons]:
    daemons = SignalledDaemons(tmp_path / "run")
    monkeypatch.setattr(proxy_module, "query", daemons.haproxy.query)
    netlink = FakeNetlink({"lo": 1, "mgmt0": 2, "lan0": 3})
    netlink.set_link("lan0", state="up")
    netlink.add_address("lan0", "203.0.113.1/24")
    runner = CheckingRunner()
    sources = Sources(netlink=netlink, runner=runner, daemons=daemons, state_dir=tmp_path)
    return sources, daemons


def converge(sources: Sources, doc: Any) -> list[str]:
    sub = ProxySubsystem()
    scope = Scope()
    actions: list[str] = []
    for _ in range(3):
        plan = sub.plan(sub.desired(doc, scope), sub.observe(sources, scope), scope)
        if not plan.changes:
            return actions
        for step in plan.steps:
            actions.append(step.action)
            sub.execute(sources, step)
    raise AssertionError("did not converge")


def test_start_then_reload_then_stop(rig: tuple[Sources, SignalledDaemons]) -> None:
    sources, daemons = rig
    assert converge(sources, document([proxy()])) == ["write-config", "reload"]
    assert daemons.alive["haproxy"] and daemons.signals == []
    sub = ProxySubsystem()
    observed = sub.observe(sources, Scope())
    assert observed[RUNNING] is True and observed[LOADED] is True
    assert observed["spec.proxies[web].bound"] is True
    # A changed document is written and reloaded with SIGUSR2, never restarted.
    changed = document([proxy(), proxy(name="api", bind="203.0.113.1:81")])
    assert converge(sources, changed) == ["write-config", "reload"]
    assert daemons.signals == [signal.SIGUSR2]
    assert daemons.haproxy.frontends == ["api", "web"]
    assert ("restart", "haproxy") not in daemons.events
    assert converge(sources, changed) == []
    assert converge(sources, document(None)) == ["stop"]
    assert not daemons.alive["haproxy"]
    assert not haproxy_paths(daemons.run_dir("haproxy")).config.exists()


def test_refused_configuration_changes_nothing(rig: tuple[Sources, SignalledDaemons]) -> None:
    sources, daemons = rig
    converge(sources, document([proxy()]))
    paths = haproxy_paths(daemons.run_dir("haproxy"))
    before = paths.config.read_text()
    assert isinstance(sources.runner, CheckingRunner)
    sources.runner.refusal = "[ALERT] config : unable to load certificate from file '/x.pem'."
    sub = ProxySubsystem()
    doc = document([proxy(tls={"certificate": "/x.pem"})])
    plan = sub.plan(sub.desired(doc, Scope()), sub.observe(sources, Scope()), Scope())
    with pytest.raises(StepError, match="unable to load certificate"):
        sub.execute(sources, plan.steps[0])
    assert paths.config.read_text() == before
    assert not paths.candidate.exists()
    assert daemons.signals == []
    assert sub.observe(sources, Scope())[CONFIG] == canonical(proxy())


def test_absent_bind_address_serves_the_others_and_is_pending(
    rig: tuple[Sources, SignalledDaemons],
) -> None:
    sources, daemons = rig
    doc = document([proxy(), proxy(name="far", bind="192.0.2.99:80")])
    sub = ProxySubsystem()
    assert converge(sources, doc) == ["write-config", "reload"]
    assert sub.observe(sources, Scope())["spec.proxies[far].bound"] is True  # it waits
    assert daemons.haproxy.frontends == ["web"]
    health = sub.condition(sources, doc)
    assert health is not None and health[0] is SubsystemHealth.PENDING and "192.0.2.99" in health[1]
    report = sub.report(sources, Scope())
    assert report["frontends"]["far"]["bound"] is False
    assert report["frontends"]["web"]["bound"] is True
    assert "192.0.2.99" in report["frontends"]["far"]["reason"]
    assert isinstance(sources.netlink, FakeNetlink)
    sources.netlink.add_address("lan0", "192.0.2.99/32")
    assert converge(sources, doc) == ["write-config", "reload"]
    assert daemons.haproxy.frontends == ["far", "web"]
    assert sub.condition(sources, doc) is None


def test_hand_edit_and_stale_load_are_drift(rig: tuple[Sources, SignalledDaemons]) -> None:
    sources, daemons = rig
    doc = document([proxy()])
    converge(sources, doc)
    paths = haproxy_paths(daemons.run_dir("haproxy"))
    paths.config.write_text(paths.config.read_text() + "# by hand\n")
    sub = ProxySubsystem()
    observed = sub.observe(sources, Scope())
    assert str(observed[CONFIG]).startswith("edited outside trueup (sha256:")
    assert observed[LOADED] is False
    assert converge(sources, doc) == ["write-config", "reload"]
    assert "# by hand" not in paths.config.read_text()
    # HAProxy gone: started again.
    daemons.crash("haproxy")
    assert sub.observe(sources, Scope())[RUNNING] is None
    assert converge(sources, doc) == ["write-config", "reload"]
    assert daemons.alive["haproxy"]


def test_rollback_restores_the_previous_file_and_running_state(
    rig: tuple[Sources, SignalledDaemons],
) -> None:
    sources, daemons = rig
    sub = ProxySubsystem()
    first = document([proxy()])
    converge(sources, first)
    before = sub.observe(sources, Scope())
    paths = haproxy_paths(daemons.run_dir("haproxy"))
    text = paths.config.read_text()
    second = document([proxy(name="api", bind="203.0.113.1:81")])
    # Interrupted between writing and reloading: the file is new, the load is not.
    plan = sub.plan(sub.desired(second, Scope()), before, Scope())
    sub.execute(sources, plan.steps[0])
    assert sub.observe(sources, Scope())[LOADED] is False
    exact = Scope(exact=True)
    restore = sub.plan(before, sub.observe(sources, exact), exact)
    for step in restore.steps:
        sub.execute(sources, step)
    assert paths.config.read_text() == text
    assert daemons.haproxy.frontends == ["web"]
    assert sub.plan(before, sub.observe(sources, exact), exact).changes is False
    # A before-image without proxies stops HAProxy and removes its file.
    nothing = sub.desired(document(None), exact)
    for step in sub.plan(nothing, sub.observe(sources, exact), exact).steps:
        sub.execute(sources, step)
    assert not daemons.alive["haproxy"] and not paths.config.exists()


def test_prepare_refuses_a_missing_certificate(tmp_path: Path) -> None:
    doc = document([proxy(tls={"certificate": str(tmp_path / "none.pem")})])
    with pytest.raises(ValueError, match=r"spec\.proxies\[0\]\.tls\.certificate"):
        ProxySubsystem().prepare(doc)


def test_prepare_reads_the_certificate_through_its_files() -> None:
    doc = document([proxy(tls={"certificate": "/etc/trueup/tls/web.pem"})])
    ProxySubsystem(FakeFiles({"/etc/trueup/tls/web.pem": "-----BEGIN CERTIFICATE-----"})).prepare(
        doc
    )
    with pytest.raises(ValueError, match="No such file or directory"):
        ProxySubsystem(FakeFiles()).prepare(doc)


# -- injection into haproxy.cfg --------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"name": "web\n"}, "spec.proxies[0].name"),
        (
            {"backend": {"servers": [{"name": "a\n", "address": "192.0.2.10:80"}]}},
            "spec.proxies[0].backend.servers[0].name",
        ),
        (
            {
                "backend": {
                    "servers": [{"name": "a", "address": "192.0.2.10:80"}],
                    "health_check": {"path": "/x#\"\\${HOME}'"},
                }
            },
            "spec.proxies[0].backend.health_check.path",
        ),
        (
            {
                "backend": {
                    "servers": [{"name": "a", "address": "192.0.2.10:80"}],
                    "health_check": {"path": "/" + "a" * 5000},
                }
            },
            "spec.proxies[0].backend.health_check.path",
        ),
        ({"tls": {"certificate": "/etc/x.pem\rbind *:22"}}, "spec.proxies[0].tls.certificate"),
        ({"tls": {"certificate": '/etc/"x.pem'}}, "spec.proxies[0].tls.certificate"),
    ],
)
def test_injection_into_the_config_is_refused_with_its_path(
    extra: dict[str, Any], path: str
) -> None:
    assert path in errors([proxy(**extra)])


def test_a_frontend_on_the_management_api_port_is_refused() -> None:
    # The API binds the wildcard by default: any frontend on its port would take it.
    assert "spec.proxies[0].bind" in errors([proxy(bind="203.0.113.1:7443")])
    assert "management API" in errors([proxy(bind="*:7443")])
    # A frontend on another address than a named API bind is harmless.
    raw = base_document(
        proxies=[proxy(bind="203.0.113.1:7443")],
        management={
            "interface": "mgmt0",
            "addresses": ["198.51.100.2/24"],
            "gateway": "198.51.100.1",
            "api": {"bind": "management"},
        },
    )
    assert parse_document(raw, "test").spec.section("proxies") is not None
    raw["spec"]["proxies"] = [proxy(bind="198.51.100.2:7443")]
    with pytest.raises(DocumentError, match=r"spec\.proxies\[0\]\.bind"):
        parse_document(raw, "test")
