"""The compression codecs of Kafka record batches: writing what Kafka writes, reading what Kafka reads.

A compressed v2 batch holds one compressed stream after its 61-byte header; a compressed
legacy (v0/v1) wrapper message holds one in its value. The codec id lives in the low three
bits of the attributes (``CompressionType``).

Writing. The cleaner re-compresses the records it retains with the batch's original codec at
that codec's default level (Kafka's ``Cleaner`` does the same). Output is a pure function of
the input bytes: no clocks, no file names, no random dictionaries, so two processes cleaning
the same segment produce identical files. Every writer reproduces the framing Kafka's Java
writer uses, and with the library versions this project pins the bytes are identical to
Kafka's (checked against ``java.util.zip.GZIPOutputStream``, xerial ``SnappyOutputStream``,
Kafka's ``Lz4BlockOutputStream`` logic over lz4-java, and zstd-jni ``ZstdOutputStreamNoFinalizer``):

- gzip: raw deflate at level 6 (``Deflater.DEFAULT_COMPRESSION``) between a hand-written
  10-byte header and the CRC-32/ISIZE trailer, as ``GZIPOutputStream`` frames it. Python's
  ``gzip`` module would put the wall-clock mtime (and possibly a file name) in the header, so
  its output depends on when it ran.
- snappy: xerial framing (``SnappyOutputStream``): a 16-byte header, then one chunk per
  32 KiB of input, each ``int32 BE length`` + a raw snappy block. Not the official snappy
  framing format (``python-snappy``'s ``StreamCompressor``), which Kafka cannot read.
- lz4: an LZ4 frame with *independent* 64 KiB blocks, no content size, no checksums, each
  block compressed by liblz4's fast compressor (Kafka's default "level 9" selects lz4-java's
  fast compressor) and stored as is when that does not make it smaller
  (``Lz4BlockOutputStream``). Kafka's reader rejects linked blocks.
- zstd: level 3, one frame without content size, ended the way ``ZstdOutputStream`` ends it
  (a flush, then the end of the frame).

Reading. ``decompress`` accepts what Kafka's readers accept (``GZIPInputStream``,
``SnappyInputStream``, ``Lz4BlockInputStream``, ``ZstdInputStreamNoFinalizer``), including
their leniencies, and turns every failure into ``CorruptRecordError`` with a buffer-relative
position where one is meaningful. ``max_size`` caps the decompressed size so that a small
corrupt or hostile batch cannot exhaust memory.

Where each codec runs. lz4 and zstd run in the compiled core (``native/src/codecs.rs``,
over the liblz4 and libzstd that ``lz4-sys`` and ``zstd-sys`` bundle, the C code lz4-java
and zstd-jni call), frame parsing and every check included, with the GIL released: the
functions here call it for one section, and ``cleaner.records.columns`` and
``cleaner.records.builder`` call it for a whole chunk's sections at once (one output
buffer, optionally on several threads). gzip (zlib) and snappy (cramjam) run here, Python
walking their member and chunk headers once per block (>= 32 KiB of data), never per byte.
"""

from __future__ import annotations

import enum
import os
import struct
import zlib

import cramjam

from cleaner import _native
from cleaner.errors import CorruptRecordError

BytesLike = bytes | bytearray | memoryview

__all__ = ["CompressionType", "compress", "decompress"]


