"""The compiled core's lz4 and zstd codecs (``native/src/codecs.rs``) against the Python codecs
they replaced (``reference_codecs``): the same bytes written, the same sections read, the same
first unreadable batch named, whatever the number of threads; and the chunk path of
``decode_records`` against the one-section-at-a-time path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import reference_codecs as ref
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_compression import make_payload

from cleaner import _native
from cleaner.errors import CorruptRecordError
from cleaner.records import compression
from cleaner.records.builder import build_batch
from cleaner.records.columns import _decompress_sections, _decompress_sections_in_python, decode_records
from cleaner.records.compression import CODEC_THREADS_ENV, CompressionType, codec_threads
from cleaner.records.record import Record
from cleaner.records.scan import scan_batches

CODECS = [0, 3, 4]  # stored as is, lz4, zstd: what the core reads and writes


@st.composite
def payload(draw: st.DrawFn) -> bytes:
    size = draw(st.one_of(st.integers(0, 300), st.integers(0, 150_000), st.sampled_from([65_536, 65_537])))
    return make_payload(size, draw(st.integers(0, 2**32)), draw(st.sampled_from(["records", "random", "mixed"])))


@st.composite
def sections(draw: st.DrawFn, damage: bool = False) -> list[tuple[int, int, bytes, bytes]]:
    """(codec, magic, payload, section) for a few sections, written by the reference writers;
    with ``damage``, some sections truncated, flipped, spliced or replaced."""
    out = []
    for _ in range(draw(st.integers(0, 6))):
        codec = draw(st.sampled_from(CODECS))
        magic = draw(st.sampled_from([0, 1, 2])) if codec == 3 else 2
        data = draw(payload())
        section = ref.compress(codec, data, magic=magic) if codec else data
        if damage and codec and draw(st.booleans()):
            section = _damage(draw, section)
        out.append((codec, magic, data, section))
    return out


def _damage(draw: st.DrawFn, good: bytes) -> bytes:
    how = draw(st.sampled_from(["random", "truncate", "flip", "splice", "prefix"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    if how == "truncate":
        return good[: draw(st.integers(0, max(len(good) - 1, 0)))]
    if how == "flip":
        buf = bytearray(good)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(buf)
    if how == "splice":
        i = draw(st.integers(0, len(good)))
        return good[:i] + draw(st.binary(min_size=1, max_size=40)) + good[i:]
    return good[: draw(st.integers(0, 30))] + draw(st.binary(max_size=60))


def _layout(items: list[tuple[int, int, bytes, bytes]], pad: int = 3) -> tuple[bytes, dict[str, np.ndarray]]:
    """The sections in one buffer with a few bytes between them, and the core's arguments."""
    buf, starts, ends = bytearray(b"#" * pad), [], []
    for _, _, _, section in items:
        starts.append(len(buf))
        buf += section
        ends.append(len(buf))
        buf += b"#" * pad
    args = {
        "starts": np.array(starts, dtype=np.int64),
        "ends": np.array(ends, dtype=np.int64),
        "codecs": np.array([c for c, _, _, _ in items], dtype=np.int64),
        "magics": np.array([m for _, m, _, _ in items], dtype=np.int64),
    }
    return bytes(buf), args


def _reference(items, max_size: int | None):
    """Per section: the reference's output, or the first failing index and its error."""
    outputs = []
    for i, (codec, magic, _, section) in enumerate(items):
        if not codec:
            outputs.append(section)
            continue
        try:
            outputs.append(ref.decompress(codec, section, max_size=max_size, magic=magic))
        except CorruptRecordError as e:
            return outputs, (i, e.reason, e.position)
    return outputs, None


def _native_sections(buf: bytes, args: dict[str, np.ndarray], max_size: int | None, threads: int | None):
    return _native.decompress_sections(
        buf, args["starts"], args["ends"], args["codecs"], args["magics"], max_size, threads
    )


