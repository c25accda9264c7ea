"""Kafka's ``DumpLogSegments`` (kafka-dump-log.sh) as a peer, on files kafka-cleaner wrote
(issue 9), for both Kafka lines:

- ``--deep-iteration`` and ``kafka-cleaner dump --deep`` print the same lines for every batch
  and record of every cleaned segment (transactions with their markers, idempotent
  producers; the codecs are the round-trip test's, through a real consumer);
- Kafka's ``--index-sanity-check`` passes on every ``.index`` and ``.timeindex`` written, and
  ``--verify-index-only`` finds no mismatch between an offset index and its log.

Not compared: ``--print-data-log``'s keys and payloads (``kafka-cleaner dump`` does not
print record contents; the round-trip test compares them through a real consumer).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from broker_workload import CLI, POLICY
from kafka_broker import EACH_KAFKA_LINE, libs

from cleaner.generate import GeneratorConfig, generate

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
]


def dump_log_segments(line: str, *args: str) -> str:
    main = "kafka.tools.DumpLogSegments" if line.startswith("3.") else "org.apache.kafka.tools.DumpLogSegments"
    done = subprocess.run(
        ["java", "-XX:TieredStopAtLevel=1", "-cp", f"{libs(line)}/*", main, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated log dir (transactions, idempotent producers),
    cleaned by kafka-cleaner: duplicates and aborted data go, batches are re-encoded."""
    root = tmp_path_factory.mktemp("peer")
    config = GeneratorConfig(
        topics=1,
        partitions=2,
        records=6_000,
        keys=600,
        segment_bytes=64 * 1024,
        transactions=0.2,
        idempotent=True,
        seed=9,
    )
    generate(root / "logs", config)
    policy = root / "policy.yaml"
    policy.write_text(POLICY.replace("match: compacted", "match: '.*'"))
    done = subprocess.run(
        [str(CLI), "clean", str(root / "logs"), "--policy", str(policy), "--now-ms", str(config.clock_ms)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "logs"


def test_kafka_and_kafka_cleaner_dump_the_same_batches_and_records(cleaned: Path, line: str) -> None:
    logs = sorted(cleaned.glob("*/*.log"))
    assert len(logs) >= 4
    theirs = dump_log_segments(line, "--deep-iteration", "--files", ",".join(map(str, logs)))
    ours = "".join(
        subprocess.run([str(CLI), "dump", "--deep", str(f)], capture_output=True, text=True, check=True).stdout
        for f in logs
    )
    for seen in ("isTransactional: true", "isControl: true", "endTxnMarker: COMMIT"):
        assert seen in ours, seen
    assert ours.splitlines() == theirs.splitlines()


def test_kafkas_index_checks_pass_on_every_index_written(cleaned: Path, line: str) -> None:
    indexes = sorted([*cleaned.glob("*/*.index"), *cleaned.glob("*/*.timeindex")])
    sanity = dump_log_segments(line, "--index-sanity-check", "--files", ",".join(map(str, indexes)))
    passed = [text for text in sanity.splitlines() if text.endswith(("passed sanity check.", "is empty."))]
    assert len(passed) == len(indexes), sanity
    verified = dump_log_segments(line, "--verify-index-only", "--files", ",".join(map(str, indexes)))
    findings = [text for text in verified.splitlines() if not text.startswith("Dumping ") and "is empty" not in text]
    assert findings == [], findings[:5]


def test_print_data_log_prints_kafkas_key_and_payload_lines(cleaned: Path, line: str) -> None:
    """``dump --print-data-log`` against ``kafka-dump-log.sh --print-data-log`` (Kafka's string
    decoder, UTF-8): the same lines, keys and payloads included; and ``--offsets`` keeps just
    the batches and records of the range."""
    logs = sorted(cleaned.glob("*/*.log"))
    theirs = dump_log_segments(line, "--print-data-log", "--files", ",".join(map(str, logs)))
    ours = "".join(
        subprocess.run([str(CLI), "dump", "--print-data-log", str(f)], capture_output=True, text=True,
                       check=True).stdout
        for f in logs
    )  # fmt: skip
    assert " key: " in ours and " payload: " in ours
    assert ours.splitlines() == theirs.splitlines()
    # A cleaned log has gaps: the range is taken from the offsets the first file holds.
    first = logs[0]
    everything = subprocess.run([str(CLI), "dump", "--print-data-log", str(first)], capture_output=True, text=True,
                                check=True).stdout.splitlines()  # fmt: skip
    held = [int(r.split()[2]) for r in everything if r.startswith("| offset: ")]
    low, high = held[1], held[3]
    ranged = subprocess.run([str(CLI), "dump", "--print-data-log", "--offsets", f"{low}:{high}", str(first)],
                            capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    assert [r for r in ranged if r.startswith("| offset: ")] == [
        r for r in everything if r.startswith("| offset: ") and low <= int(r.split()[2]) <= high]
    batches = [b for b in ranged if b.startswith("baseOffset: ")]
    assert batches and all(int(b.split()[3]) >= low and int(b.split()[1]) <= high for b in batches)
