"""One real SparkSession (``local[2]``, each task attempted up to 4 times) for every Spark
test, and the generated inputs they share.

Every Spark test module carries ``pytest.mark.xdist_group("spark")``, so that under
``pytest -n`` all of them run in one worker and share this session (one JVM start-up).
Constants and helpers live in ``spark_helpers`` (``import conftest`` could find another
directory's conftest.py). The session is the package's own (``cleaner.spark.session``): quiet log4j2
configuration, no UI, ``SPARK_LOCAL_IP=127.0.0.1``, the executors' Python is this
interpreter with ``PYTHONSAFEPATH=1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import Policy, parse_policy_text
from cleaner.generate import GeneratorConfig, generate
from cleaner.storage.log import Log

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from spark_helpers import FLEET_POLICY, LARGE_POLICY, LARGE_TP, NOW, set_high_watermark


@pytest.fixture(scope="session")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from cleaner.spark.session import spark_session

    # A driver that may take 1 MiB of task results in all: every job here must keep per-key
    # data off the driver (issue 28; test_a_map_full_of_many_keys_is_cut_on_the_executors).
    session = spark_session("local[2,4]", app_name="kafka-cleaner-tests", conf={"spark.driver.maxResultSize": "1m"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def fleet_policy() -> Policy:
    return parse_policy_text(FLEET_POLICY)


@pytest.fixture(scope="session")
def large_policy() -> Policy:
    return parse_policy_text(LARGE_POLICY)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory) -> Path:
    """A broker log dir: five topics of two partitions (codecs none, lz4, zstd, snappy,
    gzip; topic-2 with LogAppendTime), tombstones, idempotent producers, transactions (some
    aborted), 32 KiB segments. Read-only: copy it before changing it."""
    root = tmp_path_factory.mktemp("fleet") / "data"
    generate(
        root,
        GeneratorConfig(
            topics=5,
            partitions=2,
            records=3_000,
            keys=400,
            value_bytes=600,  # over the generator's 1 MiB chunk: tombstones come from the second
            tombstones=0.1,
            compression="mixed",
            transactions=0.3,
            idempotent=True,
            segment_bytes=32 * 1024,
            now_ms=NOW,
            seed=7,
        ),
    )
    return root


@pytest.fixture(scope="session")
def fleet_cleaned(tmp_path_factory, fleet, fleet_policy) -> Path:
    """``fleet`` after ``kafka-cleaner clean`` (the single-node engine) at ``NOW``."""
    root = tmp_path_factory.mktemp("fleet-cleaned") / "data"
    shutil.copytree(fleet, root)
    cleaning.clean([root], fleet_policy, FixedTime(NOW))
    return root


@pytest.fixture(scope="session")
def fleet_report(spark, fleet, fleet_policy) -> list[dict]:
    """The rows of ``spark report`` of ``fleet`` at ``NOW``, which left it as it was."""
    from kafka_logs import snapshot_dir

    from cleaner.spark.report import report

    before = snapshot_dir(fleet)
    rows, _, _ = report(spark, [fleet], fleet_policy, now_ms=NOW)
    assert snapshot_dir(fleet) == before
    return rows


@pytest.fixture(scope="session")
def large(tmp_path_factory) -> Path:
    """A log dir with one partition of dozens of gzip segments (tombstones, transactions
    with aborts), its high watermark at half the log: a first clean covers only part of
    it. Read-only."""
    root = tmp_path_factory.mktemp("large") / "data"
    generate(
        root,
        GeneratorConfig(
            topics=1,
            partitions=1,
            records=24_000,
            keys=2_500,
            tombstones=0.1,
            compression="gzip",
            transactions=0.3,
            segment_bytes=24 * 1024,
            topic_prefix="big",
            now_ms=NOW,
            seed=11,
        ),
    )
    log = Log.open(root / LARGE_TP.dir_name, read_only=True)
    set_high_watermark(root, LARGE_TP, log.log_end_offset // 2)
    return root


@pytest.fixture(scope="session")
def large_cleaned(tmp_path_factory, large, large_policy) -> Path:
    """``large`` after ``kafka-cleaner clean`` at ``NOW`` (one round, up to the high watermark)."""
    root = tmp_path_factory.mktemp("large-cleaned") / "data"
    shutil.copytree(large, root)
    cleaning.clean([root], large_policy, FixedTime(NOW))
    return root