# ---- writing ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(items=sections(), threads=st.sampled_from([None, 1, 2, 3]))
def test_compressed_sections_are_the_reference_writers_bytes_and_read_back(items, threads) -> None:
    plain = [(c, m, d, d) for c, m, d, _ in items]
    buf, args = _layout(plain)
    out, bounds = _native.compress_sections(buf, args["starts"], args["ends"], args["codecs"], args["magics"], threads)
    assert bounds.tolist()[0] == 0 and bounds.tolist()[-1] == len(out) and len(bounds) == len(items) + 1
    got = [out[a:b] for a, b in itertools.pairwise(bounds.tolist())]
    assert got == [s for _, _, _, s in items]  # the reference writers' bytes (codec 0: as is)
    for (codec, magic, data, _), one in zip(items, got, strict=True):
        if codec:
            assert compression.compress(codec, data, magic=magic) == one
    # and back, in one call
    packed = [(c, m, d, s) for (c, m, d, _), s in zip(items, got, strict=True)]
    buf, args = _layout(packed)
    data, starts, ends, problem = _native_sections(buf, args, None, threads)
    assert problem is None
    assert [data[a:b] for a, b in zip(starts, ends, strict=True)] == [d for _, _, d, _ in items]


def test_compress_sections_refuses_codecs_it_does_not_write() -> None:
    for codec in (1, 2, 5):
        with pytest.raises(ValueError, match="not compressed in the compiled core"):
            _native.compress_sections(b"abc", np.array([0]), np.array([3]), np.array([codec]), np.array([2]))
        if codec != 5:
            with pytest.raises(ValueError):
                _native.compress_section(codec, b"abc")


# ---- reading ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    items=sections(damage=True),
    max_size=st.sampled_from([None, None, 1_000_000, 70_000, 1000]),
    threads=st.sampled_from([None, 1, 2, 4]),
)
def test_sections_read_as_the_reference_reads_them_one_at_a_time(items, max_size, threads) -> None:
    """Spans hold what per-section decompression gives; a damaged chunk's problem names the
    batch the reference fails on first, with the reference's reason (lz4: word for word,
    zstd: a zstd error or the size limit, as the reference)."""
    buf, args = _layout(items)
    expected, failure = _reference(items, max_size)
    data, starts, ends, problem = _native_sections(buf, args, max_size, threads)
    event("read" if failure is None else f"refused: {failure[1].split(' (')[0][:40]}")
    if failure is None:
        assert problem is None, problem
        assert [data[a:b] for a, b in zip(starts, ends, strict=True)] == expected
        return
    assert data is None and problem is not None
    batch, reason, position = problem
    want_batch, want_reason, want_position = failure
    assert batch == want_batch, (problem, failure)
    if items[batch][0] == 3:
        assert (reason, position) == (want_reason, want_position)
    else:
        too_large = "exceeds the limit" in want_reason
        assert ("exceeds the limit" in reason) == too_large, (reason, want_reason)
        assert too_large or reason.startswith("zstd: ")
        if max_size is None:
            assert (reason, position) == (want_reason, want_position)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(items=sections(damage=True), max_size=st.sampled_from([None, 100_000]))
def test_one_thread_or_several_give_the_same_result(items, max_size) -> None:
    buf, args = _layout(items)
    results = []
    for threads in (1, 2, 3, len(items) + 1):
        data, starts, ends, problem = _native_sections(buf, args, max_size, threads)
        spans = None if starts is None else (starts.tolist(), ends.tolist())
        results.append((data, spans, problem))
    assert all(r == results[0] for r in results[1:])


def test_bad_arguments_are_refused() -> None:
    buf, args = _layout([(3, 2, b"x", ref.compress(3, b"x"))])
    with pytest.raises(ValueError, match="threads"):
        _native_sections(buf, args, None, 0)
    with pytest.raises(ValueError, match="outside"):
        _native.decompress_sections(b"", args["starts"], args["ends"], args["codecs"], args["magics"])
    with pytest.raises(ValueError, match="one codec and one magic"):
        _native.decompress_sections(buf, args["starts"], args["ends"], args["codecs"][:0], args["magics"])


