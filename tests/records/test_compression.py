"""Codecs: round trips, determinism, Kafka's exact framing, peer codecs both ways, the lz4
checks of Kafka's reader, the leniencies of Kafka's readers, and that bad input only ever
raises CorruptRecordError."""

from __future__ import annotations

import hashlib
import random
import struct
import subprocess
import sys
import zlib

import cramjam
import lz4.block
import lz4.frame
import pytest
import xxhash
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cleaner.errors import CorruptRecordError
from cleaner.records.compression import (
    GZIP_HEADER,
    LZ4_HEADER,
    LZ4_V0_HC,
    XERIAL_HEADER,
    CompressionType,
    compress,
    decompress,
)

CODECS = list(CompressionType)
COMPRESSED = [c for c in CompressionType if c is not CompressionType.NONE]


def make_payload(size: int, seed: int, kind: str = "records") -> bytes:
    """Deterministic test data: record-like (compressible), random (incompressible) or mixed."""
    rng = random.Random(seed)
    if kind == "random":
        return rng.randbytes(size)
    out = bytearray()
    while len(out) < size:
        if kind == "mixed" and rng.random() < 0.3:
            out += rng.randbytes(rng.randrange(1, 300))
        else:
            out += b"key-%d|value-%s|" % (rng.randrange(1000), b"x" * rng.randrange(0, 80))
    return bytes(out[:size])


@st.composite
def payloads(draw: st.DrawFn, max_size: int = 200_000) -> bytes:
    """Sizes across 0, one xerial chunk (32 KiB) and one lz4 block (64 KiB), and beyond."""
    size = draw(
        st.one_of(
            st.integers(0, 64),
            st.sampled_from([32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 64 * 1024, 64 * 1024 + 1, 131_073]),
            st.integers(0, max_size),
        )
    )
    return make_payload(size, draw(st.integers(0, 2**32)), draw(st.sampled_from(["records", "random", "mixed"])))


# ---- round trips and determinism -------------------------------------------------------------


@settings(max_examples=40)
@given(codec=st.sampled_from(CODECS), data=payloads())
def test_round_trip(codec: CompressionType, data: bytes) -> None:
    compressed = compress(codec, data)
    assert isinstance(compressed, bytes)
    assert decompress(codec, compressed) == data
    assert decompress(codec, compressed, max_size=len(data)) == data
    assert compress(codec, data) == compressed  # deterministic within a process


@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=300))
def test_round_trip_small_binary(codec: CompressionType, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_accepts_bytearray_and_memoryview_slices(codec: CompressionType) -> None:
    data = make_payload(70_000, 1, "mixed")
    framed = b"#" * 7 + data + b"#" * 5
    view = memoryview(framed)[7:-5]
    compressed = compress(codec, view)
    assert compressed == compress(codec, bytearray(data)) == compress(codec, data)
    padded = bytearray(b"?" * 3 + compressed + b"?" * 3)
    assert decompress(codec, memoryview(padded)[3:-3]) == data


def test_output_is_identical_in_another_process() -> None:
    """A later job compares files written by different processes byte for byte."""
    script = (
        "import hashlib, random\n"
        "from cleaner.records.compression import CompressionType, compress\n"
        "rng = random.Random(7)\n"
        "data = b''.join(b'key-%d|value-%d|' % (rng.randrange(999), rng.randrange(10**9)) for _ in range(20000))\n"
        "print(' '.join(hashlib.sha256(compress(c, data)).hexdigest() for c in CompressionType))\n"
    )
    out = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, check=True)
    rng = random.Random(7)
    data = b"".join(b"key-%d|value-%d|" % (rng.randrange(999), rng.randrange(10**9)) for _ in range(20000))
    assert out.stdout.split() == [hashlib.sha256(compress(c, data)).hexdigest() for c in CompressionType]


# ---- exact bytes: Kafka's framing --------------------------------------------------------------