class CompressionType(enum.IntEnum):
    """Codec ids of the attributes' low three bits (Kafka's ``CompressionType``)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> CompressionType:
        """The codec of a ``compression.type`` name: none, gzip, snappy, lz4 or zstd (any case).

        ``producer`` and ``uncompressed`` are topic-config values, not codecs; the caller
        resolves them before asking for a codec.
        """
        if isinstance(name, str):
            member = cls.__members__.get(name.upper())
            if member is not None:
                return member
        raise ValueError(f"unknown compression type {name!r}; expected one of none, gzip, snappy, lz4, zstd")

    @property
    def kafka_name(self) -> str:
        """The name Kafka uses in configs and logs (``gzip``, ...)."""
        return self.name.lower()


# Default level, as Kafka's CompressionType: gzip Deflater.DEFAULT_COMPRESSION (= 6). (zstd's
# level 3 and lz4's fast compressor are set in the compiled core.)
GZIP_LEVEL = 6

_INT32_BE = struct.Struct(">i")
_UINT16_LE = struct.Struct("<H")
_GZIP_TRAILER = struct.Struct("<II")

# ``GZIPOutputStream`` writes magic 1f 8b, CM 8 (deflate), FLG 0, MTIME 0, XFL 0 and OS.
# The OS byte is 0xff ("unknown") since JDK 16 (JDK-8244706; JDK 8-15 wrote 0). Kafka 4.x
# brokers need Java 17+, and JDK 17.0.15 and 25.0.3 were checked to write exactly these ten
# bytes, so a batch we write is byte-identical to the one a current broker writes. Readers
# (GZIPInputStream, zlib) ignore MTIME/XFL/OS.
GZIP_HEADER = bytes((0x1F, 0x8B, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xFF))
_GZIP_MIN_HEADER = 10
_GZIP_FHCRC, _GZIP_FEXTRA, _GZIP_FNAME, _GZIP_FCOMMENT = 0x02, 0x04, 0x08, 0x10

# xerial SnappyCodec: MAGIC_HEADER (0x82 "SNAPPY" 0x00), int32 BE version 1, int32 BE
# minimum compatible version 1. SnappyOutputStream's default block size: 32 KiB of input.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_SIZE = 32 * 1024

# LZ4 frame descriptor as Lz4BlockOutputStream writes it: magic 0x184D2204 (little-endian),
# FLG 0x60 (version 01, independent blocks, no checksums, no content size), BD 0x40 (64 KiB
# blocks), HC = second byte of xxhash32(FLG, BD). Magic v0 wrappers carry Kafka's old broken
# HC, computed over the magic bytes as well (KAFKA-3160); Kafka still writes it for v0.
# (The compiled core reads and writes lz4 frames; these are for callers and tests.)
LZ4_HEADER = _native.lz4_header(2)
LZ4_V0_HC = _native.lz4_header(0)[6]

# Codec ids the compiled core reads and writes (``native/src/codecs.rs``).
NATIVE_CODECS = frozenset((CompressionType.LZ4, CompressionType.ZSTD))

CODEC_THREADS_ENV = "KAFKA_CLEANER_CODEC_THREADS"


def codec_threads() -> int | None:
    """Threads for one chunk's lz4/zstd sections (``$KAFKA_CLEANER_CODEC_THREADS``).

    Unset: 1, the calling cleaner thread alone, as Kafka's cleaner does. A number: at most that
    many. ``auto``: the compiled core decides (None): the cores this process may use (cgroup
    quotas included), at most 4, one per 256 KiB of input at most.

    Why 1 by default: extra threads pay only when cores are idle. The engine already runs
    ``log.cleaner.threads`` cleaner threads, a sidecar shares its node with the broker, and
    Spark runs a task per core, so idle cores are the exception; on this project's shared
    2-vCPU VM (load 3-7 from other work) two codec threads made a 4 MiB lz4 chunk's
    decompression slower, not faster (the second thread waits for a core), and the
    end-to-end lz4 clean was no faster. On a machine with idle cores, ``auto`` (or a number)
    spreads a chunk over them.
    """
    value = os.environ.get(CODEC_THREADS_ENV, "").strip().lower()
    if not value:
        return 1
    if value == "auto":
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{CODEC_THREADS_ENV} must be auto or a whole number >= 1, got {value!r}")
    return threads


def _byte_view(data: BytesLike) -> memoryview:
    """A flat unsigned-byte view (no copy) so that lengths and slices count bytes."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


# --------------------------------------------------------------------------------------------
# compress


def compress(codec: CompressionType | int, data: BytesLike, *, magic: int = 2) -> bytes:
    """Compress ``data`` as Kafka's writer for ``codec`` would, at Kafka's default level.

    Deterministic: the result depends on the input bytes (and ``magic``) only. ``magic``
    matters for lz4 alone: for magic 0 the frame carries the broken header checksum Kafka
    writes (and expects to be ignored) in v0 wrappers. Raises ``ValueError`` for a codec id
    that is not 0..4 (a caller's mistake, not bad data).
    """
    codec = _codec_for_writing(codec)
    mv = _byte_view(data)
    if codec is CompressionType.NONE:
        return mv.tobytes()
    if codec is CompressionType.GZIP:
        return _gzip_compress(mv)
    if codec is CompressionType.SNAPPY:
        return _snappy_compress(mv)
    return _native.compress_section(int(codec), mv, magic)


def _codec_for_writing(codec: CompressionType | int) -> CompressionType:
    try:
        return CompressionType(codec)
    except ValueError:
        raise ValueError(f"unknown compression codec id {codec!r}; expected 0..4") from None


def _gzip_compress(mv: memoryview) -> bytes:
    # zlib.compress(wbits=-15) runs deflateInit2(level 6, raw, memLevel 8, default strategy),
    # the parameters of java.util.zip.Deflater inside GZIPOutputStream. Without flushes
    # deflate's output does not depend on how the input is split into writes.
    body = zlib.compress(mv, GZIP_LEVEL, wbits=-15)
    trailer = _GZIP_TRAILER.pack(zlib.crc32(mv), mv.nbytes & 0xFFFFFFFF)
    return b"".join((GZIP_HEADER, body, trailer))


