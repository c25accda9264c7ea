"""Where the operator pulls a sidecar's /status from (compaction_operator.scrape)."""

from __future__ import annotations

from typing import Any

import pytest
from compaction_operator.scrape import pod_address, status_url


@pytest.mark.parametrize(("status", "address"), [
    ({"podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}]}, "10.0.0.7"),
    ({"podIP": "10.0.0.7"}, "10.0.0.7"),
    # Dual stack, IPv6 first: the sidecar listens on 0.0.0.0, so its IPv4 address answers.
    ({"podIP": "fd00::7", "podIPs": [{"ip": "fd00::7"}, {"ip": "10.0.0.7"}]}, "10.0.0.7"),
    # IPv6 only: the only address there is (the sidecar cannot answer on it yet).
    ({"podIP": "fd00::7", "podIPs": [{"ip": "fd00::7"}]}, "fd00::7"),
    ({"podIP": "", "podIPs": []}, None),
    ({}, None),
    ({"podIP": "not-an-ip", "podIPs": [{"ip": "also-not"}]}, "not-an-ip"),  # reported by the scrape
])
def test_the_pods_ipv4_address_is_preferred(status: dict[str, Any], address: str | None) -> None:
    assert pod_address(status) == address


def test_status_urls() -> None:
    assert status_url("10.0.0.7", 9410) == "http://10.0.0.7:9410/status"
    assert status_url("fd00::7", 9410) == "http://[fd00::7]:9410/status"