# Written by Kafka's Java writers for KAFKA_VECTOR_INPUT: JDK 17.0.15 GZIPOutputStream (8 KiB,
# inside a 16 KiB BufferedOutputStream, as GzipCompression), snappy-java 1.1.10.8
# SnappyOutputStream, zstd-jni 1.5.7-7 ZstdOutputStreamNoFinalizer level 3 inside a 16 KiB
# BufferedOutputStream (as ZstdCompression), and lz4-java 1.11.0's fastCompressor driven the
# way Lz4BlockOutputStream drives it. Equality also depends on the C libraries (zlib 1.2.13,
# lz4, libzstd 1.5.7); a failure after a library upgrade means our bytes changed, not that
# they became unreadable.
KAFKA_VECTOR_INPUT = b"kafka-cleaner " * 20 + bytes(range(256))
KAFKA_VECTORS = {
    "gzip": (
        "1f8b08000000000000ffcb4e4ccb4ed44dce494dcc4b2d52c81ee541790c8c4ccc2cac6cec1c9c5cdc3cbc7cfc028242"
        "c222a262e2129252d232b272f20a8a4aca2aaa6aea1a9a5ada3aba7afa068646c626a666e6169656d636b676f60e8e4e"
        "ce2eae6eee1e9e5ede3ebe7efe018141c121a161e1119151d131b171f1098949c929a969e9199959d939b979f9058545"
        "c525a565e5159555d535b575f50d8d4dcd2dad6ded1d9d5ddd3dbd7dfd13264e9a3c65eab4e93366ce9a3d67eebcf90b"
        "162e5abc64e9b2e52b56ae5abd66edbaf51b366edabc65ebb6ed3b76eedabd67efbefd070e1e3a7ce4e8b1e3274e9e3a"
        "7de6ecb9f3172e5eba7ce5eab5eb376edeba7de7eebdfb0f1e3e7afce4e9b3e72f5ebe7afde6edbbf71f3e7efafce5eb"
        "b7ef3f7efefafde7efbfff00c9ddd07418020000"
    ),
    "snappy": (
        "82534e41505059000000000100000001000001219804346b61666b612d636c65616e657220fe0e00fe0e00fe0e00fe0e"
        "00190ef0ff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a"
        "2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a"
        "5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a"
        "8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9ba"
        "bbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9ea"
        "ebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
    ),
    "lz4": (
        "04224d1860408214010000ef6b61666b612d636c65616e6572200e00f7f0f1000102030405060708090a0b0c0d0e0f10"
        "1112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f40"
        "4142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70"
        "7172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0"
        "a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0"
        "d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff00"
        "000000"
    ),
    "zstd": (
        "28b52ffd0058b40800e4106b61666b612d636c65616e657220000102030405060708090a0b0c0d0e0f10111213141516"
        "1718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f40414243444546"
        "4748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717273747576"
        "7778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6"
        "a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6"
        "d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff010007a14e2501"
        "0000"
    ),
}


@pytest.mark.parametrize("name", sorted(KAFKA_VECTORS))
def test_bytes_equal_what_kafkas_java_writers_write(name: str) -> None:
    codec = CompressionType.from_name(name)
    expected = bytes.fromhex(KAFKA_VECTORS[name])
    assert decompress(codec, expected) == KAFKA_VECTOR_INPUT
    assert compress(codec, KAFKA_VECTOR_INPUT).hex() == expected.hex()


def test_gzip_header_and_trailer() -> None:
    data = make_payload(5000, 3)
    out = compress(CompressionType.GZIP, data)
    # magic, CM=8, FLG=0, MTIME=0, XFL=0, OS=0xff (GZIPOutputStream since JDK 16)
    assert out[:10] == GZIP_HEADER == bytes.fromhex("1f8b08000000000000ff")
    assert struct.unpack("<II", out[-8:]) == (zlib.crc32(data), len(data))
    assert zlib.decompress(out, wbits=31) == data  # a standard RFC 1952 member
    assert compress(CompressionType.GZIP, b"") == bytes.fromhex("1f8b08000000000000ff0300") + bytes(8)


