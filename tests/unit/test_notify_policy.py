"""The webhook target policy, as pure functions: spellings, embedded forms, pinning, error classes."""

from __future__ import annotations

import ipaddress
import socket
import ssl

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trueup.server.service.errors import Invalid
from trueup.server.service.notify.failures import failure_class, status_class
from trueup.server.service.notify.policy import (
    Allowlist,
    PolicyRefused,
    check_url,
    parse_host,
    redact,
    refusal,
    vet,
)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7F.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("10.0x10.1", "10.16.0.1"),
        ("[::1]", "::1"),
        ("\uff11\uff12\uff17\u3002\uff10\u3002\uff10\u3002\uff11", "127.0.0.1"),
    ],
)
def test_hosts_are_read_as_the_resolver_reads_them(host: str, address: str) -> None:
    assert str(parse_host(host)[1]) == address


@pytest.mark.parametrize("host", ["256.1.1.1", "1.2.3.4.5", "127..1", "0x", "08.0.0.1"])
def test_what_the_resolver_would_not_read_as_an_address_is_no_address(host: str) -> None:
    try:
        name, address = parse_host(host)
    except ValueError:
        return
    assert address is None and name == host.lower()


def test_idna_folds_before_the_name_is_judged() -> None:
    assert parse_host("\u24dbocalhost")[0] == "localhost"
    assert parse_host("B\u00fccher.example")[0] == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("::ffff:10.0.0.1", "an IPv4-mapped form of 10.0.0.1"),
        ("::10.0.0.1", "an IPv4-compatible form of 10.0.0.1"),
        ("64:ff9b::169.254.169.254", "a NAT64 form of 169.254.169.254"),
        ("2002:a9fe:a9fe::1", "a 6to4 form of 169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a Teredo form of 127.0.0.1"),
        ("64:ff9b:1::1", "a reserved address (local-use NAT64)"),
        ("198.51.100.7", "a documentation address"),
        ("192.0.0.8", "a reserved address"),
    ],
)
def test_embedded_and_reserved_forms_are_refused(address: str, reason: str) -> None:
    why = refusal(ipaddress.ip_address(address))
    assert why is not None and why.startswith(reason)


@pytest.mark.parametrize("address", ["8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_every_address_a_name_resolves_to_is_checked() -> None:
    def resolve(host: str, port: int) -> list[str]:
        return ["8.8.8.8", "10.1.1.1"]

    with pytest.raises(PolicyRefused, match="resolves to a private address"):
        vet("https://hooks.example.net/x", Allowlist(), resolve)


def test_the_request_is_pinned_to_the_vetted_address_under_the_name() -> None:
    asked: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return ["8.8.4.4"]

    pinned = vet("https://Hooks.Example.NET:8443/a?b=1", Allowlist(), resolve)
    assert asked == [("hooks.example.net", 8443)]
    assert str(pinned.url) == "https://8.8.4.4:8443/a?b=1"
    assert pinned.host_header == "hooks.example.net:8443"
    assert pinned.sni_hostname == "hooks.example.net"


def test_an_allowlisted_name_may_resolve_inside_but_never_to_a_non_receiver() -> None:
    allowlist = Allowlist.parse(["alerts.corp.example"])
    assert vet("http://alerts.corp.example/", allowlist, lambda h, p: ["10.2.3.4"]).address == (
        "10.2.3.4"
    )
    with pytest.raises(PolicyRefused, match="multicast"):
        vet("http://alerts.corp.example/", allowlist, lambda h, p: ["239.1.1.1"])


def test_literal_addresses_are_not_resolved() -> None:
    def resolve(host: str, port: int) -> list[str]:
        raise AssertionError("resolved a literal address")

    with pytest.raises(PolicyRefused, match=r"127\.0\.0\.1 is a loopback address"):
        vet("http://2130706433/", Allowlist(), resolve)
    allowed = vet("http://2130706433:81/", Allowlist.parse(["127.0.0.0/8"]), resolve)
    assert str(allowed.url) == "http://127.0.0.1:81/" and allowed.sni_hostname is None


def test_credentials_are_refused_and_redacted() -> None:
    with pytest.raises(Invalid, match="auth_header"):
        check_url("https://u:p@hooks.example.net/", Allowlist())
    with pytest.raises(PolicyRefused, match="credentials"):
        vet("https://u:p@hooks.example.net/", Allowlist(), lambda h, p: ["8.8.8.8"])
    assert redact("https://u:p@hooks.example.net/x") == "https://hooks.example.net/x"


def _wrapped(cause: BaseException, kind: type[httpx.HTTPError] = httpx.ConnectError) -> Exception:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise kind("wrapped") from exc
    except httpx.HTTPError as outer:
        return outer


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_wrapped(ConnectionRefusedError(111, "Connection refused")), "connection refused"),
        (_wrapped(ssl.SSLCertVerificationError("bad cert")), "TLS: the certificate was not"),
        (_wrapped(ssl.SSLError("handshake")), "TLS: the handshake failed"),
        (_wrapped(socket.gaierror(-2, "Name or service not known")), "DNS:"),
        (_wrapped(OSError(113, "No route to host")), "unreachable"),
        (httpx.ReadTimeout("read timed out"), "timed out"),
        (httpx.RemoteProtocolError("peer hung up"), "connection closed"),
    ],
)
def test_failures_are_reported_as_classes(exc: Exception, expected: str) -> None:
    said = failure_class(exc)
    assert said.startswith(expected)
    assert "Errno" not in said and str(exc) not in said


def test_statuses() -> None:
    assert status_class(204) is None
    assert status_class(503) == "HTTP 503"
    assert status_class(302) == "HTTP 302 (redirects are not followed)"


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=80), st.sampled_from(["http://", "https://", "http://[", "", "ftp://"]))
def test_any_url_is_accepted_or_refused_with_a_field_never_an_error(text: str, scheme: str) -> None:
    try:
        check_url(scheme + text, Allowlist())
    except Invalid as exc:
        assert exc.problems and all(p.startswith("url: ") for p in exc.problems)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=5))
@example(["¹"])
def test_any_allowlist_is_parsed_or_refused_per_entry(entries: list[str]) -> None:
    try:
        parsed = Allowlist.parse(entries)
    except Invalid as exc:
        assert all(p.startswith("entries[") for p in exc.problems)
    else:
        assert Allowlist.parse(parsed.entries()) == parsed


@pytest.mark.parametrize(
    "entry", ["::ffff:0:0/96", "::ffff:0:0/103", "64:ff9b::/96", "2002::/16", "2001::/32", "::/8"]
)
def test_an_allowlist_cannot_name_ipv4_through_its_ipv6_forms(entry: str) -> None:
    """::ffff:0:0/96 passes the /8 rule but is all of IPv4 (loopback and metadata included)."""
    with pytest.raises(Invalid) as refused:
        Allowlist.parse([entry])
    assert "entries[0]" in str(refused.value.problems)
    assert Allowlist.parse(["2001:db8:1::/48", "::1", "::ffff:a14:0/112"]).entries() == [
        "2001:db8:1::/48",
        "::1/128",
        "::ffff:a14:0/112",
    ]


@pytest.mark.parametrize("entry", ["¹", "\uff11\uff12\uff17.\uff10.\uff10.\uff11", "0x7f.1"])
def test_a_host_name_that_normalises_to_an_address_is_refused(entry: str) -> None:
    """IDNA maps '¹' to '1' and full-width digits to ASCII: the resolver reads an address."""
    with pytest.raises(Invalid) as refused:
        Allowlist.parse([entry])
    assert "entries[0]" in refused.value.problems[0]
