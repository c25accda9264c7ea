//! lz4 and zstd records sections, read and written in the compiled core.
//!
//! Reading accepts exactly what Kafka's readers accept: `Lz4BlockInputStream` (frame
//! descriptor checks, the broken header checksum of magic-0 wrappers, block checksums
//! verified, the content checksum required but not verified, linked blocks rejected, stored
//! blocks) and zstd-jni's `ZstdInputStreamNoFinalizer` (any number of frames, skippable
//! frames skipped, an empty input read as empty). Writing reproduces Kafka's writers byte for
//! byte: `Lz4BlockOutputStream` over lz4-java's fast compressor (independent 64 KiB blocks,
//! FLG 0x60, BD 0x40, blocks that do not shrink stored) and zstd-jni's
//! `ZstdOutputStreamNoFinalizer` at level 3 (no content size, no checksum, a flush before the
//! end of the frame). liblz4 and libzstd are the bundled C libraries of `lz4-sys` and
//! `zstd-sys`, the same code lz4-java and zstd-jni call.
//!
//! A chunk's sections are decoded into one buffer, optionally by several threads, each
//! taking a contiguous run of batches.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::NonNull;
use std::sync::Mutex;

use zstd_sys as zs;

pub const NONE: i64 = 0;
pub const LZ4: i64 = 3;
pub const ZSTD: i64 = 4;

const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
const LZ4_FLG: u8 = 0x60;
const LZ4_BD: u8 = 0x40;
const LZ4_BLOCK_SIZE: usize = 64 * 1024;
const LZ4_UNCOMPRESSED: u32 = 0x8000_0000;
const FLG_VERSION: u8 = 0xC0;
const FLG_INDEPENDENT: u8 = 0x20;
const FLG_BLOCK_CHECKSUM: u8 = 0x10;
const FLG_CONTENT_SIZE: u8 = 0x08;
const FLG_CONTENT_CHECKSUM: u8 = 0x04;
const FLG_RESERVED: u8 = 0x03;

const ZSTD_LEVEL: c_int = 3;
/// What `ZstdOutputStream` writes when closed without input.
const ZSTD_EMPTY_FRAME: [u8; 9] = [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00];
/// The first output buffer for a zstd section is this many times its size (Kafka batches
/// rarely compress better); a fuller buffer grows by doubling, never past `max_size` + 1.
const ZSTD_FIRST_GUESS_RATIO: usize = 16;
const ZSTD_MIN_GUESS: usize = 64 * 1024;

/// Why a section cannot be read: the reason (as Python words it) and a position relative
/// to the section where one is meaningful.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    pub reason: String,
    pub position: Option<usize>,
}

fn corrupt(reason: impl Into<String>, position: usize) -> Corrupt {
    Corrupt {
        reason: reason.into(),
        position: Some(position),
    }
}

fn too_large(max_size: usize) -> Corrupt {
    Corrupt {
        reason: format!("decompressed size exceeds the limit of {max_size} bytes"),
        position: None,
    }
}

/// The first problem of a chunk: the batch's index and what is wrong with its section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub batch: usize,
    pub corrupt: Corrupt,
}

fn header_checksum(descriptor: &[u8]) -> u8 {
    (xxhash_rust::xxh32::xxh32(descriptor, 0) >> 8) as u8
}

fn u32_le(data: &[u8], pos: usize) -> u32 {
    u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap())
}

// ---- reading ---------------------------------------------------------------------------------

/// Append the decompressed `section` (codec `codec`, batch magic `magic`) to `out`.
/// `zstd` is this thread's decompression context. On error `out` may hold a partial result.
pub fn decompress_into(
    out: &mut Vec<u8>,
    codec: i64,
    magic: i64,
    section: &[u8],
    max_size: Option<usize>,
    zstd: &mut Dctx,
) -> Result<(), Corrupt> {
    match codec {
        // Stored as is (an uncompressed batch among compressed ones): copied, never limited,
        // as the Python path joins such sections.
        NONE => {
            out.extend_from_slice(section);
            Ok(())
        }
        LZ4 => lz4_decompress(out, section, max_size, magic),
        ZSTD => zstd_decompress(out, section, max_size, zstd),
        1 | 2 => Err(Corrupt {
            reason: format!("codec {codec} is read in Python, not in the compiled core"),
            position: None,
        }),
        _ => Err(Corrupt {
            reason: format!("unknown compression codec id {codec}"),
            position: None,
        }),
    }
}

