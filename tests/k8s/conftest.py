"""Fixtures for tests that need a Kubernetes API server: fakekube, served in-process.

``fakekube`` yields a ``RunningFakeKube`` (``.server`` is the FakeKube with its request log and
stored objects, ``.url``, ``.kubeconfig``) and points this process's kubeconfig readers at it, so
kopf run by ``kopf.testing.KopfRunner`` and ``kubernetes.client.*Api()`` reach it, calling as the
user ``fakekube``. ``kube_client`` is an ApiClient calling as ``test`` instead, so the test's own
calls can be told apart from the operator's in the request log.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import kubernetes
import pytest
from fakekube import FakeKube, RunningFakeKube, running_fakekube


@pytest.fixture
def fakekube_version() -> str:
    """The version ``GET /version`` reports; override it per test with
    ``@pytest.mark.parametrize("fakekube_version", ["v1.28.9"])``."""
    return "v1.33.0"


@pytest.fixture
def fakekube(fakekube_version: str, tmp_path: pathlib.Path) -> Iterator[RunningFakeKube]:
    """A fresh emulator on a free loopback port, active as this process's cluster.

    Bookmarks come every second (instead of the real server's minute), so watch code paths that
    depend on them run within a test's time.
    """
    server = FakeKube(version=fakekube_version, bookmark_interval=1.0)
    with running_fakekube(server, kubeconfig=tmp_path / "kubeconfig") as kube:
        yield kube


@pytest.fixture
def kube_client(fakekube: RunningFakeKube) -> Iterator[kubernetes.client.ApiClient]:
    """A kubernetes ApiClient calling the emulator as the user ``test``."""
    with fakekube.api_client("test") as client:
        yield client