def test_xerial_header_and_chunks() -> None:
    data = make_payload(32 * 1024 * 2 + 100, 4)
    out = compress(CompressionType.SNAPPY, data)
    assert out[:16] == XERIAL_HEADER == bytes.fromhex("82534e415050590000000001 00000001".replace(" ", ""))
    # chunks of int32 BE length + raw snappy, one per 32 KiB of input
    pos, chunks = 16, []
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        chunks.append(bytes(cramjam.snappy.decompress_raw(out[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    assert [len(c) for c in chunks] == [32768, 32768, 100]
    assert b"".join(chunks) == data
    assert compress(CompressionType.SNAPPY, b"") == XERIAL_HEADER  # what SnappyOutputStream writes


def test_lz4_frame_layout() -> None:
    data = make_payload(150_000, 5, "mixed")
    out = compress(CompressionType.LZ4, data)
    assert out[:7] == LZ4_HEADER == bytes.fromhex("04224d18604082")
    assert out[6] == (xxhash.xxh32_intdigest(b"\x60\x40") >> 8) & 0xFF
    assert out[-4:] == b"\x00\x00\x00\x00"  # end mark, no content checksum
    assert compress(CompressionType.LZ4, b"") == bytes.fromhex("04224d1860408200000000")
    # independent blocks of at most 64 KiB: three blocks for 150 000 bytes
    pos, sizes = 7, []
    while True:
        (word,) = struct.unpack_from("<I", out, pos)
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        block = out[pos + 4 : pos + 4 + size]
        if word & 0x80000000:
            sizes.append(size)
        else:
            sizes.append(len(lz4.block.decompress(block, uncompressed_size=65536)))  # alone: independent
        pos += 4 + size
    assert sizes == [65536, 65536, 150_000 - 131072]


def test_lz4_incompressible_blocks_are_stored() -> None:
    data = make_payload(100_000, 6, "random")
    out = compress(CompressionType.LZ4, data)
    (word,) = struct.unpack_from("<I", out, 7)
    assert word == 0x80000000 | 65536
    assert out[11 : 11 + 65536] == data[:65536]
    assert decompress(CompressionType.LZ4, out) == data


def test_lz4_v0_frame_has_kafkas_broken_header_checksum() -> None:
    data = make_payload(1000, 7)
    v0 = compress(CompressionType.LZ4, data, magic=0)
    assert v0[6] == LZ4_V0_HC == (xxhash.xxh32_intdigest(bytes.fromhex("04224d186040")) >> 8) & 0xFF
    assert v0[:6] + v0[7:] == (v2 := compress(CompressionType.LZ4, data))[:6] + v2[7:]
    assert decompress(CompressionType.LZ4, v0, magic=0) == data
    with pytest.raises(CorruptRecordError, match="HC"):
        decompress(CompressionType.LZ4, v0, magic=1)


def test_zstd_frame_has_no_content_size_and_no_checksum() -> None:
    out = compress(CompressionType.ZSTD, make_payload(10_000, 8))
    params = zstandard.get_frame_parameters(out)
    assert out[:4] == bytes.fromhex("28b52ffd")
    assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert not params.has_checksum
    assert compress(CompressionType.ZSTD, b"") == bytes.fromhex("28b52ffd2000010000")  # zstd-jni, empty


# ---- peers: kafka-python and aiokafka --------------------------------------------------------

kafka_codec = pytest.importorskip("kafka.codec")
aiokafka_codec = pytest.importorskip("aiokafka.codec")

PEER_SAMPLES = [b"", b"a", make_payload(1000, 10), make_payload(70_000, 11, "mixed"), make_payload(200_000, 12)]


def _peers() -> list[tuple[str, CompressionType, object, object]]:
    peers: list[tuple[str, CompressionType, object, object]] = [
        ("kafka-python gzip", CompressionType.GZIP, kafka_codec.gzip_encode, kafka_codec.gzip_decode),
        ("kafka-python lz4", CompressionType.LZ4, kafka_codec.lz4_encode, kafka_codec.lz4_decode),
        ("kafka-python zstd", CompressionType.ZSTD, kafka_codec.zstd_encode, kafka_codec.zstd_decode),
        ("aiokafka gzip", CompressionType.GZIP, aiokafka_codec.gzip_encode, aiokafka_codec.gzip_decode),
        ("aiokafka snappy", CompressionType.SNAPPY, aiokafka_codec.snappy_encode, aiokafka_codec.snappy_decode),
        ("aiokafka lz4", CompressionType.LZ4, aiokafka_codec.lz4_encode, aiokafka_codec.lz4_decode),
        ("aiokafka zstd", CompressionType.ZSTD, aiokafka_codec.zstd_encode, aiokafka_codec.zstd_decode),
    ]
    return peers


@pytest.mark.parametrize(("name", "codec", "encode", "decode"), _peers(), ids=[p[0] for p in _peers()])
@pytest.mark.parametrize("data", PEER_SAMPLES, ids=lambda d: f"{len(d)}B")
def test_peer_codecs_both_directions(name: str, codec: CompressionType, encode, decode, data: bytes) -> None:
    assert decompress(codec, encode(data)) == data, f"we cannot read {name}"
    if name == "aiokafka snappy" and not data:
        # aiokafka's snappy_decode takes a 16-byte (header-only) stream for raw snappy; Java's
        # SnappyInputStream reads it as empty, which is what matters.
        return
    assert bytes(decode(compress(codec, data))) == data, f"{name} cannot read ours"


@pytest.mark.skipif(kafka_codec.has_snappy(), reason="python-snappy is installed; covered by the peer test")
def test_kafka_python_snappy_needs_python_snappy() -> None:
    """kafka-python's snappy_encode/decode need python-snappy, which is not a dependency; aiokafka's
    (cramjam-based, same xerial layout) is the snappy peer. Its raw-block writer still works."""
    with pytest.raises(NotImplementedError):
        kafka_codec.snappy_encode(b"x")
    assert aiokafka_codec.snappy_encode(b"abc" * 20000, xerial_compatible=True) == compress(
        CompressionType.SNAPPY, b"abc" * 20000
    )


@pytest.mark.parametrize("data", PEER_SAMPLES[1:], ids=lambda d: f"{len(d)}B")
def test_kafka_python_old_kafka_lz4_matches_our_v0_frame(data: bytes) -> None:
    """kafka-python's writer for 0.8/0.9 brokers produces the same broken-HC frame as ours."""
    theirs = kafka_codec.lz4_encode_old_kafka(data)
    assert decompress(CompressionType.LZ4, theirs, magic=0) == data
    assert kafka_codec.lz4_decode_old_kafka(compress(CompressionType.LZ4, data, magic=0)) == data
    assert compress(CompressionType.LZ4, data, magic=0) == theirs
    with pytest.raises(CorruptRecordError, match="HC"):
        decompress(CompressionType.LZ4, theirs, magic=2)


# ---- lz4: Kafka's reader checks ---------------------------------------------------------------

LZ4_DATA = make_payload(150_000, 20, "mixed")


def _lz4(**kwargs: object) -> bytes:
    return lz4.frame.compress(LZ4_DATA, **kwargs)


def test_lz4_rejects_linked_blocks() -> None:
    linked = _lz4(block_linked=True)
    assert linked[4] & 0x20 == 0
    with pytest.raises(CorruptRecordError, match="dependent block stream is unsupported"):
        decompress(CompressionType.LZ4, linked)
    with pytest.raises(CorruptRecordError, match="dependent block stream is unsupported"):
        decompress(CompressionType.LZ4, linked, magic=0)


def test_lz4_header_checksum_checked_for_magic_1_and_2_only() -> None:
    good = compress(CompressionType.LZ4, LZ4_DATA)
    bad = good[:6] + bytes([good[6] ^ 0x55]) + good[7:]
    for magic in (1, 2):
        with pytest.raises(CorruptRecordError, match="HC mismatch") as info:
            decompress(CompressionType.LZ4, bad, magic=magic)
        assert info.value.position == 6
    assert decompress(CompressionType.LZ4, bad, magic=0) == LZ4_DATA


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_linked": False, "store_size": True},
        {"block_linked": False, "content_checksum": True},
        {"block_linked": False, "block_checksum": True},
        {"block_linked": False, "block_size": lz4.frame.BLOCKSIZE_MAX256KB},
        {"block_linked": False, "block_size": lz4.frame.BLOCKSIZE_MAX4MB, "compression_level": 9},
    ],
    ids=["content-size", "content-checksum", "block-checksum", "256KiB-blocks", "4MiB-blocks-hc"],
)
def test_lz4_reads_optional_frame_features(kwargs: dict[str, object]) -> None:
    assert decompress(CompressionType.LZ4, _lz4(**kwargs)) == LZ4_DATA


def test_lz4_content_checksum_is_not_verified_like_kafka() -> None:
    frame = bytearray(_lz4(block_linked=False, content_checksum=True))
    frame[-1] ^= 0xFF
    assert decompress(CompressionType.LZ4, bytes(frame)) == LZ4_DATA
    with pytest.raises(CorruptRecordError, match="content checksum"):
        decompress(CompressionType.LZ4, bytes(frame[:-4]))  # but it must be there


def test_lz4_block_checksum_is_verified() -> None:
    frame = bytearray(_lz4(block_linked=False, block_checksum=True, store_size=False))
    (word,) = struct.unpack_from("<I", frame, 7)
    checksum_at = 7 + 4 + (word & 0x7FFFFFFF)
    frame[checksum_at] ^= 0x01
    with pytest.raises(CorruptRecordError, match="block checksum mismatch"):
        decompress(CompressionType.LZ4, bytes(frame))


def _with_descriptor(frame: bytes, flg: int, bd: int) -> bytes:
    hc = (xxhash.xxh32_intdigest(bytes((flg, bd))) >> 8) & 0xFF
    return frame[:4] + bytes((flg, bd, hc)) + frame[7:]


@pytest.mark.parametrize(
    ("flg", "bd", "reason"),
    [
        (0x61, 0x40, "reserved FLG bits"),
        (0x62, 0x40, "reserved FLG bits"),
        (0xA0, 0x40, "version 2 is unsupported"),
        (0x20, 0x40, "version 0 is unsupported"),
        (0x60, 0x30, "block size code 3"),
        (0x60, 0x41, "reserved BD bits"),
        (0x60, 0xC0, "reserved BD bits"),
    ],
)
def test_lz4_rejects_bad_descriptors(flg: int, bd: int, reason: str) -> None:
    frame = _with_descriptor(compress(CompressionType.LZ4, b"hello"), flg, bd)
    with pytest.raises(CorruptRecordError, match=reason):
        decompress(CompressionType.LZ4, frame)


def test_lz4_structure_errors_and_leniencies() -> None:
    good = compress(CompressionType.LZ4, LZ4_DATA)
    with pytest.raises(CorruptRecordError, match="invalid magic"):
        decompress(CompressionType.LZ4, b"\x05" + good[1:])
    with pytest.raises(CorruptRecordError, match="end mark"):
        decompress(CompressionType.LZ4, good[:-4])  # no end mark
    with pytest.raises(CorruptRecordError, match="block data"):
        decompress(CompressionType.LZ4, good[:1000])
    with pytest.raises(CorruptRecordError, match="exceeded max"):
        decompress(CompressionType.LZ4, good[:7] + struct.pack("<I", 65537) + bytes(65537) + bytes(4))
    with pytest.raises(CorruptRecordError, match="prematurely"):
        decompress(CompressionType.LZ4, good[:5])
    # Kafka's reader stops at the end mark; what follows is never read
    assert decompress(CompressionType.LZ4, good + b"trailing garbage") == LZ4_DATA
    # an end mark with the "uncompressed" bit set still ends the frame (the bit is masked first)
    assert decompress(CompressionType.LZ4, good[:-4] + b"\x00\x00\x00\x80") == LZ4_DATA


# ---- gzip: GZIPInputStream's behaviour --------------------------------------------------------


def _gzip_member(data: bytes, *, flags: int = 0, extra: bytes = b"", name: bytes = b"", comment: bytes = b"") -> bytes:
    header = bytearray(b"\x1f\x8b\x08" + bytes([flags]) + b"\x01\x02\x03\x04\x00\x03")
    if flags & 0x04:
        header += struct.pack("<H", len(extra)) + extra
    if flags & 0x08:
        header += name + b"\x00"
    if flags & 0x10:
        header += comment + b"\x00"
    if flags & 0x02:
        header += struct.pack("<H", zlib.crc32(header) & 0xFFFF)
    body = zlib.compress(data, 9, wbits=-15)
    return bytes(header) + body + struct.pack("<II", zlib.crc32(data), len(data))


def test_gzip_concatenated_members() -> None:
    a, b = make_payload(40_000, 30), make_payload(5, 31)
    assert decompress(CompressionType.GZIP, compress(CompressionType.GZIP, a) + _gzip_member(b)) == a + b
    assert decompress(CompressionType.GZIP, compress(CompressionType.GZIP, a) * 3, max_size=3 * len(a)) == a * 3


def test_gzip_optional_header_fields() -> None:
    data = make_payload(3000, 32)
    member = _gzip_member(data, flags=0x02 | 0x04 | 0x08 | 0x10, extra=b"xx", name=b"name.txt", comment=b"c" * 600)
    assert decompress(CompressionType.GZIP, member) == data
    assert decompress(CompressionType.GZIP, _gzip_member(data, flags=0x01 | 0xE0)) == data  # FTEXT, reserved
    bad_hcrc = bytearray(_gzip_member(data, flags=0x02))
    bad_hcrc[10] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="header CRC"):
        decompress(CompressionType.GZIP, bytes(bad_hcrc))


def test_gzip_trailing_bytes_after_a_member() -> None:
    data = make_payload(2000, 33)
    member = compress(CompressionType.GZIP, data)
    # GZIPInputStream ignores trailing bytes that do not form a valid member header ...
    assert decompress(CompressionType.GZIP, member + b"\x00" * 30) == data
    assert decompress(CompressionType.GZIP, member + b"\x1f\x8b\x09" + bytes(40)) == data
    # ... but a valid header starts a member that must then be complete and correct
    with pytest.raises(CorruptRecordError):
        decompress(CompressionType.GZIP, member + _gzip_member(data)[:-3])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: b"", "empty stream"),
        (lambda m: m[:8], "truncated member header"),
        (lambda m: b"\x1f\x8c" + m[2:], "bad magic"),
        (lambda m: m[:2] + b"\x07" + m[3:], "unsupported compression method"),
        (lambda m: m[:-20], "truncated"),
        (lambda m: m[:-4], "truncated member trailer"),
        (lambda m: m[:-8] + struct.pack("<I", zlib.crc32(b"other")) + m[-4:], "corrupt trailer"),
        (lambda m: m[:-4] + struct.pack("<I", 1), "corrupt trailer"),
        (lambda m: m[:10] + b"\xff\xff\xff" + m[13:], "invalid deflate data"),
    ],
)
def test_gzip_errors(mutate, reason: str) -> None:
    member = compress(CompressionType.GZIP, make_payload(5000, 34))
    with pytest.raises(CorruptRecordError, match=reason):
        decompress(CompressionType.GZIP, mutate(member))