/// One LZ4 frame with the checks of Kafka's `Lz4BlockInputStream`.
///
/// Required: magic 0x184D2204, FLG version 01, reserved bits 0, block independence
/// ("dependent block stream is unsupported"), BD with reserved bits 0 and a block-size code
/// 4..7. The HC byte is verified unless `magic` is 0 (old Kafka wrote a broken one). A
/// content size, if flagged, is skipped; block checksums, if flagged, are verified; a content
/// checksum, if flagged, must be present but is not verified (Kafka reads and ignores it).
/// Blocks with the high bit of their size set are stored uncompressed. Bytes after the end
/// mark are ignored, as Kafka's reader stops there. `max_size`: at most one block (<= 4 MiB)
/// is decompressed past the limit before the error.
fn lz4_decompress(
    out: &mut Vec<u8>,
    mv: &[u8],
    max_size: Option<usize>,
    magic: i64,
) -> Result<(), Corrupt> {
    let n = mv.len();
    if n < 6 {
        return Err(corrupt("lz4: stream ended prematurely (frame header)", 0));
    }
    if mv[..4] != LZ4_MAGIC {
        return Err(corrupt("lz4: stream unsupported (invalid magic bytes)", 0));
    }
    let (flg, bd) = (mv[4], mv[5]);
    if flg & FLG_RESERVED != 0 {
        return Err(corrupt("lz4: reserved FLG bits must be 0", 4));
    }
    if flg & FLG_INDEPENDENT == 0 {
        return Err(corrupt(
            "lz4: dependent block stream is unsupported (block independence flag not set)",
            4,
        ));
    }
    if flg & FLG_VERSION != 0x40 {
        return Err(corrupt(
            format!("lz4: frame version {} is unsupported", flg >> 6),
            4,
        ));
    }
    if bd & 0x8F != 0 {
        return Err(corrupt("lz4: reserved BD bits must be 0", 5));
    }
    let code = (bd >> 4) & 0x07;
    if code < 4 {
        return Err(corrupt(
            format!("lz4: block size code {code} is not between 4 and 7"),
            5,
        ));
    }
    let max_block = 1usize << (2 * code as usize + 8);
    let mut pos = 6;
    if flg & FLG_CONTENT_SIZE != 0 {
        if n - pos < 8 {
            return Err(corrupt("lz4: stream ended prematurely (content size)", pos));
        }
        pos += 8;
    }
    if pos >= n {
        return Err(corrupt(
            "lz4: stream ended prematurely (header checksum)",
            pos,
        ));
    }
    // Magic 0: Kafka wrote a broken checksum (over the magic bytes too) and never checks it.
    if magic >= 1 && mv[pos] != header_checksum(&mv[4..pos]) {
        return Err(corrupt(
            "lz4: stream frame descriptor corrupted (HC mismatch)",
            pos,
        ));
    }
    pos += 1;

    let block_checksum = flg & FLG_BLOCK_CHECKSUM != 0;
    let base = out.len();
    loop {
        if n - pos < 4 {
            return Err(corrupt(
                "lz4: stream ended prematurely (block size or end mark)",
                pos,
            ));
        }
        let word = u32_le(mv, pos);
        let size = (word & !LZ4_UNCOMPRESSED) as usize;
        if size == 0 {
            // The end mark (Kafka masks the high bit first, so 0x80000000 ends too).
            pos += 4;
            if flg & FLG_CONTENT_CHECKSUM != 0 && n - pos < 4 {
                return Err(corrupt(
                    "lz4: stream ended prematurely (content checksum)",
                    pos,
                ));
            }
            return Ok(());
        }
        if size > max_block {
            return Err(corrupt(
                format!("lz4: block size {size} exceeded max: {max_block}"),
                pos,
            ));
        }
        let start = pos + 4;
        let mut end = start + size;
        if end > n {
            return Err(corrupt("lz4: stream ended prematurely (block data)", pos));
        }
        let block = &mv[start..end];
        if block_checksum {
            if n - end < 4 {
                return Err(corrupt(
                    "lz4: stream ended prematurely (block checksum)",
                    end,
                ));
            }
            if u32_le(mv, end) != xxhash_rust::xxh32::xxh32(block, 0) {
                return Err(corrupt("lz4: block checksum mismatch", end));
            }
            end += 4;
        }
        if word & LZ4_UNCOMPRESSED != 0 {
            out.extend_from_slice(block);
        } else {
            out.reserve(max_block);
            let len = out.len();
            // SAFETY: `max_block` bytes of spare capacity at `len`; LZ4_decompress_safe
            // never writes past the capacity it is given and returns what it wrote.
            let written = unsafe {
                lz4_sys::LZ4_decompress_safe(
                    block.as_ptr() as *const c_char,
                    out.as_mut_ptr().add(len) as *mut c_char,
                    size as c_int,
                    max_block as c_int,
                )
            };
            if written < 0 {
                return Err(corrupt("lz4: invalid compressed block", pos));
            }
            // SAFETY: the first `written` spare bytes were initialized by liblz4.
            unsafe { out.set_len(len + written as usize) };
        }
        if let Some(m) = max_size {
            if out.len() - base > m {
                return Err(too_large(m));
            }
        }
        pos = end;
    }
}

