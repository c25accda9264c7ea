"""What compaction beside a live broker does to the broker's latency (issue 26, item 3).

One real broker (``tests/kafka_broker.py``, the line given) on this machine's disk carries two
topics:

- ``load``: a fixed produce rate (``--rate`` records/s of 1 KiB, ``acks=all``, no linger) and a
  consumer tailing it. Each record carries its send time: the *produce* latency is send to
  acknowledgement, the *end-to-end* latency send to the consumer's receipt (one clock, one
  host).
- ``big``: one partition of ``--big-mb`` MB of 1 KiB records over ``--keys`` keys (most
  records superseded), ``cleanup.policy=delete`` until phase (c): nobody compacts it before.

Three phases of ``--seconds`` each, the same load, the page cache dropped before each where
the kernel allows it:

(a) nothing beside the broker;
(b) ``kafka-cleaner sidecar`` in stage mode staging ``big`` (reads the live partition, writes
    the cleaned set to its stage directory on the same disk; the policy's I/O throttle is
    the default unless ``--max-io-mb`` is given);
(c) Kafka's own cleaner compacting the same partition (``cleanup.policy`` altered to
    ``compact``; ``log.cleaner.backoff.ms`` 500, so it starts within the phase).

A warm-up load runs first (the broker's JIT, the clients). Printed: p50 / p99 / p999 / max of
both latencies per phase, and for (b) and (c) also over the records sent while the compaction
work ran (from its start until the sidecar's staged set appeared, or the broker's
``cleaner-offset-checkpoint`` named ``big``); the records sent and received; (b) and (c) over
(a). Figures
depend on the machine and what else runs on it (the load average is printed); nothing
asserts them.

    .venv/bin/python bench/broker_impact.py                      # Kafka 4.3.1, 256 MB, 45 s phases
    .venv/bin/python bench/broker_impact.py --kafka 3.9.2 --big-mb 512 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the real-broker harness the tests use

from kafka_broker import RealBroker, available, wait_until  # noqa: E402
from ports import free_port  # noqa: E402

KAFKA_CLEANER = REPO / ".venv" / "bin" / "kafka-cleaner"
VALUE_BYTES = 1024


@dataclass
class Latencies:
    """Each record's (send time, ms): produce (to the acknowledgement) and end to end."""

    produce: list[tuple[float, float]] = field(default_factory=list)
    end_to_end: list[tuple[float, float]] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    work: tuple[float, float] | None = None  # wall-clock window of the compaction beside it
    work_note: str = "-"

    @staticmethod
    def percentile(values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def values(self, kind: str, during_work: bool = False) -> list[float]:
        pairs = self.produce if kind == "produce" else self.end_to_end
        if during_work:
            if self.work is None:
                return []
            return [ms for t, ms in pairs if self.work[0] <= t <= self.work[1]]
        return [ms for _, ms in pairs]

    def row(self, name: str, kind: str, during_work: bool = False) -> list[str]:
        values = self.values(kind, during_work)
        figures = [self.percentile(values, q) for q in (0.5, 0.99, 0.999)] + [max(values, default=float("nan"))]
        return [name + (" (during the work)" if during_work else ""), kind, str(len(values)),
                *(f"{v:.1f}" for v in figures)]  # fmt: skip


def drop_page_cache() -> bool:
    """Start each phase from a cold cache, as far as the kernel lets this process."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def fill_big(broker: RealBroker, megabytes: int, keys: int) -> int:
    """``big`` with ``megabytes`` of 1 KiB records over ``keys`` keys; returns the records."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1, linger_ms=20, batch_size=512 * 1024)
    rng = random.Random(7)
    payload = rng.randbytes(VALUE_BYTES)
    n = megabytes * 1024 * 1024 // (VALUE_BYTES + 40)
    for i in range(n):
        value = payload[: VALUE_BYTES - 8] + struct.pack(">q", i)
        producer.send("big", key=b"key-%d" % rng.randrange(keys), value=value, partition=0)
    producer.flush(600)
    producer.close(10)
    return n


def run_load(bootstrap: str, rate: int, seconds: float) -> Latencies:
    """``rate`` records/s to ``load`` for ``seconds``, with a consumer tailing it."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    out = Latencies()
    lock = threading.Lock()
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_in_flight_requests_per_connection=5
    )
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    tp = TopicPartition("load", 0)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for messages in consumer.poll(timeout_ms=50).values():
                now = time.time()
                with lock:
                    for m in messages:
                        sent_at = struct.unpack(">d", m.value[:8])[0]
                        out.end_to_end.append((sent_at, (now - sent_at) * 1000))
                        out.received += 1

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    pad = b"x" * (VALUE_BYTES - 8)
    began = time.perf_counter()
    total = int(rate * seconds)
    for i in range(total):
        due = began + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent, sent_at = time.perf_counter(), time.time()
        future = producer.send("load", value=struct.pack(">d", sent_at) + pad, partition=0)
        future.add_callback(lambda _md, t=sent, w=sent_at: out.produce.append((w, (time.perf_counter() - t) * 1000)))
        out.sent += 1
    producer.flush(60)
    deadline = time.monotonic() + 30
    while out.received < out.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join(5)
    producer.close(10)
    consumer.close()
    return out


class Watch(threading.Thread):
    """Times a piece of work beside the load: from its start until ``done()`` is true."""

    def __init__(self, done) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.done, self.began, self.ended = done, time.time(), None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.done():
                self.ended = time.time()
                return
            time.sleep(0.2)

    def into(self, lat: Latencies) -> None:
        self.stop.set()
        if self.ended is None:
            lat.work, lat.work_note = (self.began, time.time()), "not finished within the phase"
        else:
            lat.work, lat.work_note = (self.began, self.ended), f"{self.ended - self.began:.1f} s"


def sidecar_policy(path: Path, max_io_mb: float | None) -> None:
    cleaner: dict[str, int] = {"threads": 1}
    if max_io_mb is not None:
        cleaner["maxIoBytesPerSecond"] = int(max_io_mb * 1024 * 1024)
    path.write_text(json.dumps({
        "mode": "stage",
        "topics": [{"match": "big", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}],
        "stage": {"minFreeDiskRatio": 0.05},
        "cleaner": cleaner,
    }))  # fmt: skip


def staged_sets(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
            return int((json.load(r).get("stage") or {}).get("sets") or 0)
    except OSError:
        return 0


def kafka_cleaned_big(log_dir: Path) -> bool:
    checkpoint = log_dir / "cleaner-offset-checkpoint"
    try:
        return any(line.startswith("big 0 ") for line in checkpoint.read_text().splitlines())
    except FileNotFoundError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kafka", default="4.3.1", help="Kafka line (4.3.1, 3.9.2)")
    parser.add_argument("--big-mb", type=int, default=256, help="size of the partition compacted beside the load")
    parser.add_argument("--keys", type=int, default=20_000, help="distinct keys in it")
    parser.add_argument("--rate", type=int, default=500, help="records/s of the measured load")
    parser.add_argument("--seconds", type=float, default=45.0, help="length of each phase")
    parser.add_argument("--max-io-mb", type=float, default=None, help="the sidecar's maxIoBytesPerSecond, MiB/s")
    parser.add_argument("--dir", default=None, help="where the broker's files go (default: a temp dir on /var/tmp)")
    args = parser.parse_args()
    if not available(args.kafka):
        raise SystemExit(f"Kafka {args.kafka} is not installed here: `make kafka` (scripts/get-kafka.sh) fetches it")
    root = Path(args.dir or tempfile.mkdtemp(prefix="broker-impact-", dir="/var/tmp"))
    extra = {"log.cleaner.dedupe.buffer.size": str(128 << 20)}
    broker = RealBroker(root / "broker", args.kafka, cleaner_enable=True, extra=extra)
    broker.start()
    sidecar = None
    results: dict[str, Latencies] = {}
    try:
        broker.create_topic("load", 1, {})
        broker.create_topic("big", 1, {"cleanup.policy": "delete", "segment.bytes": str(16 << 20)})
        started = time.monotonic()
        records = fill_big(broker, args.big_mb, args.keys)
        print(
            f"big: {records} records, {args.big_mb} MB, {args.keys} keys, written in {time.monotonic() - started:.1f} s"
        )
        run_load(broker.bootstrap, args.rate, min(args.seconds, 15))  # warm-up: the JIT, the clients
        dropped = drop_page_cache()
        results["(a) nothing beside"] = run_load(broker.bootstrap, args.rate, args.seconds)

        port = free_port()
        policy = root / "policy.json"
        sidecar_policy(policy, args.max_io_mb)
        drop_page_cache()
        with open(root / "sidecar.log", "wb") as sidecar_log:
            sidecar = subprocess.Popen(
                [str(KAFKA_CLEANER), "sidecar", "--policy", str(policy), "--log-dir", str(broker.log_dir),
                 "--listen", f"127.0.0.1:{port}", "--no-gate", "--broker-name", "bench"],
                stdout=subprocess.DEVNULL, stderr=sidecar_log,
            )  # fmt: skip
        watch = Watch(lambda: staged_sets(port) > 0)
        watch.start()
        results["(b) kafka-cleaner staging"] = run_load(broker.bootstrap, args.rate, args.seconds)
        watch.into(results["(b) kafka-cleaner staging"])
        sidecar.terminate()
        sidecar.wait(60)
        sidecar = None

        drop_page_cache()
        from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    "big",
                    configs={
                        "cleanup.policy": "compact",
                        "segment.bytes": str(16 << 20),
                        "min.cleanable.dirty.ratio": "0.01",
                    },
                )
            ]
        )
        admin.close()
        watch = Watch(lambda: kafka_cleaned_big(broker.log_dir))
        watch.start()
        results[f"(c) Kafka {args.kafka}'s cleaner"] = run_load(broker.bootstrap, args.rate, args.seconds)
        watch.into(results[f"(c) Kafka {args.kafka}'s cleaner"])
        wait_until(lambda: kafka_cleaned_big(broker.log_dir), "Kafka's cleaner to finish big", 600)
    finally:
        if sidecar is not None:
            sidecar.kill()
        broker.stop()

    print(f"\nKafka {args.kafka}, {args.rate} records/s of {VALUE_BYTES} B for {args.seconds:.0f} s a phase; "
          f"page cache dropped before each: {'yes' if dropped else 'no (not permitted)'}; "
          f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; files under {root}")  # fmt: skip
    header = ["phase", "latency", "records", "p50 ms", "p99 ms", "p999 ms", "max ms"]
    rows = [lat.row(name, kind) for name, lat in results.items() for kind in ("produce", "end-to-end")]
    rows += [lat.row(name, kind, during_work=True) for name, lat in list(results.items())[1:]
             for kind in ("produce", "end-to-end")]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    for name, lat in results.items():
        print(f"{name}: sent {lat.sent}, received {lat.received}, compaction work beside it: {lat.work_note}")
    p = Latencies.percentile
    base = results["(a) nothing beside"]
    for name, lat in list(results.items())[1:]:
        for kind in ("produce", "end-to-end"):
            a, b, w = base.values(kind), lat.values(kind), lat.values(kind, during_work=True)
            print(f"{name} / (a), {kind}: p99 {p(b, 0.99) / p(a, 0.99):.2f}x, p999 {p(b, 0.999) / p(a, 0.999):.2f}x;"
                  f" during the work p99 {p(w, 0.99) / p(a, 0.99):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
