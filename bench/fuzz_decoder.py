"""Coverage-guided fuzzing of the record decoder (atheris, libFuzzer's engine for Python).

Every input is taken as bytes of a ``.log`` file and read the way the cleaner reads one:
``scan_batches`` (entry framing, headers, CRCs), ``decode_records`` (decompression and the
compiled core's record decoding), the records' keys, values and headers, and each legacy
entry's messages. The only acceptable failure is a typed ``CorruptDataError`` (it names the
position and the reason); anything else, a panic of the compiled core included
(``pyo3_runtime.PanicException``), is a crash that libFuzzer reports with its input.

    make fuzz                                   # 10 minutes
    .venv/bin/python bench/fuzz_decoder.py -max_total_time=60 .tools/fuzz/corpus

The corpus starts from small valid logs of every codec and a legacy message set, written
into ``.tools/fuzz/corpus`` (libFuzzer adds what it finds there). Coverage is that of the
Python code around the core; the core's own branches are reached through it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from cleaner.errors import CorruptDataError
    from cleaner.records.builder import build_batch
    from cleaner.records.columns import decode_records
    from cleaner.records.compression import CompressionType
    from cleaner.records.record import Record
    from cleaner.records.scan import scan_batches

MAX_DECOMPRESSED = 1 << 22


def read_log(data: bytes) -> None:
    result = scan_batches(data)
    batches = result.batches
    batches.verify_checksums()
    cols = decode_records(batches, max_decompressed_bytes=MAX_DECOMPRESSED)
    for i in range(min(len(cols), 64)):
        cols.record(i)
    for entry in batches.legacy.values():
        entry.records(verify_crc=True, max_size=MAX_DECOMPRESSED)


def test_one_input(data: bytes) -> None:
    with contextlib.suppress(CorruptDataError):
        read_log(data)


def seed_corpus(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        return
    records = [
        Record(i, 1_700_000_000_000 + i, b"key-%d" % (i % 3), None if i % 5 == 4 else b"value-%d" % i, (("h", b"v"),))
        for i in range(12)
    ]
    for codec in CompressionType:
        (directory / f"seed-{codec.name.lower()}").write_bytes(
            build_batch(records[:6], compression=codec) + build_batch(records[6:], compression=codec)
        )


def main() -> None:
    corpus = next((Path(a) for a in sys.argv[1:] if not a.startswith("-")), None)
    if corpus is not None:
        seed_corpus(corpus)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