/// A zstd decompression context (freed on drop).
pub struct Dctx(NonNull<zs::ZSTD_DCtx>);

// SAFETY: a ZSTD_DCtx may move between threads; it is used by one at a time (&mut).
unsafe impl Send for Dctx {}

impl Dctx {
    pub fn new() -> Self {
        // SAFETY: plain constructor; null only when out of memory.
        let ptr = unsafe { zs::ZSTD_createDCtx() };
        Dctx(NonNull::new(ptr).expect("ZSTD_createDCtx: out of memory"))
    }
}

impl Drop for Dctx {
    fn drop(&mut self) {
        // SAFETY: created by ZSTD_createDCtx, freed once.
        unsafe { zs::ZSTD_freeDCtx(self.0.as_ptr()) };
    }
}

fn zstd_error_name(code: usize) -> String {
    // SAFETY: ZSTD_getErrorName returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(zs::ZSTD_getErrorName(code)) }
        .to_string_lossy()
        .into_owned()
}

fn zstd_is_error(code: usize) -> bool {
    // SAFETY: a pure function of the code.
    unsafe { zs::ZSTD_isError(code) != 0 }
}

/// zstd frames read the way zstd-jni's `ZstdInputStreamNoFinalizer` reads them, with the
/// streaming decoder it uses (so its window limit, 128 MiB, applies too): any number of
/// frames, skippable frames skipped, a truncated frame or trailing bytes that are not a frame
/// are errors, an empty input is an empty output, content checksums are verified. Output goes
/// straight into `out`, never more than `max_size` + 1 bytes of it.
fn zstd_decompress(
    out: &mut Vec<u8>,
    src: &[u8],
    max_size: Option<usize>,
    dctx: &mut Dctx,
) -> Result<(), Corrupt> {
    let n = src.len();
    if n == 0 {
        return Ok(());
    }
    let d = dctx.0.as_ptr();
    // SAFETY: a valid context; a session reset forgets any earlier (failed) frame.
    unsafe { zs::ZSTD_DCtx_reset(d, zs::ZSTD_ResetDirective::ZSTD_reset_session_only) };
    let base = out.len();
    let limit = max_size.map(|m| base.saturating_add(m).saturating_add(1));
    let guess = (n.saturating_mul(ZSTD_FIRST_GUESS_RATIO)).max(ZSTD_MIN_GUESS);
    let mut input = zs::ZSTD_inBuffer {
        src: src.as_ptr() as *const c_void,
        size: n,
        pos: 0,
    };
    let mut frame_start = 0;
    loop {
        let end = limit.unwrap_or(usize::MAX);
        if out.len() == out.capacity() {
            if out.len() >= end {
                return Err(too_large(max_size.unwrap()));
            }
            let produced = out.len() - base;
            let want = if produced == 0 { guess } else { produced };
            // Exactly: a doubling of the whole buffer must not reach far past the limit.
            out.reserve_exact(want.min(end - out.len()));
        }
        let window_end = out.capacity().min(end);
        let mut output = zs::ZSTD_outBuffer {
            dst: out.as_mut_ptr() as *mut c_void,
            size: window_end,
            pos: out.len(),
        };
        let before = (input.pos, output.pos);
        // SAFETY: the output window lies in `out`'s allocation (its spare capacity from
        // `pos`), the input in `src`; libzstd writes only within [pos, size).
        let ret = unsafe { zs::ZSTD_decompressStream(d, &mut output, &mut input) };
        // SAFETY: libzstd initialized everything up to output.pos.
        unsafe { out.set_len(output.pos) };
        if zstd_is_error(ret) {
            return Err(corrupt(
                format!("zstd: {}", zstd_error_name(ret)),
                frame_start,
            ));
        }
        if limit.is_some_and(|l| output.pos >= l) {
            return Err(too_large(max_size.unwrap()));
        }
        if ret == 0 {
            // A frame (or a skippable frame) ended and is fully flushed.
            if input.pos == n {
                return Ok(());
            }
            frame_start = input.pos;
            continue;
        }
        let full = output.pos == window_end;
        if !full && (input.pos == n || (input.pos, output.pos) == before) {
            return Err(corrupt("zstd: truncated frame", n));
        }
    }
}