# ---- snappy: SnappyInputStream's behaviour ----------------------------------------------------


def test_snappy_reads_raw_blocks_without_xerial_header() -> None:
    data = make_payload(50_000, 40)
    assert decompress(CompressionType.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data
    assert decompress(CompressionType.SNAPPY, b"\x00") == b""  # raw snappy of nothing


def test_snappy_concatenated_streams_and_trailing_bytes() -> None:
    a, b = make_payload(40_000, 41), make_payload(10, 42)
    joined = compress(CompressionType.SNAPPY, a) + compress(CompressionType.SNAPPY, b)
    assert decompress(CompressionType.SNAPPY, joined) == a + b
    assert decompress(CompressionType.SNAPPY, compress(CompressionType.SNAPPY, a) + XERIAL_HEADER) == a
    # SnappyInputStream stops when it cannot read a whole chunk length
    assert decompress(CompressionType.SNAPPY, compress(CompressionType.SNAPPY, a) + b"\x00\x01\x02") == a
    assert decompress(CompressionType.SNAPPY, XERIAL_HEADER) == b""


def test_snappy_ignores_version_fields() -> None:
    data = make_payload(100, 43)
    out = compress(CompressionType.SNAPPY, data)
    little_endian_versions = out[:8] + struct.pack("<ii", 1, 1) + out[16:]  # as some producers write
    assert decompress(CompressionType.SNAPPY, little_endian_versions) == data


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (b"", "empty stream"),
        (XERIAL_HEADER + struct.pack(">i", -5) + b"abcdef", "invalid chunk size -5"),
        (XERIAL_HEADER + struct.pack(">i", 100) + b"abc", "truncated chunk"),
        (XERIAL_HEADER + struct.pack(">i", 0), "invalid compressed block"),
        (XERIAL_HEADER + b"\x00\x00\x00\x05\xff\xff\xff\xff\xff", "invalid compressed block"),
        (XERIAL_HEADER + XERIAL_HEADER[:8], "concatenated stream"),
        (b"\x82SNAPPX\x00" + bytes(12), "invalid compressed block"),
    ],
)
def test_snappy_errors(stream: bytes, reason: str) -> None:
    with pytest.raises(CorruptRecordError, match=reason):
        decompress(CompressionType.SNAPPY, stream)


