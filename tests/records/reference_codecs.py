"""The Python lz4 and zstd codecs that the compiled core (``native/src/codecs.rs``) replaced,
kept as the tests' reference (as ``reference_columns`` is for the record decoder): lz4 frames
parsed in Python over python-lz4's block codec, zstd through python-zstandard (and cramjam's
bounded reader under ``max_size``), writers through python-lz4's frame writer and
python-zstandard's streaming writer. Same checks, same reasons, same positions."""

from __future__ import annotations

import struct
import threading

import cramjam
import lz4.block
import lz4.frame
import numpy as np
import xxhash
import zstandard

from cleaner.errors import CorruptRecordError
from cleaner.records.compression import _join, _too_large  # the same messages as production

BytesLike = bytes | bytearray | memoryview

LZ4_LEVEL = 0
ZSTD_LEVEL = 3
_UINT32_LE = struct.Struct("<I")

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


def compress(codec: int, data: BytesLike, *, magic: int = 2) -> bytes:
    """The reference writer for lz4 (3) or zstd (4)."""
    mv = memoryview(data).cast("B")
    return _lz4_compress(mv, magic) if codec == 3 else _zstd_compress(mv)


def decompress(codec: int, data: BytesLike, *, max_size: int | None = None, magic: int = 2) -> bytes:
    """The reference reader for lz4 (3) or zstd (4)."""
    mv = memoryview(data).cast("B")
    return _lz4_decompress(mv, max_size, magic) if codec == 3 else _zstd_decompress(mv, max_size)