// ---- writing ---------------------------------------------------------------------------------

/// The LZ4 frame descriptor Kafka writes: magic, FLG, BD and the header checksum, which
/// for magic 0 is the broken one Kafka writes in v0 wrappers (over the magic bytes too).
pub fn lz4_header(magic: i64) -> [u8; 7] {
    let mut h = [0u8; 7];
    h[..4].copy_from_slice(&LZ4_MAGIC);
    h[4] = LZ4_FLG;
    h[5] = LZ4_BD;
    h[6] = if magic == 0 {
        header_checksum(&h[..6])
    } else {
        header_checksum(&h[4..6])
    };
    h
}

/// `data` as Kafka's `Lz4BlockOutputStream` writes it: independent 64 KiB blocks, each
/// compressed by liblz4's fast compressor into a buffer of the full bound and stored as is
/// when the result is not smaller than the block; then the end mark.
fn lz4_compress(out: &mut Vec<u8>, data: &[u8], magic: i64) {
    out.extend_from_slice(&lz4_header(magic));
    for block in data.chunks(LZ4_BLOCK_SIZE) {
        let len = block.len();
        // SAFETY: a pure function of the size.
        let bound = unsafe { lz4_sys::LZ4_compressBound(len as c_int) } as usize;
        out.reserve(4 + bound);
        let at = out.len();
        // SAFETY: `bound` bytes of spare capacity after the 4-byte size field.
        let written = unsafe {
            lz4_sys::LZ4_compress_default(
                block.as_ptr() as *const c_char,
                out.as_mut_ptr().add(at + 4) as *mut c_char,
                len as c_int,
                bound as c_int,
            )
        };
        if written > 0 && (written as usize) < len {
            out.extend_from_slice(&(written as u32).to_le_bytes());
            // SAFETY: liblz4 initialized `written` bytes after the size field.
            unsafe { out.set_len(at + 4 + written as usize) };
        } else {
            out.extend_from_slice(&(len as u32 | LZ4_UNCOMPRESSED).to_le_bytes());
            out.extend_from_slice(block);
        }
    }
    out.extend_from_slice(&[0, 0, 0, 0]);
}

/// A zstd compression context at Kafka's settings (freed on drop).
pub struct Cctx(NonNull<zs::ZSTD_CCtx>);

// SAFETY: as for Dctx.
unsafe impl Send for Cctx {}

