"""Where a webhook may go: every kind of internal address refused, in IPv6 dress too, public
ones taken, and the admin's allowed hosts and ranges let through exactly what they name."""

from __future__ import annotations

import ipaddress

import pytest

from core.webhooks.addresses import AddressPolicy, UnsafeUrl, checked_target

NONE = AddressPolicy.from_setting("")
INTERNAL = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("fd00::1", "private"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:10.0.0.1", "private"),
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
    ("2001::1", "private"),  # Teredo
    ("::7f00:1", "reserved"),  # IPv4-compatible 127.0.0.1
    ("240.0.0.1", "private"),
]


@pytest.mark.parametrize(("address", "kind"), INTERNAL)
def test_internal_addresses_are_refused(address: str, kind: str) -> None:
    why = NONE.refusal("h", ipaddress.ip_address(address))
    assert why is not None and kind in why


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_taken(address: str) -> None:
    assert NONE.refusal("h", ipaddress.ip_address(address)) is None


def test_the_allow_setting_lets_through_what_it_names_and_no_more() -> None:
    allow = AddressPolicy.from_setting("127.0.0.1/32, hooks.internal, [fd00::]/8")
    assert allow.refusal("h", ipaddress.ip_address("127.0.0.1")) is None
    assert allow.refusal("h", ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert allow.refusal("h", ipaddress.ip_address("fd12::5")) is None
    assert allow.refusal("hooks.internal", ipaddress.ip_address("10.9.9.9")) is None
    assert allow.refusal("h", ipaddress.ip_address("127.0.0.2")) is not None
    assert allow.refusal("h", ipaddress.ip_address("169.254.169.254")) is not None


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:9/",
        "http://2130706433/",  # 127.0.0.1 as one number: resolved, then refused
        "http://0/",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data/",
    ],
)
def test_urls_are_refused_after_resolution(url: str) -> None:
    with pytest.raises(UnsafeUrl, match="public addresses"):
        checked_target(url, NONE)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://example.com/", "https://"),
        ("file:///etc/passwd", "https://"),
        ("http://user:pw@example.com/", "no user or password"),
        ("http:///nohost", "no host"),
        ("http://example.com:99999/", "not a URL"),
        ("https://example.com/" + "x" * 2048, "at most 2048"),
    ],
)
def test_urls_that_are_not_http_are_refused(url: str, said: str) -> None:
    with pytest.raises(UnsafeUrl, match=said):
        checked_target(url, NONE)


def test_one_internal_address_among_public_ones_refuses_the_name() -> None:
    def resolve(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "127.0.0.1"]

    with pytest.raises(UnsafeUrl, match="loopback"):
        checked_target("https://mixed.example/", NONE, resolve)


def test_the_target_pins_the_checked_address_and_keeps_the_name() -> None:
    target = checked_target(
        "https://hooks.example:8443/in?x=1", NONE, lambda h, p: ["2606:4700::1"]
    )
    assert target.pinned_url == "https://[2606:4700::1]:8443/in?x=1"
    assert target.host_header == "hooks.example:8443"
    assert checked_target("https://a.example/", NONE, lambda h, p: ["1.1.1.1"]).host_header == (
        "a.example"
    )