# ---- zstd: ZstdInputStream's behaviour --------------------------------------------------------


def test_zstd_frames() -> None:
    a, b = make_payload(30_000, 50), make_payload(300, 51)
    with_size = zstandard.ZstdCompressor(level=1).compress(b)  # one-shot: content size present
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 3) + b"abc"
    checked = zstandard.ZstdCompressor(write_checksum=True).compress(b)
    stream = compress(CompressionType.ZSTD, a) + skippable + with_size + checked
    assert decompress(CompressionType.ZSTD, stream) == a + b + b
    assert decompress(CompressionType.ZSTD, stream, max_size=len(a) + 2 * len(b)) == a + b + b
    assert decompress(CompressionType.ZSTD, b"") == b""  # zstd-jni: an empty stream is empty
    assert decompress(CompressionType.ZSTD, skippable) == b""


@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "max_size"])
def test_zstd_errors(bounded: bool) -> None:
    good = compress(CompressionType.ZSTD, make_payload(30_000, 52))
    checked = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(b"abc" * 100))
    checked[-1] ^= 0xFF
    max_size = 10**6 if bounded else None
    for stream in (good[:-5], good + b"garbage!", good + b"\x00", bytes(checked), b"\x28\xb5\x2f"):
        with pytest.raises(CorruptRecordError, match="zstd"):
            decompress(CompressionType.ZSTD, stream, max_size=max_size)


