"""``make demo-kafka``: kafka-cleaner on a real Apache Kafka broker's log dir.

1. Start a real single-node KRaft broker (the jars ``make setup`` resolved from Maven Central)
   and produce a realistic workload through it with kafka-python: a compacted topic of three
   partitions with 1 MiB segments, keys with many versions, tombstones, every codec,
   headers, an idempotent producer, transactions committed and aborted.
2. Stop the broker, show ``kafka-cleaner status``, and run ``kafka-cleaner clean``.
3. Start the broker again; a consumer reads every partition from the earliest offset and
   gets the same latest value for every key as before the clean, at the same offsets.

The broker, its workload and its reader are the real-broker tests' own (``tests/kafka_broker.py``,
``tests/kafka/broker_workload.py``): one implementation of each. The broker's dirs live in a
temporary directory removed at the end (``--keep`` keeps it to look at).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "kafka")]

from broker_workload import CLI, PARTITIONS, POLICY, TOPIC, Rec, latest, produce_workload, read_all  # noqa: E402
from kafka_broker import KAFKA_LINES, RealBroker, available, partition_files  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cleaner.output import binary_bytes  # noqa: E402


def _kafka_cleaner(console: Console, *args: str) -> None:
    console.print(f"[bold]$ kafka-cleaner {' '.join(args)}[/bold]")
    done = subprocess.run([str(CLI), *args], text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"kafka-cleaner {args[0]} exited with {done.returncode}")


def _on_disk(broker: RealBroker) -> dict[int, int]:
    files = partition_files(broker.log_dir, TOPIC)
    return {int(name.rsplit("-", 1)[1]): sum(sizes.values()) for name, sizes in files.items()}


def _per_partition(records: list[Rec]) -> dict[int, int]:
    counts = dict.fromkeys(range(PARTITIONS), 0)
    for r in records:
        counts[r.partition] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kafka", choices=KAFKA_LINES, default=KAFKA_LINES[0], help="Kafka line (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="workload rounds to produce (~5 MB each)")
    parser.add_argument("--keep", action="store_true", help="keep the broker's dirs and print where")
    args = parser.parse_args()
    if not available(args.kafka):
        raise SystemExit(f"Kafka {args.kafka}'s jars are not in .tools/kafka: run make setup")
    console = Console() if sys.stdout.isatty() else Console(width=160)
    root = Path(tempfile.mkdtemp(prefix="kafka-cleaner-demo-kafka-"))
    try:
        _demo(console, root, args.kafka, args.rounds)
    finally:
        if args.keep:
            console.print(f"the broker's dirs are in {root} (config {root / 'broker' / 'server.properties'})")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _demo(console: Console, root: Path, line: str, rounds: int) -> None:
    console.rule(f"1. a real Kafka {line} broker, and a workload produced through it")
    started = time.monotonic()
    broker = RealBroker(root / "broker", line, separate_metadata=False).start()
    console.print(f"broker up at {broker.bootstrap} in {time.monotonic() - started:.1f} s, log dir {broker.log_dir}")
    try:
        broker.create_topic(TOPIC, PARTITIONS, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        for n in range(rounds):
            produce_workload(broker, seed=n)
            console.print(
                f"produced round {n + 1} of {rounds}: 6 producers (every codec, idempotent) and 12 transactions"
            )
        before = read_all(broker, "read_committed")
        offsets = broker.offsets(TOPIC, PARTITIONS)
    finally:
        broker.stop()
    bytes_before = _on_disk(broker)
    console.print(
        f"broker stopped; {TOPIC}: {len(before):,} committed records, {binary_bytes(sum(bytes_before.values()))}"
    )

    console.rule("2. with the broker stopped: status, then clean")
    policy = root / "policy.yaml"
    policy.write_text(POLICY)
    _kafka_cleaner(console, "status", str(broker.log_dir), "--policy", str(policy), "--topic", TOPIC)
    _kafka_cleaner(console, "clean", str(broker.log_dir), "--policy", str(policy))
    bytes_after = _on_disk(broker)

    console.rule("3. the broker again, and a consumer from the earliest offset")
    broker.start()
    try:
        after = read_all(broker, "read_committed")
        offsets_after = broker.offsets(TOPIC, PARTITIONS)
        problems = broker.problems([TOPIC])
    finally:
        broker.stop()
    want, got = latest(before), latest(after)
    sample = sorted(k for k, v in got.items() if v is not None)[:: max(1, len(got) // 5)][:5]
    for partition, key in sample:
        value = got[(partition, key)]
        shown = f"the value of the workload's record #{value.split(b':', 1)[0].decode()} ({len(value)} bytes)"
        console.print(f"  partition {partition} key {key.decode()}: {shown}")

    table = Table(title=f"{TOPIC}: before and after kafka-cleaner clean, as the broker serves it")
    for col in ("partition", "on disk before", "on disk after", "records before", "records after", "offsets"):
        table.add_column(col, justify="left" if col == "partition" else "right")
    counts_before, counts_after = _per_partition(before), _per_partition(after)
    for p in range(PARTITIONS):
        first, end = offsets_after[p]
        table.add_row(
            f"{TOPIC}-{p}",
            binary_bytes(bytes_before.get(p, 0)),
            binary_bytes(bytes_after.get(p, 0)),
            f"{counts_before[p]:,}",
            f"{counts_after[p]:,}",
            f"{first:,}..{end:,}" + ("" if offsets_after[p] == offsets[p] else " (moved!)"),
        )
    console.print(table)
    verdicts = [
        ("every key's latest committed value served as before", got == want),
        ("earliest and latest offsets unchanged", offsets_after == offsets),
        ("no ERROR or WARN about the topic in the broker's log", not problems),
    ]
    for text, ok in verdicts:
        console.print(f"  [{'green' if ok else 'red'}]{'yes' if ok else 'NO'}[/]  {text}")
    if not all(ok for _, ok in verdicts):
        console.print("\n".join(problems[:10]))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