impl Cctx {
    pub fn new() -> Self {
        // SAFETY: plain constructor and parameter setters on the new context.
        unsafe {
            let ptr = NonNull::new(zs::ZSTD_createCCtx()).expect("ZSTD_createCCtx: out of memory");
            let c = ptr.as_ptr();
            for (param, value) in [
                (zs::ZSTD_cParameter::ZSTD_c_compressionLevel, ZSTD_LEVEL),
                (zs::ZSTD_cParameter::ZSTD_c_contentSizeFlag, 0),
                (zs::ZSTD_cParameter::ZSTD_c_checksumFlag, 0),
            ] {
                let r = zs::ZSTD_CCtx_setParameter(c, param, value);
                assert!(
                    !zstd_is_error(r),
                    "ZSTD_CCtx_setParameter: {}",
                    zstd_error_name(r)
                );
            }
            Cctx(ptr)
        }
    }
}

impl Drop for Cctx {
    fn drop(&mut self) {
        // SAFETY: created by ZSTD_createCCtx, freed once.
        unsafe { zs::ZSTD_freeCCtx(self.0.as_ptr()) };
    }
}

/// Run one `ZSTD_compressStream2` directive until it has consumed `input` and (for flush
/// and end) flushed everything, appending to `out`.
fn zstd_stream(
    c: *mut zs::ZSTD_CCtx,
    out: &mut Vec<u8>,
    input: &mut zs::ZSTD_inBuffer,
    directive: zs::ZSTD_EndDirective,
) {
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.len().max(4096));
        }
        let mut output = zs::ZSTD_outBuffer {
            dst: out.as_mut_ptr() as *mut c_void,
            size: out.capacity(),
            pos: out.len(),
        };
        // SAFETY: output window in `out`'s allocation, input in the caller's slice.
        let ret = unsafe { zs::ZSTD_compressStream2(c, &mut output, input, directive) };
        // SAFETY: libzstd initialized everything up to output.pos.
        unsafe { out.set_len(output.pos) };
        assert!(
            !zstd_is_error(ret),
            "zstd compression: {}",
            zstd_error_name(ret)
        );
        let done = match directive {
            zs::ZSTD_EndDirective::ZSTD_e_continue => input.pos == input.size,
            _ => ret == 0,
        };
        if done {
            return;
        }
    }
}

/// `data` as Kafka's zstd writer writes it: records streamed into `ZstdOutputStream`
/// (content size unknown, so not written), then the flush and the end of the frame that
/// closing its `BufferedOutputStream` performs. The flush closes the current block, so it
/// changes the bytes.
fn zstd_compress(out: &mut Vec<u8>, data: &[u8], cctx: &mut Cctx) {
    if data.is_empty() {
        out.extend_from_slice(&ZSTD_EMPTY_FRAME);
        return;
    }
    let c = cctx.0.as_ptr();
    // SAFETY: a valid context; a session reset starts a new frame with the same parameters.
    unsafe { zs::ZSTD_CCtx_reset(c, zs::ZSTD_ResetDirective::ZSTD_reset_session_only) };
    // SAFETY: a pure function of the size.
    out.reserve(unsafe { zs::ZSTD_compressBound(data.len()) } + 16);
    let mut input = zs::ZSTD_inBuffer {
        src: data.as_ptr() as *const c_void,
        size: data.len(),
        pos: 0,
    };
    zstd_stream(c, out, &mut input, zs::ZSTD_EndDirective::ZSTD_e_continue);
    zstd_stream(c, out, &mut input, zs::ZSTD_EndDirective::ZSTD_e_flush);
    zstd_stream(c, out, &mut input, zs::ZSTD_EndDirective::ZSTD_e_end);
}

/// Append `data` compressed with `codec` (0 = stored as is, 3 = lz4, 4 = zstd) to `out`.
pub fn compress_into(out: &mut Vec<u8>, codec: i64, magic: i64, data: &[u8], zstd: &mut Cctx) {
    match codec {
        LZ4 => lz4_compress(out, data, magic),
        ZSTD => zstd_compress(out, data, zstd),
        _ => out.extend_from_slice(data),
    }
}

