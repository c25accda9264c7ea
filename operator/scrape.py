"""Pulling the sidecars' ``GET /status`` (aiohttp, short timeouts, bounded bodies).

The operator reaches each sidecar at ``http://<podIP>:<port>/status``; the port is the one the
pod's own sidecar container declares (it may run an older sidecar than the policy's), else the
policy's ``sidecar.port``. One slow or silent broker costs at most the timeout, and brokers are
pulled concurrently; each report is parsed and validated (jsonschema) in a worker thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from compaction_operator.status import BrokerPod, Scrape, parse_report

__all__ = ["MAX_BODY", "fetch_reports", "pod_address", "status_url"]

#: A v1 report stays under 64 KiB; anything much larger is not one.
MAX_BODY = 1024 * 1024
#: Sidecars pulled at once, per policy.
CONCURRENCY = 32


def pod_address(pod_status: Mapping[str, Any]) -> str | None:
    """The address of a pod's sidecar: ``status.podIP``, except that an IPv4 address from
    ``status.podIPs`` is preferred. The sidecar is told to listen on ``0.0.0.0`` and cannot
    listen on IPv6 (its HTTP server is IPv4 only), so on a dual-stack cluster whose first
    family is IPv6 the pod's IPv4 address is the one that answers."""
    primary = pod_status.get("podIP") or None
    candidates = [primary, *(entry.get("ip") for entry in pod_status.get("podIPs") or [] if isinstance(entry, Mapping))]
    for ip in candidates:
        try:
            if ip and isinstance(ipaddress.ip_address(ip), ipaddress.IPv4Address):
                return str(ip)
        except ValueError:
            continue
    return primary


def status_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if isinstance(ipaddress.ip_address(ip), ipaddress.IPv6Address) else ip
    return f"http://{host}:{port}/status"


async def _fetch(session: aiohttp.ClientSession, pod: BrokerPod, port: int, timeout: float) -> Scrape:
    if not pod.ip:
        return Scrape(error=f"pod {pod.name} has no IP address yet")
    try:
        url = status_url(pod.ip, pod.port or port)
    except ValueError:
        return Scrape(error=f"pod {pod.name} has an invalid IP address {pod.ip!r}")
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 2.0)),
                               allow_redirects=False) as response:
            body = await response.content.read(MAX_BODY + 1)
            if response.status != 200:
                return Scrape(error=f"GET {url}: HTTP {response.status}")
            if len(body) > MAX_BODY:
                return Scrape(error=f"GET {url}: the report is larger than {MAX_BODY} bytes")
    except TimeoutError:
        return Scrape(error=f"GET {url}: no answer within {timeout:g}s")
    except aiohttp.ClientError as exc:
        return Scrape(error=f"GET {url}: {type(exc).__name__}: {exc}")
    except OSError as exc:
        return Scrape(error=f"GET {url}: {exc.strerror or exc}")
    # Off the event loop: the loop also answers the API server's webhook calls (within their
    # 5 s timeout), and validating 50 reports of 200 partitions each is not instant.
    return await asyncio.to_thread(parse_report, body, pod.name)


async def fetch_reports(session: aiohttp.ClientSession, pods: Sequence[BrokerPod], port: int,
                        timeout: float) -> Mapping[str, Scrape]:
    """The report (or the failure) of every pod that runs the sidecar, by pod name."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(pod: BrokerPod) -> tuple[str, Scrape]:
        async with limit:
            return pod.name, await _fetch(session, pod, port, timeout)

    results = await asyncio.gather(*(one(pod) for pod in pods if pod.has_sidecar))
    return dict(results)