# ---- max_size ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_max_size_is_enforced(codec: CompressionType) -> None:
    data = make_payload(100_000, 60)
    out = compress(codec, data)
    assert decompress(codec, out, max_size=len(data)) == data
    with pytest.raises(CorruptRecordError, match="exceeds the limit of 99999 bytes"):
        decompress(codec, out, max_size=len(data) - 1)
    with pytest.raises(CorruptRecordError, match="exceeds the limit"):
        decompress(codec, out, max_size=0)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_decompression_bomb_is_stopped(codec: CompressionType) -> None:
    bomb = compress(codec, bytes(64 * 1024 * 1024))
    assert len(bomb) < 3_200_000
    with pytest.raises(CorruptRecordError, match="exceeds the limit of 1048576 bytes"):
        decompress(codec, bomb, max_size=1024 * 1024)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_highly_compressible_data_under_a_generous_limit(codec: CompressionType) -> None:
    """zstd's bounded reader starts with a guessed buffer and must grow it up to max_size."""
    data = bytes(3 * 1024 * 1024 + 5) + b"tail"
    out = compress(codec, data)
    assert len(data) > 16 * len(out)
    assert decompress(codec, out, max_size=1 << 30) == data
    assert decompress(codec, out, max_size=len(data)) == data
    with pytest.raises(CorruptRecordError, match="exceeds the limit"):
        decompress(codec, out, max_size=len(data) - 1)