/// The versions of the bundled C libraries: (liblz4, libzstd), e.g. ("1.10.0", "1.5.7").
pub fn library_versions() -> (String, String) {
    // SAFETY: pure functions; ZSTD_versionString returns a static NUL-terminated string.
    let (lz4, zstd) = unsafe {
        (
            lz4_sys::LZ4_versionNumber(),
            CStr::from_ptr(zs::ZSTD_versionString())
                .to_string_lossy()
                .into_owned(),
        )
    };
    let lz4 = format!("{}.{}.{}", lz4 / 10000, lz4 / 100 % 100, lz4 % 100);
    (lz4, zstd)
}

// ---- contexts and threads --------------------------------------------------------------------

thread_local! {
    static DCTX: RefCell<Option<Dctx>> = const { RefCell::new(None) };
    static CCTX: RefCell<Option<Cctx>> = const { RefCell::new(None) };
}

/// Run `f` with this thread's zstd decompression context (created on first use, kept for
/// the thread's life: its window buffers are reused across calls).
pub fn with_dctx<R>(f: impl FnOnce(&mut Dctx) -> R) -> R {
    DCTX.with(|cell| f(cell.borrow_mut().get_or_insert_with(Dctx::new)))
}

/// As `with_dctx`, for compression.
pub fn with_cctx<R>(f: impl FnOnce(&mut Cctx) -> R) -> R {
    CCTX.with(|cell| f(cell.borrow_mut().get_or_insert_with(Cctx::new)))
}

/// Output buffers kept for the next call, so that a chunk's output is written into memory
/// the process has touched before: a fresh multi-megabyte buffer costs a page fault per 4 KiB
/// (measured: 15 k faults per 37 MB of zstd output without reuse, 9 k with it on the
/// project's VM, where faults are expensive). At most `SCRATCH_KEPT` buffers of at most
/// `SCRATCH_MAX_BYTES` each are kept (about one chunk's output per cleaner thread).
static SCRATCH: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const SCRATCH_KEPT: usize = 4;
const SCRATCH_MAX_BYTES: usize = 64 << 20;

/// An empty buffer with room for at least `capacity` bytes, reused if one is kept.
pub fn take_scratch(capacity: usize) -> Vec<u8> {
    let mut buffer = SCRATCH
        .lock()
        .ok()
        .and_then(|mut kept| kept.pop())
        .unwrap_or_default();
    buffer.clear();
    buffer.reserve(capacity);
    buffer
}

/// Give a buffer back for reuse (dropped if too large or enough are kept).
pub fn give_scratch(buffer: Vec<u8>) {
    if buffer.capacity() <= SCRATCH_MAX_BYTES {
        if let Ok(mut kept) = SCRATCH.lock() {
            if kept.len() < SCRATCH_KEPT {
                kept.push(buffer);
            }
        }
    }
}

/// Below this many input bytes per thread a chunk is not split: starting a thread and
/// its zstd context costs more than it saves.
pub const MIN_BYTES_PER_THREAD: usize = 256 * 1024;
/// The default never uses more threads than this, however many cores there are.
pub const MAX_DEFAULT_THREADS: usize = 4;

/// The number of threads for `total` input bytes in `sections` sections: `requested` if
/// given (at least 1, at most one per section); else the cores this process may use, up
/// to `MAX_DEFAULT_THREADS`, and never more than one per `MIN_BYTES_PER_THREAD` of input.
pub fn thread_count(requested: Option<usize>, total: usize, sections: usize) -> usize {
    let wanted = match requested {
        Some(n) => n,
        None => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(MAX_DEFAULT_THREADS)
            .min(total / MIN_BYTES_PER_THREAD),
    };
    wanted.min(sections).max(1)
}

