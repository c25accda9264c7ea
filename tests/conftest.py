"""Shared test configuration."""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from object_store import ObjectStore, running_object_store

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
REAL_KAFKA = SHARED / "fixtures" / "real-kafka"

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def real_kafka_root() -> pathlib.Path:
    """The read-only directory of files written by real Kafka brokers.

    Absent in a user's clone (it lives beside the repository, in ../shared); present in CI.
    """
    if not REAL_KAFKA.is_dir():
        pytest.skip(f"real Kafka fixtures not found at {REAL_KAFKA} (they live in ../shared, beside the repo)")
    return REAL_KAFKA


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """A real S3-compatible object store on loopback (tests/object_store.py), one for the session
    (one a worker): a test makes its own bucket."""
    with running_object_store(tmp_path_factory.mktemp("object-store")) as store:
        yield store


@pytest.fixture(autouse=True)
def _root_log_level_restored() -> object:
    """kopf's ``--verbose`` (the operator tests' runner) turns the root logger to DEBUG for
    the whole process. Left so, every later test in that worker captures every DEBUG record
    of the chatty clients (kafka-python, py4j): gigabytes for one real-broker test, which
    ran a CI worker out of memory."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kafka-line",
        default=None,
        help="Run the real-Kafka tests on this Kafka line only (4.3.1 or 3.9.2); default: both.",
    )


# The longest single tests as ``make test`` measures them (most first): the soak, then the
# crash-start loops. Under ``--dist loadgroup`` xdist hands out the groups first (largest
# first), then single tests in collection order, two pending per worker; a long test collected
# last (tests/soak sorts late) starts when the other worker is nearly done and runs alone at
# the tail. Started first, the short tests fill in around them.
LONGEST_FIRST = ("tests/soak/", "tests/kafka/test_crash_start.py")


def _start_rank(item: pytest.Item) -> int:
    """0.. for the tests named in ``LONGEST_FIRST``, then the other ``slow`` ones, then the rest."""
    path = item.nodeid
    for rank, prefix in enumerate(LONGEST_FIRST):
        if path.startswith(prefix):
            return rank
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--kafka-line``: deselect the real-Kafka tests parametrised with another line. Then the
    long tests first (``_start_rank``; a stable sort, so the order within a rank is kept)."""
    line = config.getoption("--kafka-line")
    if line is not None:
        keep, drop = [], []
        for item in items:
            params = getattr(item, "callspec", None)
            other = params is not None and any(
                params.params.get(name) not in (None, line) for name in ("line", "kafka_version")
            )
            (drop if other else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    items.sort(key=_start_rank)



def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under ``--dist loadgroup``, a test marked ``xdist_group`` fails, before its fixtures start
    a control plane or a Spark cluster, unless its node id carries the group: that is all xdist's
    scheduler groups by. With pytest 9.2 (node ids derived from a field xdist 3.8 does not set)
    grouping stopped without a word, and both workers started a control plane of their own."""
    grouped = item.get_closest_marker("xdist_group") and getattr(item.config.option, "loadgroup", False)
    if grouped and "@" not in item.nodeid.rpartition("]")[2]:
        pytest.fail(f"pytest-xdist's xdist_group is not in effect with pytest {pytest.__version__}: "
                    f"{item.nodeid} has no group in its node id (pyproject.toml pins a pytest "
                    "whose node ids xdist can set)", pytrace=False)