def test_max_size_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        decompress(CompressionType.GZIP, compress(CompressionType.GZIP, b"x"), max_size=-1)


# ---- corrupt input never escapes as anything but CorruptRecordError ---------------------------


@st.composite
def damaged(draw: st.DrawFn) -> tuple[CompressionType, bytes, int]:
    codec = draw(st.sampled_from(COMPRESSED))
    good = compress(codec, make_payload(draw(st.integers(0, 80_000)), draw(st.integers(0, 1000)), "mixed"))
    how = draw(st.sampled_from(["random", "truncate", "flip", "splice", "prefix"]))
    if how == "random":
        bad = draw(st.binary(max_size=200))
    elif how == "truncate":
        bad = good[: draw(st.integers(0, max(len(good) - 1, 0)))]
    elif how == "flip":
        buf = bytearray(good)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        bad = bytes(buf)
    elif how == "splice":
        i = draw(st.integers(0, len(good)))
        bad = good[:i] + draw(st.binary(min_size=1, max_size=40)) + good[i:]
    else:
        bad = good[: draw(st.integers(0, 30))] + draw(st.binary(max_size=60))
    return codec, bad, draw(st.sampled_from([0, 1, 2]))


@settings(max_examples=300)
@given(case=damaged(), bounded=st.booleans())
@example(case=(CompressionType.LZ4, LZ4_HEADER + b"\x05\x00\x00\x00\x50abcd\x00\x00\x00\x00", 2), bounded=False)
@example(case=(CompressionType.SNAPPY, XERIAL_HEADER + b"\x00\x00\x00\x01\x80", 2), bounded=True)
def test_damaged_input_raises_only_corrupt_record_error(
    case: tuple[CompressionType, bytes, int], bounded: bool
) -> None:
    codec, bad, magic = case
    try:
        out = decompress(codec, bad, magic=magic, max_size=1_000_000 if bounded else None)
    except CorruptRecordError as e:
        assert e.reason
        assert e.position is None or 0 <= e.position <= len(bad)
    else:
        assert isinstance(out, bytes)


