"""The WireGuard subsystem on fakes: section errors, dump parsing, rendering, facts, plans, steps,
roaming, endpoint resolution, the secret store and `trueup secret`."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import DocumentError, parse_document
from trueup.subsystems.base import StepError
from trueup.subsystems.registry import scope_for
from trueup.subsystems.wireguard import WireguardSubsystem
from trueup.system.fake import FakeDaemons, FakeNetlink
from trueup.system.fakewg import FakePeer, FakeWg, fake_pubkey
from trueup.system.resolve import ResolveError, split_endpoint
from trueup.system.secretstore import (
    MAX_BYTES,
    SecretError,
    list_secrets,
    read_secret,
    secret_digest,
    secret_references,
    write_secret,
)
from trueup.system.sources import Sources
from trueup.system.wireguard import NO_PRESHARED_KEY, PeerConf, parse_dump, render_conf

PRIVATE = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
PSK = "FpCyhws9cxwWoV4xELtfJvjJN+zQVRPISllRWgeopVE="
PEER = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
PEER2 = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="
P = "spec.wireguard.interfaces[wg0]"


def document(**section: Any) -> Any:
    wg: dict[str, Any] = {
        "interfaces": [
            {
                "name": "wg0",
                "private_key": {"secret_ref": "wg0-key"},
                "listen_port": 51820,
                "addresses": ["192.0.2.129/25", "2001:db8:100::1/64"],
                "peers": [
                    {
                        "public_key": PEER,
                        "endpoint": "peer.example.test:51820",
                        "allowed_ips": ["192.0.2.128/25"],
                        "persistent_keepalive": 25,
                        "preshared_key": "secret:wg0-psk",
                    }
                ],
            }
        ]
    }
    wg.update(section)
    return parse_document(base_document(wireguard=wg), "test")


def resolver(answers: dict[str, list[str]]) -> Any:
    def resolve(host: str, port: int, timeout: float) -> list[str]:
        if host not in answers:
            raise ResolveError(f"{host}: no such name")
        return [f"{a}:{port}" for a in answers[host]]

    return resolve


class World:
    def __init__(self, tmp_path: Path, *, kernel: bool = False) -> None:
        self.daemons = FakeDaemons(tmp_path / "run")
        self.netlink = FakeNetlink()
        self.wg = FakeWg(self.daemons, self.netlink, kernel=kernel)
        self.state_dir = tmp_path / "state"
        self.sources = Sources(
            self.netlink, runner=self.wg, state_dir=self.state_dir, daemons=self.daemons
        )
        self.answers = {"peer.example.test": ["203.0.113.7"]}
        self.sub = WireguardSubsystem(resolver(self.answers), refresh=False)

    def secrets(self) -> None:
        write_secret(self.state_dir, "wg0-key", PRIVATE)
        write_secret(self.state_dir, "wg0-psk", PSK)

    def converge(self, doc: Any) -> list[str]:
        scope = scope_for(doc)
        self.sub.prepare(doc)
        desired = self.sub.desired(doc, scope)
        plan = self.sub.plan(desired, self.sub.observe(self.sources, scope), scope)
        for step in plan.steps:
            self.sub.execute(self.sources, step)
        return [s.action for s in plan.steps]

    def drift(self, doc: Any) -> list[str]:
        scope = scope_for(doc)
        desired = self.sub.desired(doc, scope)
        return [d.path for d in self.sub.diff(desired, self.sub.observe(self.sources, scope))]


# -- the section ---------------------------------------------------------------
def test_a_literal_key_is_refused_with_its_path() -> None:
    raw = base_document(
        wireguard={"interfaces": [{"name": "wg0", "private_key": PRIVATE, "peers": []}]}
    )
    with pytest.raises(DocumentError) as caught:
        parse_document(raw, "test")
    text = str(caught.value)
    assert "spec.wireguard.interfaces[0].private_key" in text
    assert "a literal key is refused" in text
    assert PRIVATE not in text


@pytest.mark.parametrize(
    ("peer", "path", "words"),
    [
        ({"public_key": "short"}, "peers[0].public_key", "not a WireGuard public key"),
        ({"public_key": PEER, "endpoint": "nohost"}, "peers[0].endpoint", "HOST:PORT"),
        ({"public_key": PEER, "endpoint": "h.test:0"}, "peers[0].endpoint", "1-65535"),
        (
            {"public_key": PEER, "allowed_ips": ["10.0.0.0/33"]},
            "peers[0].allowed_ips[0]",
            "network",
        ),
        (
            {"public_key": PEER, "preshared_key": {"secret_ref": "a b"}},
            "peers[0].preshared_key",
            "secret reference",
        ),
    ],
)
def test_bad_peers_name_their_path(peer: dict[str, Any], path: str, words: str) -> None:
    raw = base_document(
        wireguard={"interfaces": [{"name": "wg0", "private_key": "secret:k", "peers": [peer]}]}
    )
    with pytest.raises(DocumentError) as caught:
        parse_document(raw, "test")
    assert f"spec.wireguard.interfaces[0].{path}" in str(caught.value)
    assert words in str(caught.value)


def test_duplicates_and_durations() -> None:
    raw = base_document(
        wireguard={
            "interfaces": [
                {"name": "wg0", "private_key": "secret:k"},
                {"name": "wg0", "private_key": "secret:k"},
            ]
        }
    )
    with pytest.raises(DocumentError, match=r"spec.wireguard.interfaces\[1\].name"):
        parse_document(raw, "test")
    doc = document(resolve_interval="5m", resolve_timeout=2)
    section = doc.spec.section("wireguard")
    assert section.resolve_interval == 300.0 and section.resolve_timeout == 2.0
    with pytest.raises(DocumentError, match=r"spec\.wireguard\.resolve_interval"):
        document(resolve_interval="soon")


def test_endpoints_split_and_canonical() -> None:
    assert split_endpoint("[2001:db8::1]:51820") == ("2001:db8::1", 51820)
    assert split_endpoint("peer.example.test:1") == ("peer.example.test", 1)
    doc = parse_document(
        base_document(
            wireguard={
                "interfaces": [
                    {
                        "name": "wg0",
                        "private_key": "secret:k",
                        "peers": [{"public_key": PEER, "endpoint": "[2001:DB8::0001]:51820"}],
                    }
                ]
            }
        ),
        "t",
    )
    assert doc.spec.section("wireguard").interfaces[0].peers[0].endpoint == "[2001:db8::1]:51820"


# -- dump, configuration ---------------------------------------------------------
def test_dump_parsing_keeps_only_digests_of_keys() -> None:
    text = (
        f"{PRIVATE}\t{fake_pubkey(PRIVATE)}\t51820\toff\n"
        f"{PEER}\t{PSK}\t203.0.113.7:51820\t192.0.2.128/25,2001:db8:100::/64\t1700000000\t10\t20\t25\n"
        f"{PEER2}\t(none)\t(none)\t(none)\t0\t0\t0\toff\n"
    )
    dump = parse_dump(text)
    assert dump.private_digest == secret_digest(PRIVATE)
    assert dump.public_key == fake_pubkey(PRIVATE) and dump.listen_port == 51820
    peer = dump.peers[PEER]
    assert peer.preshared_digest == secret_digest(PSK)
    assert peer.allowed_ips == ("192.0.2.128/25", "2001:db8:100::/64")
    assert (peer.latest_handshake, peer.rx_bytes, peer.tx_bytes, peer.keepalive) == (
        1700000000, 10, 20, 25,
    )  # fmt: skip
    quiet = dump.peers[PEER2]
    assert quiet.endpoint is None and quiet.allowed_ips == () and quiet.keepalive == 0
    assert PRIVATE not in repr(dump) and PSK not in repr(dump)


def test_render_conf() -> None:
    conf = render_conf(
        PRIVATE,
        51820,
        [PeerConf(PEER, PSK, "203.0.113.7:51820", ("192.0.2.128/25",), 25)],
    )
    assert conf.splitlines() == [
        "[Interface]",
        f"PrivateKey = {PRIVATE}",
        "ListenPort = 51820",
        "",
        "[Peer]",
        f"PublicKey = {PEER}",
        f"PresharedKey = {PSK}",
        "Endpoint = 203.0.113.7:51820",
        "AllowedIPs = 192.0.2.128/25",
        "PersistentKeepalive = 25",
    ]
    # `wg syncconf` keeps what a file omits: no preshared key and no keepalive are stated.
    bare = render_conf(PRIVATE, None, [PeerConf(PEER, None, None, (), 0)])
    assert bare.splitlines()[-3:] == [
        f"PublicKey = {PEER}",
        f"PresharedKey = {NO_PRESHARED_KEY}",
        "PersistentKeepalive = 0",
    ]


# -- facts, plans, steps ----------------------------------------------------------
def test_create_configure_and_set_link_then_in_sync(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    doc = document()
    assert world.converge(doc) == ["create", "configure", "set-link"]
    assert world.daemons.specs["wg-wg0"].argv == ("wireguard-go", "-f", "wg0")
    assert world.drift(doc) == []
    assert world.converge(doc) == []
    interface = world.wg.interfaces["wg0"]
    assert interface.private == PRIVATE and interface.port == 51820
    assert interface.peers[PEER].endpoint == "203.0.113.7:51820"
    assert interface.peers[PEER].preshared == PSK
    link = world.netlink.link_state["wg0"]
    assert (link.state, link.mtu) == ("up", 1420)
    assert sorted(a.prefix for a in world.netlink.addrs) == ["192.0.2.129/25", "2001:db8:100::1/64"]
    # Keys went to wg in a file that is gone, and never in argv.
    assert not list((tmp_path / "run" / "wg-wg0").glob("*.conf"))
    assert all(PRIVATE not in " ".join(call) for call in world.wg.calls)


def test_facts_steps_and_report_never_hold_a_key(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    doc = document()
    scope = scope_for(doc)
    world.sub.prepare(doc)
    desired = world.sub.desired(doc, scope)
    plan = world.sub.plan(desired, world.sub.observe(world.sources, scope), scope)
    for step in plan.steps:
        world.sub.execute(world.sources, step)
    seen = repr(desired) + repr(plan) + repr(world.sub.observe(world.sources, scope))
    report = world.sub.report(world.sources, scope)
    seen += repr(report)
    assert PRIVATE not in seen and PSK not in seen
    assert desired[f"{P}.private_key"] == "secret:wg0-key"
    interface = report["interfaces"]["wg0"]
    assert interface["public_key"] == fake_pubkey(PRIVATE)
    assert interface["peers"][PEER]["resolved_endpoint"] == "203.0.113.7:51820"
    assert interface["peers"][PEER]["endpoint_name"] == "peer.example.test:51820"
    assert report["resolution"]["peer.example.test:51820"]["endpoint"] == "203.0.113.7:51820"


def test_a_missing_secret_fails_the_step_naming_where_to_put_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    with pytest.raises(StepError) as caught:
        world.converge(document())
    message = str(caught.value)
    assert f"{P}.private_key: secret 'wg0-key' is not on this device" in message
    assert "trueup secret set wg0-key" in message
    assert str(world.state_dir / "secrets" / "wg0-key") in message


def test_drift_peer_removed_key_rotated_daemon_killed(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    doc = document()
    world.converge(doc)
    # A peer removed with `wg set`, a foreign one added.
    world.wg.run(["wg", "set", "wg0", "peer", PEER, "remove"])
    world.wg.interfaces["wg0"].peers[PEER2] = FakePeer()
    assert f"{P}.peers" in world.drift(doc)
    assert world.converge(doc) == ["configure"]
    assert sorted(world.wg.interfaces["wg0"].peers) == [PEER]
    # The secret rotated (`trueup secret set`): the live key no longer matches.
    other = "aNz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmkY="
    write_secret(world.state_dir, "wg0-key", other)
    assert world.drift(doc) == [f"{P}.private_key"]
    assert world.converge(doc) == ["configure"]
    assert world.wg.interfaces["wg0"].private == other
    # wireguard-go killed: the interface is gone; created and configured again.
    world.daemons.crash("wg-wg0")
    assert f"{P}.running" in world.drift(doc)
    assert world.converge(doc) == ["create", "configure", "set-link"]
    assert world.drift(doc) == []


def test_keepalive_preshared_key_allowed_ips_and_peers_can_be_removed(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    peers = [
        {
            "public_key": PEER,
            "endpoint": "203.0.113.7:51820",
            "allowed_ips": ["192.0.2.128/25"],
            "persistent_keepalive": 5,
            "preshared_key": "secret:wg0-psk",
        },
        {"public_key": PEER2, "allowed_ips": ["192.0.2.64/26"]},
    ]

    def doc(**changes: Any) -> Any:
        first = {**peers[0], **changes}
        interface = {"name": "wg0", "private_key": "secret:wg0-key", "peers": [first, peers[1]]}
        return document(interfaces=[interface])

    world.converge(doc())
    live = world.wg.interfaces["wg0"].peers
    assert (live[PEER].keepalive, live[PEER].preshared) == (5, PSK)
    for changes, field_, value in (
        ({"persistent_keepalive": 0}, "keepalive", 0),
        ({"persistent_keepalive": 0, "preshared_key": None}, "preshared", None),
        ({"persistent_keepalive": 0, "preshared_key": None, "allowed_ips": []}, "allowed_ips", []),
    ):
        assert world.converge(doc(**changes)) == ["configure"]
        assert getattr(world.wg.interfaces["wg0"].peers[PEER], field_) == value
        assert world.drift(doc(**changes)) == []
    # A keepalive set by hand on a peer that has none: drift, healed.
    last = doc(persistent_keepalive=0, preshared_key=None, allowed_ips=[])
    world.wg.run(["wg", "set", "wg0", "peer", PEER, "persistent-keepalive", "25"])
    assert world.drift(last) == [f"{P}.peers[{PEER}]"]
    assert world.converge(last) == ["configure"]
    assert world.wg.interfaces["wg0"].peers[PEER].keepalive == 0
    # A peer removed from the document goes from the interface.
    interface = {"name": "wg0", "private_key": "secret:wg0-key", "peers": [peers[1]]}
    assert world.converge(document(interfaces=[interface])) == ["configure"]
    assert sorted(world.wg.interfaces["wg0"].peers) == [PEER2]


def test_roaming_is_accepted_while_the_session_is_fresh(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    doc = document()
    world.converge(doc)
    peer = world.wg.interfaces["wg0"].peers[PEER]
    peer.endpoint = "198.51.100.77:40000"  # authenticated traffic from elsewhere
    peer.latest_handshake = int(time.time())
    assert world.drift(doc) == []
    peer.latest_handshake = int(time.time()) - 600  # the roamed session went quiet
    assert world.drift(doc) == [f"{P}.peers[{PEER}]"]
    assert world.converge(doc) == ["configure"]
    assert world.wg.interfaces["wg0"].peers[PEER].endpoint == "203.0.113.7:51820"


def test_removed_interface_is_stopped(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    world.converge(document())
    empty = document(interfaces=[])
    previous = document()
    scope = scope_for(empty, previous)
    desired = world.sub.desired(empty, scope)
    plan = world.sub.plan(desired, world.sub.observe(world.sources, scope), scope)
    assert [s.action for s in plan.steps] == ["remove"]
    world.sub.execute(world.sources, plan.steps[0])
    assert not world.daemons.running("wg-wg0")


def test_kernel_link_when_the_module_is_there(tmp_path: Path) -> None:
    world = World(tmp_path, kernel=True)
    world.secrets()
    doc = document()
    assert world.converge(doc) == ["create", "configure", "set-link"]
    assert "wg-wg0" not in world.daemons.specs  # no wireguard-go
    assert world.drift(doc) == []


# -- resolution ---------------------------------------------------------------------
def test_unresolvable_endpoint_fails_preparation_and_is_retried(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    world.answers.clear()
    doc = document()
    with pytest.raises(
        ResolveError, match=r"peers\[0\].endpoint: cannot resolve peer.example.test"
    ):
        world.sub.prepare(doc)
    desired = world.sub.desired(doc, scope_for(doc))
    assert desired[f"{P}.peers[{PEER}]"]["endpoint"] == "unresolved peer.example.test:51820"
    world.answers["peer.example.test"] = ["203.0.113.8"]
    world.sub.prepare(doc)  # a failed name is looked up again
    assert world.converge(doc) == ["create", "configure", "set-link"]
    assert world.wg.interfaces["wg0"].peers[PEER].endpoint == "203.0.113.8:51820"


def test_a_hanging_lookup_is_bounded_by_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import trueup.system.resolve as resolve

    release = threading.Event()
    calls: list[str] = []

    def never(host: str, port: int) -> list[str]:
        calls.append(host)
        release.wait(30)
        return []

    monkeypatch.setattr(resolve, "_lookup", never)
    sub = WireguardSubsystem(refresh=False)  # the real resolve_endpoint, with a hanging lookup
    doc = document(resolve_timeout=0.2)
    try:
        with pytest.raises(ResolveError, match=r"peer\.example\.test: no answer within 0\.2s"):
            sub.prepare(doc)
        with pytest.raises(ResolveError):
            sub.prepare(doc)
        assert calls == ["peer.example.test"]  # the hanging lookup is shared, not repeated
        assert resolve.resolve_endpoint("192.0.2.1", 5, 0.1) == ["192.0.2.1:5"]  # no lookup
    finally:
        release.set()


def test_scheduled_re_resolution_changes_the_desired_endpoint(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.secrets()
    doc = document(resolve_interval=60)
    world.converge(doc)
    world.answers["peer.example.test"] = ["203.0.113.9"]
    assert world.sub.resolver.refresh_due(time.time() + 1) == []  # not due yet
    assert world.sub.resolver.refresh_due(time.time() + 61) == ["peer.example.test:51820"]
    assert world.drift(doc) == [f"{P}.peers[{PEER}]"]
    assert world.converge(doc) == ["configure"]
    assert world.wg.interfaces["wg0"].peers[PEER].endpoint == "203.0.113.9:51820"


# -- the secret store and its CLI -------------------------------------------------------
def test_secret_store_files_and_references(tmp_path: Path) -> None:
    path = write_secret(tmp_path, "wg0-key", PRIVATE + "\n")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert read_secret(tmp_path, "wg0-key") == PRIVATE
    assert read_secret(tmp_path, "absent") is None
    assert list_secrets(tmp_path) == ["wg0-key"]
    with pytest.raises(ValueError, match="secret name"):
        write_secret(tmp_path, "../x", "v")
    raw = base_document(
        wireguard={"interfaces": [{"name": "wg0", "private_key": {"secret_ref": "a"},
                                   "peers": [{"public_key": PEER, "preshared_key": "secret:b"}]}]}
    )  # fmt: skip
    assert secret_references(raw) == {"a", "b"}


def test_cli_secret_set_from_stdin_and_list(tmp_path: Path) -> None:
    from trueup.cli.main import app

    StateDir(tmp_path).ensure()
    runner = CliRunner()
    done = runner.invoke(
        app, ["secret", "set", "wg0-key", "--state-dir", str(tmp_path)], input=PRIVATE + "\n"
    )
    assert done.exit_code == 0, done.output
    assert PRIVATE not in done.output
    assert read_secret(tmp_path, "wg0-key") == PRIVATE
    listed = runner.invoke(app, ["secret", "list", "--state-dir", str(tmp_path)])
    assert listed.exit_code == 0 and listed.output.split() == ["wg0-key"]
    refused = runner.invoke(
        app, ["secret", "set", "bad name", "--state-dir", str(tmp_path)], input="x"
    )
    assert refused.exit_code == 1


def test_control_plane_sync_stores_only_referenced_secrets(tmp_path: Path) -> None:
    from trueup.agent.wiring import _fetch_secrets

    class Client:
        def __init__(self, fail: bool = False) -> None:
            self.fail = fail
            self.calls = 0

        def secrets(self) -> dict[str, Any]:
            self.calls += 1
            if self.fail:
                raise RuntimeError("unreachable")
            return {"secrets": {"wg0-key": PRIVATE, "other": "x"}, "refused": []}

    raw = base_document(
        wireguard={"interfaces": [{"name": "wg0", "private_key": {"secret_ref": "wg0-key"},
                                   "peers": [{"public_key": PEER, "preshared_key": "secret:gone"}]}]}
    )  # fmt: skip
    client = Client()
    _fetch_secrets(client, tmp_path, raw)  # type: ignore[arg-type]
    assert list_secrets(tmp_path) == ["wg0-key"]  # "other" is not referenced; "gone" is absent
    assert read_secret(tmp_path, "wg0-key") == PRIVATE
    plain = Client()
    _fetch_secrets(plain, tmp_path, base_document())  # type: ignore[arg-type]
    assert plain.calls == 0  # no reference, no request
    _fetch_secrets(Client(fail=True), tmp_path / "x", raw)  # type: ignore[arg-type]
    assert list_secrets(tmp_path / "x") == []  # logged, never raised


def test_a_secret_the_control_plane_refuses_is_logged_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from trueup.agent.wiring import _fetch_secrets

    reason = "secret 'wg0-key': the stored row is version 2 but the audit log's newest is 3"

    class Client:
        def secrets(self) -> dict[str, Any]:
            return {"secrets": {}, "refused": [{"name": "wg0-key", "error": reason}]}

    raw = base_document(
        wireguard={"interfaces": [{"name": "wg0", "private_key": {"secret_ref": "wg0-key"},
                                   "peers": [{"public_key": PEER}]}]}
    )  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="trueup"):
        _fetch_secrets(Client(), tmp_path, raw)  # type: ignore[arg-type]
    assert list_secrets(tmp_path) == []
    assert any(
        r.levelno == logging.ERROR
        and "refused secret 'wg0-key'" in r.getMessage()
        and reason in r.getMessage()
        for r in caplog.records
    ), caplog.records


def test_apply_and_rollback_through_the_engine_journal_without_keys(tmp_path: Path) -> None:
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.registry import default_subsystems, ordered

    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    daemons = FakeDaemons(tmp_path / "state" / "run")
    wg = FakeWg(daemons, kernel)
    wireguard = WireguardSubsystem(resolver({"peer.example.test": ["203.0.113.7"]}), refresh=False)
    subsystems = ordered([*(s for s in default_subsystems() if s.name != "wireguard"), wireguard])
    engine = Engine(state, subsystems, netlink_factory=lambda: kernel, runner=wg, daemons=daemons)
    write_secret(state.root, "wg0-key", PRIVATE)
    write_secret(state.root, "wg0-psk", PSK)
    section = document().spec.section("wireguard").model_dump(mode="json")
    section["interfaces"][0]["private_key"] = "secret:wg0-key"
    section["interfaces"][0]["peers"][0]["preshared_key"] = "secret:wg0-psk"
    first = parse_document(base_document(routes=[], wireguard=section), "t")
    assert engine.apply_document(first).ok
    assert wg.interfaces["wg0"].peers[PEER].endpoint == "203.0.113.7:51820"
    one_peer = {"name": "wg0", "private_key": "secret:wg0-key", "peers": [{"public_key": PEER2}]}
    second = parse_document(base_document(routes=[], wireguard={"interfaces": [one_peer]}), "t")
    assert engine.apply_document(second).ok
    assert sorted(wg.interfaces["wg0"].peers) == [PEER2]
    assert engine.rollback_to(None, actor="test").ok
    assert sorted(wg.interfaces["wg0"].peers) == [PEER]
    for name in ("journal.jsonl", "audit.jsonl"):
        text = (state.root / name).read_text()
        assert "wireguard" in text
        assert PRIVATE not in text and PSK not in text


# -- attacks on names, keys and the store ---------------------------------------
@pytest.mark.parametrize(
    ("interface", "path"),
    [
        ({"name": "wg0\n", "private_key": "secret:k"}, "interfaces[0].name"),
        ({"name": "wg0", "private_key": "secret:k\n"}, "interfaces[0].private_key"),
        (
            {"name": "wg0", "private_key": "secret:k", "peers": [{"public_key": PEER + "\n"}]},
            "interfaces[0].peers[0].public_key",
        ),
        (
            {
                "name": "wg0",
                "private_key": "secret:k",
                "peers": [{"public_key": PEER, "endpoint": "h.test\n:51820"}],
            },
            "interfaces[0].peers[0].endpoint",
        ),
    ],
)
def test_a_trailing_newline_does_not_slip_past_a_pattern(
    interface: dict[str, Any], path: str
) -> None:
    raw = base_document(wireguard={"interfaces": [interface]})
    with pytest.raises(DocumentError) as caught:
        parse_document(raw, "test")
    assert f"spec.wireguard.{path}" in str(caught.value)


def test_the_store_refuses_names_with_a_newline(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="secret name"):
        write_secret(tmp_path, "k\n", "v")


def test_a_symlink_planted_in_the_store_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "shadow"
    target.write_text("root:$6$hash:19000::::::\n")
    store = tmp_path / "state" / "secrets"
    store.mkdir(parents=True)
    (store / "k").symlink_to(target)
    with pytest.raises(SecretError) as caught:
        read_secret(tmp_path / "state", "k")
    assert "$6$hash" not in str(caught.value)
    assert list_secrets(tmp_path / "state") == []


def test_a_directory_or_huge_secret_file_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "secrets"
    (store / "dir").mkdir(parents=True)
    with pytest.raises(SecretError, match="not a regular file"):
        read_secret(tmp_path, "dir")
    (store / "big").write_bytes(b"x" * (MAX_BYTES * 4))
    with pytest.raises(SecretError, match="over"):
        read_secret(tmp_path, "big")


def test_cli_secret_set_refuses_a_huge_value_without_storing_it(tmp_path: Path) -> None:
    from trueup.cli.main import app

    StateDir(tmp_path).ensure()
    done = CliRunner().invoke(
        app, ["secret", "set", "k", "--state-dir", str(tmp_path)], input="x" * (MAX_BYTES * 3)
    )
    assert done.exit_code == 1
    assert "over" in done.output
    assert read_secret(tmp_path, "k") is None


@pytest.mark.parametrize("name", ["mgmt0", "lan0"])
def test_a_wireguard_interface_named_like_a_managed_link_is_refused(name: str) -> None:
    raw = base_document(wireguard={"interfaces": [{"name": name, "private_key": "secret:k"}]})
    with pytest.raises(DocumentError) as caught:
        parse_document(raw, "test")
    assert "spec.wireguard.interfaces[0].name" in str(caught.value)
    assert "already spec." in str(caught.value)


def test_a_stored_secret_that_is_not_a_key_never_reaches_the_wg_file() -> None:
    from trueup.system.wireguard import WgError

    injected = PRIVATE + "\n[Peer]\nPublicKey = " + PEER + "\nAllowedIPs = 0.0.0.0/0"
    with pytest.raises(WgError) as caught:
        render_conf(injected, None, [])
    assert PRIVATE not in str(caught.value)
    peer = PeerConf(PEER, "hunter2\nEndpoint = 192.0.2.9:1", None, (), 0)
    with pytest.raises(WgError) as caught:
        render_conf(PRIVATE, None, [peer])
    assert "hunter2" not in str(caught.value)
    assert "PrivateKey = " + PRIVATE in render_conf(PRIVATE, None, [])


@pytest.mark.parametrize("mode", ["best-effort", "atomic"])
def test_a_hanging_lookup_does_not_hold_back_the_network_tier(tmp_path: Path, mode: str) -> None:
    """Preparation runs beside the transaction: addresses converge while the lookup hangs."""
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.registry import default_subsystems, ordered

    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    daemons = FakeDaemons(tmp_path / "state" / "run")
    wg = FakeWg(daemons, kernel)
    asked, answer = threading.Event(), threading.Event()

    def hanging(host: str, port: int, timeout: float) -> list[str]:
        asked.set()
        answer.wait(30)
        return [f"203.0.113.7:{port}"]

    wireguard = WireguardSubsystem(hanging, refresh=False)
    subsystems = ordered([*(s for s in default_subsystems() if s.name != "wireguard"), wireguard])
    engine = Engine(state, subsystems, netlink_factory=lambda: kernel, runner=wg, daemons=daemons)
    write_secret(state.root, "wg0-key", PRIVATE)
    write_secret(state.root, "wg0-psk", PSK)
    section = document().spec.section("wireguard").model_dump(mode="json")
    section["interfaces"][0]["private_key"] = "secret:wg0-key"
    section["interfaces"][0]["peers"][0]["preshared_key"] = "secret:wg0-psk"
    doc = parse_document(base_document(routes=[], wireguard=section), "t")
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(engine.apply_document(doc, mode=mode)))
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while "203.0.113.1/24" not in {a.prefix for a in kernel.addrs if a.ifname == "lan0"}:
            assert time.monotonic() < deadline, "lan0's address never came"
            time.sleep(0.01)
        # The address is there while the lookup still hangs: WireGuard waits alone.
        assert asked.is_set() and not answer.is_set() and worker.is_alive() and not results
        assert "wg0" not in wg.interfaces
    finally:
        answer.set()
        worker.join(30)
    (result,) = results
    assert result.ok, result.failed
    assert wg.interfaces["wg0"].peers[PEER].endpoint == "203.0.113.7:51820"


def test_a_lookup_past_its_deadline_fails_wireguard_alone(tmp_path: Path) -> None:
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.registry import default_subsystems, ordered

    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    daemons = FakeDaemons(tmp_path / "state" / "run")
    wg = FakeWg(daemons, kernel)
    answer = threading.Event()

    def hanging(host: str, port: int, timeout: float) -> list[str]:
        answer.wait(30)
        raise ResolveError(f"{host}: no answer")

    wireguard = WireguardSubsystem(hanging, refresh=False)
    subsystems = ordered([*(s for s in default_subsystems() if s.name != "wireguard"), wireguard])
    engine = Engine(state, subsystems, netlink_factory=lambda: kernel, runner=wg, daemons=daemons)
    section = document().spec.section("wireguard").model_dump(mode="json")
    doc = parse_document(
        base_document(routes=[], wireguard=section, convergence={"deadlines": {"wireguard": 1}}),
        "t",
    )
    try:
        result = engine.apply_document(doc, mode="best-effort")
    finally:
        answer.set()
    assert result.failed == {"wireguard": "deadline of 1s exceeded while preparing"}
    assert "203.0.113.1/24" in {a.prefix for a in kernel.addrs if a.ifname == "lan0"}
    assert "wg0" not in wg.interfaces
    journal = (state.root / "journal.jsonl").read_text()
    assert "deadline of 1s exceeded while preparing" in journal


def test_a_failed_apply_leaves_no_preshared_key_the_committed_revision_lacks(
    tmp_path: Path,
) -> None:
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.registry import default_subsystems, ordered

    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    daemons = FakeDaemons(tmp_path / "state" / "run")
    wg = FakeWg(daemons, kernel)
    wireguard = WireguardSubsystem(resolver({}), refresh=False)
    subsystems = ordered([*(s for s in default_subsystems() if s.name != "wireguard"), wireguard])
    engine = Engine(state, subsystems, netlink_factory=lambda: kernel, runner=wg, daemons=daemons)
    write_secret(state.root, "wg0-key", PRIVATE)
    write_secret(state.root, "wg0-psk", PSK)
    peer = {"public_key": PEER, "allowed_ips": ["192.0.2.128/25"]}
    wg0 = {"name": "wg0", "private_key": "secret:wg0-key", "peers": [peer]}
    first = parse_document(base_document(routes=[], wireguard={"interfaces": [wg0]}), "t")
    assert engine.apply_document(first).ok
    assert wg.interfaces["wg0"].peers[PEER].preshared is None
    # The next revision gives wg0's peer a preshared key, and wg1 a key that is not stored:
    # wg1 fails after wg0 was configured, and the atomic apply is rolled back.
    with_psk = {**wg0, "peers": [{**peer, "preshared_key": "secret:wg0-psk"}]}
    wg1 = {"name": "wg1", "private_key": "secret:missing"}
    second = parse_document(
        base_document(routes=[], wireguard={"interfaces": [with_psk, wg1]}), "t"
    )
    result = engine.apply_document(second)
    assert not result.ok and result.outcome == "rolled_back", result
    assert any(f"PresharedKey = {PSK}" in text for text in wg.conf_seen)
    assert wg.interfaces["wg0"].peers[PEER].preshared is None
    assert engine.state.applied().version == 1