/// Split `0..lengths.len()` into at most `parts` contiguous runs of about equal total length.
pub fn split(lengths: &[usize], parts: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = lengths.iter().sum();
    let mut runs = Vec::with_capacity(parts);
    let (mut start, mut acc) = (0, 0usize);
    for (i, &len) in lengths.iter().enumerate() {
        acc += len;
        // End run k once the running total reaches k/parts of the whole.
        if runs.len() + 1 < parts && acc * parts >= total * (runs.len() + 1) {
            runs.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < lengths.len() || runs.is_empty() {
        runs.push(start..lengths.len());
    }
    runs
}

/// One thread's share of a chunk: its output and each section's span in it.
pub struct Part {
    pub out: Vec<u8>,
    pub spans: Vec<(usize, usize)>,
}

/// Run `work` over each run of `runs` (the first on this thread, the others on scoped
/// threads) and return the parts in order, or the first problem in batch order.
pub fn run_parts<F>(runs: &[std::ops::Range<usize>], work: F) -> Result<Vec<Part>, Problem>
where
    F: Fn(std::ops::Range<usize>) -> Result<Part, Problem> + Sync,
{
    if runs.len() <= 1 {
        let run = runs.first().cloned().unwrap_or(0..0);
        return work(run).map(|p| vec![p]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = runs[1..]
            .iter()
            .map(|run| {
                let run = run.clone();
                let work = &work;
                s.spawn(move || work(run))
            })
            .collect();
        let first = work(runs[0].clone());
        let mut results = vec![first];
        results.extend(
            handles
                .into_iter()
                .map(|h| h.join().expect("a codec thread panicked")),
        );
        // Runs are contiguous and in batch order, and each stops at its own first problem:
        // the earliest run with a problem has the chunk's first.
        results.into_iter().collect()
    })
}

/// Decompress sections `starts[i]..ends[i]` of `data` for the batches of `run`.
pub fn decompress_run(
    data: &[u8],
    starts: &[i64],
    ends: &[i64],
    codecs: &[i64],
    magics: &[i64],
    max_size: Option<usize>,
    run: std::ops::Range<usize>,
) -> Result<Part, Problem> {
    let input: usize = run.clone().map(|i| (ends[i] - starts[i]) as usize).sum();
    let mut out = take_scratch(input.saturating_mul(4));
    let mut spans = Vec::with_capacity(run.len());
    with_dctx(|dctx| {
        for i in run {
            let section = &data[starts[i] as usize..ends[i] as usize];
            let begin = out.len();
            decompress_into(&mut out, codecs[i], magics[i], section, max_size, dctx)
                .map_err(|corrupt| Problem { batch: i, corrupt })?;
            spans.push((begin, out.len()));
        }
        Ok(Part { out, spans })
    })
}

/// Compress sections `starts[i]..ends[i]` of `data` for the batches of `run`.
pub fn compress_run(
    data: &[u8],
    starts: &[i64],
    ends: &[i64],
    codecs: &[i64],
    magics: &[i64],
    run: std::ops::Range<usize>,
) -> Part {
    let input: usize = run.clone().map(|i| (ends[i] - starts[i]) as usize).sum();
    let mut out = take_scratch(input / 2 + 64 * run.len());
    let mut spans = Vec::with_capacity(run.len());
    with_cctx(|cctx| {
        for i in run {
            let begin = out.len();
            let section = &data[starts[i] as usize..ends[i] as usize];
            compress_into(&mut out, codecs[i], magics[i], section, cctx);
            spans.push((begin, out.len()));
        }
    });
    Part { out, spans }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_contiguous_and_covers_everything() {
        for parts in 1..5 {
            for lengths in [
                vec![],
                vec![5],
                vec![1, 1, 1, 1, 1, 1, 1],
                vec![100, 1, 1, 1, 100],
            ] {
                let runs = split(&lengths, parts);
                assert!(runs.len() <= parts.max(1));
                let mut next = 0;
                for r in &runs {
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, lengths.len());
            }
        }
    }

    #[test]
    fn round_trips() {
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect();
        let mut cctx = Cctx::new();
        let mut dctx = Dctx::new();
        for codec in [LZ4, ZSTD] {
            let mut packed = Vec::new();
            compress_into(&mut packed, codec, 2, &data, &mut cctx);
            let mut back = Vec::new();
            decompress_into(&mut back, codec, 2, &packed, Some(data.len()), &mut dctx).unwrap();
            assert_eq!(back, data);
            let mut again = Vec::new();
            let err = decompress_into(
                &mut again,
                codec,
                2,
                &packed,
                Some(data.len() - 1),
                &mut dctx,
            );
            assert!(err.unwrap_err().reason.contains("exceeds the limit"));
        }
    }
}