@given(data=st.binary(max_size=300), codec=st.integers(5, 255))
def test_unknown_codec_ids(data: bytes, codec: int) -> None:
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec id {codec}"):
        decompress(codec, data)
    with pytest.raises(ValueError):
        compress(codec, data)


# ---- CompressionType --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [("none", 0), ("GZIP", 1), ("Snappy", 2), ("lz4", 3), ("ZsTd", 4)],
)
def test_from_name(name: str, expected: int) -> None:
    codec = CompressionType.from_name(name)
    assert codec == expected
    assert codec.kafka_name == name.lower()


@pytest.mark.parametrize("name", ["", "producer", "uncompressed", "brotli", "gzip ", "NONE2", None, 1])
def test_from_name_rejects_other_values(name: object) -> None:
    with pytest.raises(ValueError, match="unknown compression type"):
        CompressionType.from_name(name)  # type: ignore[arg-type]


# ---- real Kafka data ------------------------------------------------------------------------------


@pytest.mark.fixtures
def test_real_kafka_sections_decompress_and_recompress_identically(real_kafka_root) -> None:
    """Every compressed v2 batch in the real-broker fixtures (lz4 from Confluent 7.6 clients,
    snappy from a 2.8 setup) decompresses, and re-compressing gives back Kafka's exact bytes."""
    seen: dict[int, int] = {}
    for path in sorted(real_kafka_root.rglob("*.log")):
        buf = path.read_bytes()  # read-only: never written
        pos = 0
        while pos + 61 <= len(buf):
            base_offset, length = struct.unpack_from(">qi", buf, pos)
            if length < 14 or pos + 12 + length > len(buf):
                break
            codec = buf[pos + 22] & 0x07
            if buf[pos + 16] == 2 and codec:
                section = buf[pos + 61 : pos + 12 + length]
                data = decompress(codec, section, max_size=64 * 1024 * 1024)
                assert compress(codec, data) == section, f"{path} batch at byte {pos} (offset {base_offset})"
                seen[codec] = seen.get(codec, 0) + 1
            pos += 12 + length
    if not seen:
        pytest.skip("no compressed batches in the real Kafka fixtures")
    assert seen.get(CompressionType.LZ4, 0) > 100 and seen.get(CompressionType.SNAPPY, 0) > 0, seen
