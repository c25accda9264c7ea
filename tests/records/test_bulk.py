"""``cleaner.records.bulk``: many batches encoded at once are byte for byte what
``build_batch`` writes for the same records, for every codec and every batch parameter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.records import bulk
from cleaner.records.batch import TimestampType
from cleaner.records.builder import build_batch
from cleaner.records.bulk import Spans, build_batches, encode_records
from cleaner.records.columns import decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.record import Record
from cleaner.records.scan import scan_batches

CODECS = list(CompressionType)

# Keys longer than INLINE_KEY_LIMIT take the gather path instead of the column scatter.
keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=20), st.binary(min_size=60, max_size=90))
values = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(max_size=200),
    st.builds(lambda chunk, n: chunk * n, st.binary(min_size=1, max_size=8), st.integers(20, 200)),
)
timestamps = st.one_of(st.just(-1), st.integers(0, 2**45), st.integers(1_700_000_000_000, 1_700_000_100_000))


@st.composite
def batch_specs(draw: st.DrawFn) -> list[dict]:
    """Consecutive batches: records with increasing offsets (gaps allowed, as after
    compaction), optional base offset below the first record, empty batches."""
    specs = []
    offset = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 8))
        base = offset
        records = []
        for _ in range(n):
            offset += draw(st.integers(0, 3))
            records.append(Record(offset, draw(timestamps), draw(keys), draw(values)))
            offset += 1
        last_delta = (records[-1].offset - base) if records else 0
        spec = {
            "records": records,
            "base_offset": base if (not records or draw(st.booleans())) else None,
            "timestamp_type": draw(st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME])),
            "producer_id": draw(st.sampled_from([-1, 0, 7, 2**40])),
            "producer_epoch": draw(st.sampled_from([-1, 0, 3, 32767])),
            "base_sequence": draw(st.sampled_from([-1, 0, 41, 2**31 - 1])),
            "is_transactional": draw(st.booleans()),
            "partition_leader_epoch": draw(st.sampled_from([-1, 0, 12])),
            "last_offset_delta": last_delta + draw(st.sampled_from([0, 0, 2])) if draw(st.booleans()) else None,
            "max_timestamp": draw(st.integers(0, 2**45)) if draw(st.booleans()) else None,
        }
        if spec["base_offset"] is None:
            spec["last_offset_delta"] = None if spec["last_offset_delta"] is None else last_delta
        specs.append(spec)
        offset += draw(st.integers(0, 2))
    return specs


def expected(specs: list[dict], codec: int) -> list[bytes]:
    return [
        build_batch(
            s["records"],
            base_offset=s["base_offset"],
            compression=codec,
            timestamp_type=s["timestamp_type"],
            producer_id=s["producer_id"],
            producer_epoch=s["producer_epoch"],
            base_sequence=s["base_sequence"],
            is_transactional=s["is_transactional"],
            partition_leader_epoch=s["partition_leader_epoch"],
            last_offset_delta=s["last_offset_delta"],
            max_timestamp=s["max_timestamp"],
        )
        for s in specs
    ]


def bulk_build(specs: list[dict], codec: int) -> list[bytes]:
    records = [r for s in specs for r in s["records"]]
    counts = [len(s["records"]) for s in specs]
    bases = [
        s["base_offset"] if s["base_offset"] is not None else (s["records"][0].offset if s["records"] else 0)
        for s in specs
    ]
    natural_deltas = [s["records"][-1].offset - bases[i] if s["records"] else 0 for i, s in enumerate(specs)]
    return build_batches(
        counts,
        [r.offset for r in records],
        [r.timestamp for r in records],
        Spans.of([r.key for r in records]),
        Spans.of([r.value for r in records]),
        base_offsets=bases,
        compression=codec,
        timestamp_type=[int(s["timestamp_type"]) for s in specs],
        producer_ids=[s["producer_id"] for s in specs],
        producer_epochs=[s["producer_epoch"] for s in specs],
        base_sequences=[s["base_sequence"] for s in specs],
        is_transactional=[s["is_transactional"] for s in specs],
        partition_leader_epoch=[s["partition_leader_epoch"] for s in specs],
        last_offset_deltas=[
            s["last_offset_delta"] if s["last_offset_delta"] is not None else natural_deltas[i]
            for i, s in enumerate(specs)
        ],
        max_timestamps=[
            s["max_timestamp"]
            if s["max_timestamp"] is not None
            else max((r.timestamp for r in s["records"]), default=-1)
            for s in specs
        ],
    )


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.kafka_name)
@settings(max_examples=60)
@given(specs=batch_specs())
def test_bulk_equals_build_batch(codec: CompressionType, specs: list[dict]) -> None:
    assert bulk_build(specs, codec) == expected(specs, codec)


@settings(max_examples=60)
@given(specs=batch_specs(), codec=st.sampled_from(CODECS))
def test_defaults_equal_build_batch_defaults(specs: list[dict], codec: CompressionType) -> None:
    """Without per-batch overrides, bulk derives base offset, max timestamp and last offset
    delta from the records exactly as build_batch does."""
    specs = [s for s in specs if s["records"]]
    if not specs:
        return
    records = [r for s in specs for r in s["records"]]
    got = build_batches(
        [len(s["records"]) for s in specs],
        [r.offset for r in records],
        [r.timestamp for r in records],
        Spans.of([r.key for r in records]),
        Spans.of([r.value for r in records]),
        compression=codec,
    )
    assert got == [build_batch(s["records"], compression=codec) for s in specs]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.kafka_name)
def test_background_values_decode_as_the_pattern(codec: CompressionType) -> None:
    """The fast path: value bytes are the background at their position in the records
    section; the batches decode, and equal build_batch over the decoded records."""
    rng = np.random.default_rng(5)
    n = 500
    counts = np.array([100, 1, 150, 249])
    offsets = np.arange(n) + 1_000
    ts = 1_700_000_000_000 + np.arange(n) * 3
    key_ids = rng.integers(0, 1000, n)
    key_matrix = np.frombuffer(b"".join(b"key-%04d" % k for k in key_ids), dtype=np.uint8).reshape(n, -1)
    lengths = rng.integers(0, 300, n)
    lengths[rng.random(n) < 0.1] = -1
    background = np.frombuffer(b'{"field":"value","n":12345}' * 40, dtype=np.uint8)
    out = build_batches(
        counts, offsets, ts, Spans.from_matrix(key_matrix), lengths, background=background, compression=codec
    )
    section, ends = encode_records(
        offsets - np.repeat(offsets[np.cumsum(counts) - counts], counts),
        ts - np.repeat(ts[np.cumsum(counts) - counts], counts),
        Spans.from_matrix(key_matrix),
        lengths,
        background=background,
    )
    tiled = np.resize(background, section.size)
    records = decode_records(scan_batches(b"".join(out)).batches).records()
    assert [r.offset for r in records] == offsets.tolist()
    assert [r.key for r in records] == [bytes(row) for row in key_matrix]
    assert [-1 if r.value is None else len(r.value) for r in records] == lengths.tolist()
    # Every value is the tiled pattern at its place in the uncompressed section.
    value_ends = ends - 1
    for r, end, length in zip(records, value_ends.tolist(), lengths.tolist(), strict=True):
        if length > 0:
            assert r.value == tiled[end - length : end].tobytes()
    starts = np.cumsum(counts) - counts
    rebuilt = [build_batch(records[s : s + c], compression=codec) for s, c in zip(starts, counts, strict=True)]
    assert out == rebuilt


def test_long_and_short_key_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [b"k" * (i % 80) if i % 7 else None for i in range(300)]
    values = [b"v%d" % i if i % 5 else None for i in range(300)]
    args = ([300], np.arange(300), np.full(300, 5_000), Spans.of(items), Spans.of(values))
    inline = build_batches(*args)
    monkeypatch.setattr(bulk, "INLINE_KEY_LIMIT", 0)
    assert build_batches(*args) == inline
    monkeypatch.setattr(bulk, "INLINE_KEY_LIMIT", 1000)
    assert build_batches(*args) == inline


def test_spans_from_matrix_with_lengths() -> None:
    matrix = np.frombuffer(b"abcdefghijkl", dtype=np.uint8).reshape(3, 4)
    spans = Spans.from_matrix(matrix, np.array([4, -1, 2]))
    got = build_batches([3], [0, 1, 2], [7, 7, 7], spans, Spans.of([b"x", b"y", b"z"]))
    want = build_batch([Record(0, 7, b"abcd", b"x"), Record(1, 7, None, b"y"), Record(2, 7, b"ij", b"z")])
    assert got == [want]
    with pytest.raises(ValueError, match="lengths"):
        Spans.from_matrix(matrix, np.array([5, 0, 0]))


@pytest.mark.parametrize(
    ("offsets", "ts", "kwargs", "message"),
    [
        ([0, 0], [1, 1], {}, "strictly increasing"),
        ([5, 4], [1, 1], {}, "strictly increasing"),
        ([3, 4], [1, 1], {"base_offsets": [4]}, "strictly increasing"),
        ([0, 2**31], [1, 1], {}, "too far"),
        ([0, 1], [1, -5], {}, "negative timestamp"),
        ([0, 1], [1, 1], {"last_offset_deltas": [0]}, "last_offset_delta"),
    ],
)
def test_same_checks_as_build_batch(offsets: list[int], ts: list[int], kwargs: dict, message: str) -> None:
    records = [Record(o, t, b"k", b"v") for o, t in zip(offsets, ts, strict=True)]
    build_kwargs = {
        "base_offset": kwargs["base_offsets"][0] if "base_offsets" in kwargs else None,
        "last_offset_delta": kwargs["last_offset_deltas"][0] if "last_offset_deltas" in kwargs else None,
    }
    with pytest.raises(ValueError, match=message):
        build_batch(records, **build_kwargs)
    with pytest.raises(ValueError, match=message):
        build_batches([2], offsets, ts, Spans.of([b"k", b"k"]), Spans.of([b"v", b"v"]), **kwargs)


def test_empty_batch_needs_a_base_offset_and_values_need_bytes() -> None:
    with pytest.raises(ValueError, match="base_offset"):
        build_batches([0], [], [], Spans.of([]), Spans.of([]))
    assert build_batches([0], [], [], Spans.of([]), Spans.of([]), base_offsets=[9]) == [build_batch([], base_offset=9)]
    with pytest.raises(ValueError, match="background"):
        encode_records([0], [0], Spans.of([b"k"]), [3])
