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
- lz4: an LZ4 frame with *independent* 64 KiB blocks, no content size, no checksums
  (``Lz4BlockOutputStream``). Kafka's reader rejects linked blocks, so ``block_linked=False``
  is not optional.
- zstd: level 3, one frame without content size, ended the way ``ZstdOutputStream`` ends it
  (a flush, then the end of the frame).

Reading. ``decompress`` accepts what Kafka's readers accept (``GZIPInputStream``,
``SnappyInputStream``, ``Lz4BlockInputStream``, ``ZstdInputStreamNoFinalizer``), including
their leniencies, and turns every failure into ``CorruptRecordError`` with a buffer-relative
position where one is meaningful. ``max_size`` caps the decompressed size so that a small
corrupt or hostile batch cannot exhaust memory.

Every codec runs in C (zlib, cramjam's snappy, python-lz4, zstandard/cramjam's zstd); Python
only walks frame and chunk headers, once per block (>= 32 KiB of data), never per byte.
"""

from __future__ import annotations

import enum
import struct
import threading
import zlib

import cramjam
import lz4.block
import lz4.frame
import numpy as np
import xxhash
import zstandard

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


# Default levels, as Kafka's CompressionType: gzip Deflater.DEFAULT_COMPRESSION (= 6), zstd 3.
# For lz4 Kafka's default "level 9" selects lz4-java's *fast* compressor (Lz4BlockOutputStream
# uses the high compressor only for non-default levels), which is lz4.frame's level 0.
GZIP_LEVEL = 6
ZSTD_LEVEL = 3
LZ4_LEVEL = 0

_INT32_BE = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")
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
LZ4_MAGIC = b"\x04\x22\x4d\x18"
LZ4_FLG = 0x60
LZ4_BD = 0x40
LZ4_HEADER = LZ4_MAGIC + bytes((LZ4_FLG, LZ4_BD, (xxhash.xxh32_intdigest(bytes((LZ4_FLG, LZ4_BD))) >> 8) & 0xFF))
LZ4_V0_HC = (xxhash.xxh32_intdigest(LZ4_HEADER[:6]) >> 8) & 0xFF
_LZ4_UNCOMPRESSED_BLOCK = 0x80000000
_LZ4_FLG_VERSION, _LZ4_FLG_INDEPENDENT, _LZ4_FLG_BLOCK_CHECKSUM = 0xC0, 0x20, 0x10
_LZ4_FLG_CONTENT_SIZE, _LZ4_FLG_CONTENT_CHECKSUM, _LZ4_FLG_RESERVED = 0x08, 0x04, 0x03

# What ZstdOutputStream emits when closed without any input (zstd itself picks a
# single-segment header with content size 0 when the whole input arrives with the end call).
_ZSTD_EMPTY_FRAME = bytes.fromhex("28b52ffd2000010000")

_local = threading.local()  # zstd contexts are not thread-safe; one pair per thread


def _zstd_compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "zstd_compressor", None)
    if c is None:
        c = _local.zstd_compressor = zstandard.ZstdCompressor(
            level=ZSTD_LEVEL, write_content_size=False, write_checksum=False
        )
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zstd_decompressor", None)
    if d is None:
        d = _local.zstd_decompressor = zstandard.ZstdDecompressor()
    return d


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
    if codec is CompressionType.LZ4:
        return _lz4_compress(mv, magic)
    return _zstd_compress(mv)


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


def _lz4_compress(mv: memoryview, magic: int) -> bytes:
    # block_linked=False: Lz4BlockInputStream throws "Dependent block stream is unsupported"
    # on linked blocks, which are python-lz4's default. store_size/content_checksum off: Kafka
    # never writes them, and leaving them out keeps the bytes equal to Kafka's.
    out = lz4.frame.compress(
        mv,
        compression_level=LZ4_LEVEL,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        block_checksum=False,
        store_size=False,
        return_bytearray=False,
    )
    if out[:7] != LZ4_HEADER:  # a changed library default would silently change our bytes
        raise RuntimeError(f"lz4.frame wrote an unexpected frame descriptor {out[:7].hex()}")
    if magic == 0:
        out = b"".join((out[:6], bytes((LZ4_V0_HC,)), out[7:]))
    return out


def _zstd_compress(mv: memoryview) -> bytes:
    if mv.nbytes == 0:
        return _ZSTD_EMPTY_FRAME
    # Kafka streams records into ZstdOutputStreamNoFinalizer (content size unknown, so none is
    # written); closing the BufferedOutputStream around it flushes (ZSTD_e_flush) and then
    # ends the frame (ZSTD_e_end). The flush closes the current block, so it changes the
    # bytes: reproduce both steps.
    cobj = _zstd_compressor().compressobj()
    return b"".join((cobj.compress(mv), cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK), cobj.flush()))


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
    if codec is CompressionType.LZ4:
        return _lz4_decompress(mv, max_size, magic)
    return _zstd_decompress(mv, max_size)


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


# lz4 -----------------------------------------------------------------------------------------


def _lz4_decompress(mv: memoryview, max_size: int | None, magic: int) -> bytes:
    """Read one LZ4 frame with the checks of Kafka's ``Lz4BlockInputStream``.

    Required: magic 0x184D2204, FLG version 01, reserved bits 0, block independence
    ("dependent block stream is unsupported"), BD with reserved bits 0 and a block-size code
    4..7. The HC byte is verified unless ``magic`` is 0 (old Kafka wrote a broken one). A
    content size, if flagged, is skipped; block checksums, if flagged, are verified; a content
    checksum, if flagged, must be present but is not verified (Kafka reads and ignores it).
    Blocks with the high bit of their size set are stored uncompressed. Bytes after the end
    mark are ignored, as Kafka's reader stops there.
    """
    n = mv.nbytes
    if n < 6:
        raise CorruptRecordError("lz4: stream ended prematurely (frame header)", position=0)
    if mv[:4] != LZ4_MAGIC:
        raise CorruptRecordError("lz4: stream unsupported (invalid magic bytes)", position=0)
    flg, bd = mv[4], mv[5]
    if flg & _LZ4_FLG_RESERVED:
        raise CorruptRecordError("lz4: reserved FLG bits must be 0", position=4)
    if not flg & _LZ4_FLG_INDEPENDENT:
        raise CorruptRecordError(
            "lz4: dependent block stream is unsupported (block independence flag not set)", position=4
        )
    if flg & _LZ4_FLG_VERSION != 0x40:
        raise CorruptRecordError(f"lz4: frame version {flg >> 6} is unsupported", position=4)
    if bd & 0x8F:
        raise CorruptRecordError("lz4: reserved BD bits must be 0", position=5)
    code = (bd >> 4) & 0x07
    if code < 4:
        raise CorruptRecordError(f"lz4: block size code {code} is not between 4 and 7", position=5)
    max_block = 1 << (2 * code + 8)
    pos = 6
    if flg & _LZ4_FLG_CONTENT_SIZE:
        if n - pos < 8:
            raise CorruptRecordError("lz4: stream ended prematurely (content size)", position=pos)
        pos += 8
    if pos >= n:
        raise CorruptRecordError("lz4: stream ended prematurely (header checksum)", position=pos)
    if magic >= 1 and mv[pos] != (xxhash.xxh32_intdigest(mv[4:pos]) >> 8) & 0xFF:
        raise CorruptRecordError("lz4: stream frame descriptor corrupted (HC mismatch)", position=pos)
    pos += 1

    block_checksum = bool(flg & _LZ4_FLG_BLOCK_CHECKSUM)
    parts: list[BytesLike] = []
    total = 0
    unpack_size = _UINT32_LE.unpack_from
    decompress_block = lz4.block.decompress
    while True:
        if n - pos < 4:
            raise CorruptRecordError("lz4: stream ended prematurely (block size or end mark)", position=pos)
        (word,) = unpack_size(mv, pos)
        size = word & ~_LZ4_UNCOMPRESSED_BLOCK
        if size == 0:  # end mark (Kafka masks the high bit first, so 0x80000000 ends too)
            pos += 4
            if flg & _LZ4_FLG_CONTENT_CHECKSUM and n - pos < 4:
                raise CorruptRecordError("lz4: stream ended prematurely (content checksum)", position=pos)
            break
        if size > max_block:
            raise CorruptRecordError(f"lz4: block size {size} exceeded max: {max_block}", position=pos)
        start = pos + 4
        end = start + size
        if end > n:
            raise CorruptRecordError("lz4: stream ended prematurely (block data)", position=pos)
        block = mv[start:end]
        if block_checksum:
            if n - end < 4:
                raise CorruptRecordError("lz4: stream ended prematurely (block checksum)", position=end)
            if unpack_size(mv, end)[0] != xxhash.xxh32_intdigest(block):
                raise CorruptRecordError("lz4: block checksum mismatch", position=end)
            end += 4
        if word & _LZ4_UNCOMPRESSED_BLOCK:
            out: BytesLike = block  # stored as is; joined below without an extra copy
        else:
            try:
                out = decompress_block(block, uncompressed_size=max_block)
            except lz4.block.LZ4BlockError:
                raise CorruptRecordError("lz4: invalid compressed block", position=pos) from None
        total += len(out)
        if max_size is not None and total > max_size:
            raise _too_large(max_size)
        parts.append(out)
        pos = end
    return _join(parts)


# zstd ----------------------------------------------------------------------------------------


def _zstd_decompress(mv: memoryview, max_size: int | None) -> bytes:
    """Read zstd frames the way zstd-jni's ``ZstdInputStreamNoFinalizer`` does.

    Any number of frames, with or without content size, skippable frames skipped; a truncated
    frame or trailing bytes that are not a frame are errors; an empty input is an empty
    output (zstd-jni returns end-of-stream at once). Content checksums, if present, are
    verified by libzstd, as by zstd-jni.
    """
    if mv.nbytes == 0:
        return b""
    if max_size is not None:
        return _zstd_decompress_bounded(mv, max_size)
    dctx = _zstd_decompressor()
    parts: list[bytes] = []
    rest: BytesLike = mv
    consumed = 0
    while True:
        dobj = dctx.decompressobj()
        try:
            parts.append(dobj.decompress(rest))
        except zstandard.ZstdError as e:
            raise CorruptRecordError(f"zstd: {_zstd_reason(e)}", position=consumed) from None
        if not dobj.eof:
            raise CorruptRecordError("zstd: truncated frame", position=mv.nbytes)
        tail = dobj.unused_data
        if not tail:
            return _join(parts)
        consumed = mv.nbytes - len(tail)
        rest = tail


_ZSTD_FIRST_GUESS_RATIO = 16  # Kafka batches rarely compress better than this
_ZSTD_MIN_GUESS = 1 << 20


def _zstd_decompress_bounded(mv: memoryview, max_size: int) -> bytes:
    # Decompress straight into a fixed buffer: libzstd stops with "failed to write whole
    # buffer" instead of growing it, so nothing past the buffer is ever allocated. The first
    # buffer is a guess (a generous max_size should not cost its full size for every batch);
    # a result that does not fit is retried in a 4x larger buffer, up to max_size. np.empty
    # does not touch the pages it does not need.
    capacity = min(max_size, max(_ZSTD_MIN_GUESS, _ZSTD_FIRST_GUESS_RATIO * mv.nbytes))
    while True:
        out = np.empty(capacity, dtype=np.uint8)
        try:
            written = cramjam.zstd.decompress_into(mv, out)
        except cramjam.DecompressionError as e:
            if "whole buffer" not in str(e):
                raise CorruptRecordError(f"zstd: {e}") from None
            if capacity >= max_size:
                raise _too_large(max_size) from None
            capacity = min(max_size, capacity * 4)
            continue
        return out[:written].tobytes()


def _zstd_reason(e: zstandard.ZstdError) -> str:
    text = str(e)
    for prefix in ("zstd decompressor error: ", "zstd decompress error: "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text
