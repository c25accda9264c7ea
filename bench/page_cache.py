"""What a clean leaves in the page cache, with and without page-cache-neutral I/O.

Generates a broker log dir (~256 MiB; ``--size-mb``), then for each mode on a fresh copy:
drops the copy's pages, reads every partition's active segment (the broker's hot pages:
consumers at the tail), runs ``kafka-cleaner clean`` in a process of its own, and counts with
``mincore(2)`` what is resident afterwards:

- ``hot kept``   of the active segments' pages resident before the clean, those still resident;
- ``left``       every other page of the log dir resident after the clean (segments read,
                 cleaned segments written): what the clean added to the broker's cache.

Modes: ``keep`` (``KAFKA_CLEANER_PAGE_CACHE=keep``: plain buffered I/O, as Kafka's cleaner
does) and ``neutral`` (the default: ``cleaner.storage.page_cache``). Without memory pressure
nothing is evicted, so ``hot kept`` is 100% in both; ``left`` is what would push the broker's
pages out under pressure.

Run: ``.venv/bin/python bench/page_cache.py [--size-mb 256]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cleaner.generate import GeneratorConfig, generate
from cleaner.storage import page_cache

CLI = Path(sys.executable).with_name("kafka-cleaner")
POLICY = "mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n"


def _pages(path: Path) -> tuple[int, int]:
    """(resident, total) pages of a file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        vector = page_cache.resident_pages(fd, size) or bytearray()
        return sum(v & 1 for v in vector), (size + page_cache.PAGE - 1) // page_cache.PAGE
    finally:
        os.close(fd)


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # DONTNEED leaves dirty pages alone
        page_cache.drop(fd)
    finally:
        os.close(fd)


def _active_segments(logs: Path) -> list[Path]:
    return [sorted(d.glob("*.log"))[-1] for d in sorted(logs.iterdir()) if d.is_dir() and list(d.glob("*.log"))]


def _resident_mib(files: list[Path]) -> float:
    return sum(_pages(f)[0] for f in files if f.exists()) * page_cache.PAGE / (1 << 20)


def run(mode: str, source: Path, work: Path, now_ms: int) -> list[tuple[str, float, float, float]]:
    """Per command (status, then clean): seconds, share of the hot pages kept, MiB left."""
    logs = work / mode
    shutil.copytree(source, logs)
    for f in logs.rglob("*"):
        if f.is_file():
            _drop(f)
    hot = _active_segments(logs)
    for f in hot:
        f.read_bytes()
    hot_before = _resident_mib(hot)
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_CLEANER_PAGE_CACHE"}
    if mode == "keep":
        env["KAFKA_CLEANER_PAGE_CACHE"] = "keep"
    rows = []
    for command in ("status", "clean"):
        extra = ["--no-progress"] if command == "clean" else []
        start = time.perf_counter()
        subprocess.run([str(CLI), command, str(logs), "--policy", str(policy), "--now-ms", str(now_ms), "-o", "tsv",
                        *extra], check=True, env=env, capture_output=True)
        elapsed = time.perf_counter() - start
        others = [f for f in logs.rglob("*") if f.is_file() and f not in hot]
        rows.append((command, elapsed, _resident_mib(hot) / max(hot_before, 1e-9), _resident_mib(others)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-page-cache-", dir=Path.home()))  # a disk, not tmpfs
    try:
        source = work / "source"
        records = args.size_mb * (1 << 20) // 140
        config = GeneratorConfig(topics=2, partitions=2, records=records // 4, value_bytes=100, seed=1)
        generate(source, config)
        print(f"log dir: {sum(f.stat().st_size for f in source.rglob('*') if f.is_file()) / (1 << 20):,.0f} MiB, "
              f"{len(_active_segments(source))} partitions; page {page_cache.PAGE} B")
        print(f"{'mode':8} {'command':8} {'s':>6} {'hot kept':>9} {'left MiB':>9}")
        for mode in ("keep", "neutral"):
            for command, elapsed, kept, left in run(mode, source, work, config.clock_ms):
                print(f"{mode:8} {command:8} {elapsed:6.2f} {kept:9.0%} {left:9,.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
