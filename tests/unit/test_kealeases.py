"""Read-only lease inspection from Kea's memfile: last row wins, releases, LFC files, empty files."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trueup.system.kealeases import lease_files, leases_from_memfile, read_leases

HEADER4 = (
    "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,"
    "hostname,state,user_context\n"
)
HEADER6 = (
    "address,duid,valid_lifetime,expire,subnet_id,pref_lifetime,lease_type,iaid,prefix_len,"
    "fqdn_fwd,fqdn_rev,hostname,hwaddr,state,user_context,hwtype,hwaddr_source\n"
)


def row4(address: str, valid: int, expire: int, hostname: str = "", state: int = 0) -> str:
    return f"{address},02:00:00:00:00:01,,{valid},{expire},1,0,0,{hostname},{state},\n"


def test_the_last_row_for_an_address_wins_and_zero_lifetime_is_released(tmp_path: Path) -> None:
    path = tmp_path / "kea-leases4.csv"
    path.write_text(
        HEADER4
        + row4("192.0.2.10", 3600, 1000, "old")
        + row4("192.0.2.11", 3600, 1100, "kept")
        + row4("192.0.2.10", 3600, 2000, "new&#x2cname")
        + row4("192.0.2.12", 3600, 1200, "gone")
        + row4("192.0.2.12", 0, 1200, "gone")
    )
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    leases = {lease.address: lease for lease in leases_from_memfile(4, path)}
    assert sorted(leases) == ["192.0.2.10", "192.0.2.11"]
    assert leases["192.0.2.10"].hostname == "new,name"
    assert leases["192.0.2.10"].expire == 2000
    assert leases["192.0.2.10"].state == "default"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # read-only


def test_lfc_files_are_read_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "kea-leases4.csv"
    (tmp_path / "kea-leases4.csv.1").write_text(HEADER4 + row4("192.0.2.20", 3600, 10, "one"))
    (tmp_path / "kea-leases4.csv.2").write_text(HEADER4 + row4("192.0.2.20", 3600, 20, "two"))
    path.write_text(HEADER4 + row4("192.0.2.21", 3600, 30, "main"))
    assert [p.name for p in lease_files(path)] == [
        "kea-leases4.csv.1",
        "kea-leases4.csv.2",
        "kea-leases4.csv",
    ]
    leases = {lease.address: lease.hostname for lease in leases_from_memfile(4, path)}
    assert leases == {"192.0.2.20": "two", "192.0.2.21": "main"}
    # A finished cleanup's output replaces .1 and .2.
    (tmp_path / "kea-leases4.csv.completed").write_text(HEADER4 + row4("192.0.2.22", 3600, 5))
    leases = {lease.address: lease.hostname for lease in leases_from_memfile(4, path)}
    assert leases == {"192.0.2.22": "", "192.0.2.21": "main"}


def test_a_zero_byte_or_missing_file_is_an_empty_source(tmp_path: Path) -> None:
    path = tmp_path / "kea-leases4.csv"
    assert list(leases_from_memfile(4, path)) == []
    path.write_bytes(b"")
    assert list(leases_from_memfile(4, path)) == []
    source, leases = read_leases(4, socket_path=tmp_path / "absent.sock", lease_file=path)
    assert source == "memfile" and list(leases) == []


def test_dhcpv6_rows_carry_the_duid_and_lease_type(tmp_path: Path) -> None:
    path = tmp_path / "kea-leases6.csv"
    path.write_text(
        HEADER6 + "2001:db8:1::10,00:01:00:01:aa:bb,3600,5000,1,1800,0,7,128,0,0,host6,,1,,,\n"
    )
    (lease,) = leases_from_memfile(6, path)
    assert lease.client_id == "00:01:00:01:aa:bb"
    assert lease.lease_type == "IA_NA" and lease.state == "declined"
    assert lease.to_json()["hostname"] == "host6"


def test_a_socket_nobody_listens_on_falls_back_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kea-leases4.csv"
    path.write_text(HEADER4 + row4("192.0.2.30", 3600, 40))
    stale = tmp_path / "kea4.sock"
    stale.write_text("")  # a leftover path, not a listening socket
    source, leases = read_leases(4, socket_path=stale, lease_file=path)
    assert source == "memfile" and [lease.address for lease in leases] == ["192.0.2.30"]