def _snappy_compress(mv: memoryview) -> bytes:
    # An empty input yields the header alone, which SnappyOutputStream writes on close and
    # SnappyInputStream reads back as empty.
    parts: list[BytesLike] = [XERIAL_HEADER]
    compress_raw = cramjam.snappy.compress_raw
    for start in range(0, mv.nbytes, XERIAL_BLOCK_SIZE):
        block = compress_raw(mv[start : start + XERIAL_BLOCK_SIZE])
        parts.append(_INT32_BE.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


# --------------------------------------------------------------------------------------------
# decompress


def decompress(
    codec: CompressionType | int,
    data: BytesLike,
    *,
    max_size: int | None = None,
    magic: int = 2,
) -> bytes:
    """Decompress one compressed records section (v2) or legacy wrapper value.

    ``magic`` is the batch's magic: for lz4, magic 0 skips the frame-descriptor checksum
    (Kafka wrote a broken one in v0 wrappers). ``max_size`` bounds the decompressed size:
    a larger result raises before more than one block past the limit is allocated (for
    zstd, before anything past it is). Every failure is a ``CorruptRecordError``; positions
    are relative to ``data``.
    """
    try:
        codec = CompressionType(codec)
    except ValueError:
        raise CorruptRecordError(f"unknown compression codec id {codec}") from None
    if max_size is not None and max_size < 0:
        raise ValueError(f"max_size must be >= 0, got {max_size}")
    mv = _byte_view(data)
    if codec is CompressionType.NONE:
        if max_size is not None and mv.nbytes > max_size:
            raise _too_large(max_size)
        return mv.tobytes()
    if codec is CompressionType.GZIP:
        return _gzip_decompress(mv, max_size)
    if codec is CompressionType.SNAPPY:
        return _snappy_decompress(mv, max_size)
    out, problem = _native.decompress_section(int(codec), mv, max_size, magic)
    if problem is not None:
        reason, position = problem
        raise CorruptRecordError(reason, position=position)
    return out


def _too_large(max_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"decompressed size exceeds the limit of {max_size} bytes")


def _join(parts: list[BytesLike]) -> bytes:
    if len(parts) == 1 and type(parts[0]) is bytes:
        return parts[0]
    return b"".join(parts)


# gzip ----------------------------------------------------------------------------------------


def _gzip_decompress(mv: memoryview, max_size: int | None) -> bytes:
    """Read gzip members the way ``java.util.zip.GZIPInputStream`` does.

    Members follow each other (concatenated gzip). After a member's trailer, bytes that do
    not begin a valid member header are ignored, as GZIPInputStream ignores them. The header
    is parsed here (so FTEXT, MTIME, XFL, OS and reserved flag bits are ignored like Java
    does, where zlib would reject reserved bits); zlib inflates the raw deflate data.
    """
    n = mv.nbytes
    pos = 0
    header_length = _gzip_header_length(mv, 0, strict=True)
    assert header_length is not None
    parts: list[bytes] = []
    total = 0
    while True:
        body_start = pos + header_length
        body = mv[body_start:]
        inflater = zlib.decompressobj(-15)
        try:
            if max_size is None:
                out = inflater.decompress(body)
            else:
                # max_length = remaining budget + 1 (never 0, which would mean "no limit")
                out = inflater.decompress(body, max_size - total + 1)
        except zlib.error as e:
            raise CorruptRecordError(f"gzip: invalid deflate data ({e})", position=body_start) from None
        if max_size is not None and total + len(out) > max_size:
            raise _too_large(max_size)
        if not inflater.eof:
            raise CorruptRecordError("gzip: stream ends inside the deflate data (truncated)", position=n)
        tail = inflater.unused_data
        trailer_start = n - len(tail)
        if len(tail) < _GZIP_TRAILER.size:
            raise CorruptRecordError("gzip: truncated member trailer", position=trailer_start)
        crc, isize = _GZIP_TRAILER.unpack_from(tail)
        if crc != zlib.crc32(out) or isize != len(out) & 0xFFFFFFFF:
            raise CorruptRecordError(
                "gzip: corrupt trailer (CRC-32 or size does not match the data)", position=trailer_start
            )
        parts.append(out)
        total += len(out)
        pos = trailer_start + _GZIP_TRAILER.size
        if pos >= n:
            break
        next_header = _gzip_header_length(mv, pos, strict=False)
        if next_header is None:
            break  # GZIPInputStream.readTrailer: "ignore any malformed, do nothing"
        header_length = next_header
    return _join(parts)


def _gzip_header_length(mv: memoryview, pos: int, *, strict: bool) -> int | None:
    """Length of the gzip member header at ``pos`` (GZIPInputStream.readHeader's checks).

    Invalid or truncated: raises when ``strict`` (the first member), else returns None
    (trailing bytes after a member, which Java ignores).
    """
    n = mv.nbytes

    def fail(reason: str, at: int) -> None:
        if strict:
            raise CorruptRecordError(f"gzip: {reason}", position=at)

    if n - pos < _GZIP_MIN_HEADER:
        fail("truncated member header" if n > pos else "empty stream", pos)
        return None
    if mv[pos] != 0x1F or mv[pos + 1] != 0x8B:
        fail("not in gzip format (bad magic)", pos)
        return None
    if mv[pos + 2] != 8:
        fail(f"unsupported compression method {mv[pos + 2]}", pos + 2)
        return None
    flags = mv[pos + 3]
    p = pos + _GZIP_MIN_HEADER
    if flags & _GZIP_FEXTRA:
        if n - p < 2:
            fail("truncated member header (FEXTRA)", p)
            return None
        p += 2 + _UINT16_LE.unpack_from(mv, p)[0]
        if p > n:
            fail("truncated member header (FEXTRA)", n)
            return None
    for flag in (_GZIP_FNAME, _GZIP_FCOMMENT):
        if flags & flag:
            end = _find_nul(mv, p)
            if end < 0:
                fail("truncated member header (unterminated name or comment)", n)
                return None
            p = end + 1
    if flags & _GZIP_FHCRC:
        if n - p < 2:
            fail("truncated member header (FHCRC)", p)
            return None
        if _UINT16_LE.unpack_from(mv, p)[0] != zlib.crc32(mv[pos:p]) & 0xFFFF:
            fail("corrupt member header (header CRC mismatch)", p)
            return None
        p += 2
    return p - pos


def _find_nul(mv: memoryview, start: int) -> int:
    """Index of the first zero byte at or after ``start``, or -1 (searches in slices, no big copy)."""
    step = 256
    p = start
    while p < mv.nbytes:
        i = mv[p : p + step].tobytes().find(0)
        if i >= 0:
            return p + i
        p += step
        step = min(step * 4, 1 << 20)
    return -1


# snappy --------------------------------------------------------------------------------------


def _snappy_decompress(mv: memoryview, max_size: int | None) -> bytes:
    """Read what xerial's ``SnappyInputStream`` (snappy-java 1.1.10) reads.

    - With the xerial header: chunks of ``int32 BE length`` + raw snappy block. A header at a
      chunk boundary starts a concatenated stream and is skipped; 1-3 bytes left after the
      last chunk are ignored (the Java reader stops when it cannot read a whole length).
      The version fields are not checked (snappy-java accepts any, and some non-Java
      producers write them little-endian).
    - Without it (input shorter than the header, or not starting with the magic): the whole
      input is one raw snappy block. SnappyInputStream falls back to this for data written
      by ``Snappy.compress``; accepting it is lenient, and Kafka accepts it too.
    """
    n = mv.nbytes
    if n == 0:
        raise CorruptRecordError("snappy: empty stream")
    if n < len(XERIAL_HEADER) or mv[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return bytes(_snappy_raw(mv, max_size, 0, 0))
    parts: list[BytesLike] = []
    total = 0
    pos = len(XERIAL_HEADER)
    while n - pos >= 4:
        if mv[pos] == XERIAL_MAGIC[0] and mv[pos : pos + 4] == XERIAL_MAGIC[:4]:
            # No chunk length starts with 0x82 (it would be negative): a concatenated stream.
            if n - pos < len(XERIAL_HEADER) or mv[pos : pos + len(XERIAL_MAGIC)] != XERIAL_MAGIC:
                raise CorruptRecordError("snappy: truncated or invalid header of a concatenated stream", position=pos)
            pos += len(XERIAL_HEADER)
            continue
        (length,) = _INT32_BE.unpack_from(mv, pos)
        if length < 0:
            raise CorruptRecordError(f"snappy: invalid chunk size {length}", position=pos)
        start = pos + 4
        if length > n - start:
            raise CorruptRecordError(
                f"snappy: truncated chunk ({length} bytes declared, {n - start} available)", position=pos
            )
        block = _snappy_raw(mv[start : start + length], max_size, total, start)
        parts.append(block)
        total += len(block)
        pos = start + length
    return _join(parts)


def _snappy_raw(block: memoryview, max_size: int | None, produced: int, position: int) -> BytesLike:
    # The raw format starts with its uncompressed length (a varint): check it against the
    # budget before the codec allocates that much.
    try:
        expected = cramjam.snappy.decompress_raw_len(block)
        if max_size is not None and produced + expected > max_size:
            raise _too_large(max_size)
        out = cramjam.snappy.decompress_raw(block)
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(f"snappy: invalid compressed block ({e})", position=position) from None
    if len(out) != expected:
        raise CorruptRecordError("snappy: block decompressed to a size other than declared", position=position)
    return out