def test_unknown_codecs_and_python_codecs_are_problems_not_crashes() -> None:
    for codec, reason in ((7, "unknown compression codec id 7"), (1, "read in Python")):
        one = [np.array([x]) for x in (0, 3, codec, 2)]
        _, _, _, problem = _native.decompress_sections(b"abc", *one)
        assert problem[0] == 0 and reason in problem[1]


def test_a_decompression_bomb_stops_at_the_limit() -> None:
    bomb = compression.compress(CompressionType.ZSTD, bytes(64 << 20))
    buf, args = _layout([(4, 2, b"", bomb)] * 3)
    _, _, _, problem = _native_sections(buf, args, 1 << 20, 2)
    assert problem == (0, "decompressed size exceeds the limit of 1048576 bytes", None)


# ---- the chunk path of decode_records ------------------------------------------------------------


def _chunk(codecs: list[CompressionType], n: int = 40) -> bytes:
    out = []
    for b, codec in enumerate(codecs):
        records = [Record(b * n + i, 1000 + i, b"key-%d" % (i % 7), b"value-%d" % i * 3, ()) for i in range(n)]
        out.append(build_batch(records, compression=codec))
    return b"".join(out)


@pytest.mark.parametrize("threads", [None, "1", "2", "auto"])
def test_chunk_path_equals_the_one_section_path(monkeypatch, threads) -> None:
    if threads is not None:
        monkeypatch.setenv(CODEC_THREADS_ENV, threads)
    buf = _chunk([CompressionType.LZ4, CompressionType.NONE, CompressionType.ZSTD, CompressionType.LZ4] * 5)
    batches = scan_batches(buf).batches
    compressed = (batches.compression != 0) & (batches.records_counts > 0)
    fast = _decompress_sections(batches, compressed, None)
    slow = _decompress_sections_in_python(batches, compressed, None)
    assert fast[0] == slow[0] and np.array_equal(fast[1], slow[1]) and np.array_equal(fast[2], slow[2])
    assert len(decode_records(batches)) == 20 * 40


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_chunk_path_errors_name_the_same_file_position_and_offset(data) -> None:
    kinds = st.sampled_from([CompressionType.LZ4, CompressionType.ZSTD, CompressionType.NONE])
    codecs = data.draw(st.lists(kinds, min_size=1, max_size=6))
    buf = bytearray(_chunk(codecs, n=20))
    batches = scan_batches(bytes(buf)).batches
    victim = data.draw(st.integers(0, len(batches) - 1))
    start = int(batches.positions[victim]) + 61
    end = int(batches.positions[victim] + batches.sizes[victim])
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(start, end - 1))
        buf[i] ^= 1 << data.draw(st.integers(0, 7))
    batches = scan_batches(bytes(buf)).batches  # the CRC is not what scan checks
    batches.path = "00000000000000000000.log"
    compressed = (batches.compression != 0) & (batches.records_counts > 0)
    max_size = data.draw(st.sampled_from([None, 500]))
    errors = []
    for path in (_decompress_sections, _decompress_sections_in_python):
        try:
            path(batches, compressed, max_size)
            errors.append(None)
        except CorruptRecordError as e:
            errors.append((e.reason, e.position, e.offset, str(e)))
    assert errors[0] == errors[1]


def test_codec_threads_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(CODEC_THREADS_ENV, raising=False)
    assert codec_threads() == 1
    monkeypatch.setenv(CODEC_THREADS_ENV, " 2 ")
    assert codec_threads() == 2
    monkeypatch.setenv(CODEC_THREADS_ENV, "Auto")
    assert codec_threads() is None
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(CODEC_THREADS_ENV, bad)
        with pytest.raises(ValueError, match=CODEC_THREADS_ENV):
            codec_threads()


def test_the_bundled_libraries_are_the_ones_the_kafka_vectors_were_checked_with() -> None:
    """test_compression's vectors (lz4-java 1.11.0, zstd-jni 1.5.7-7) equal our bytes with these;
    a crate upgrade that changes a library must re-check them (the vector test would fail)."""
    assert _native.codec_library_versions() == ("1.10.0", "1.5.7")
