//! kafka-cleaner's compiled core (`cleaner._native`): the byte-level loops over every
//! record, under Python code that keeps Kafka's rules readable. Each function releases
//! the GIL while it works, so cleaner threads run in parallel.

mod batches;
mod codecs;
mod offset_map;
mod records;
mod varint;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// The first structural problem of a records section: (batch, position, offset delta, reason).
type Problem = (usize, i64, Option<i64>, String);

/// `starts` and `ends` as slices, checked to be spans `[start, end)` inside a buffer of
/// `len` bytes (`what` names a span in the error).
fn checked_spans<'a>(
    starts: &'a PyReadonlyArray1<'_, i64>,
    ends: &'a PyReadonlyArray1<'_, i64>,
    len: usize,
    what: &str,
) -> PyResult<(&'a [i64], &'a [i64])> {
    let (s, e) = (starts.as_slice()?, ends.as_slice()?);
    if s.len() != e.len() {
        return Err(PyValueError::new_err(format!(
            "{what}: starts and ends differ in length"
        )));
    }
    if s.iter()
        .zip(e)
        .any(|(&a, &b)| a < 0 || b < a || b as usize > len)
    {
        return Err(PyValueError::new_err(format!(
            "a {what} lies outside the buffer"
        )));
    }
    Ok((s, e))
}

/// Decode the records of v2 batches to columns. Returns `(columns, None)` or
/// `(None, (batch, position, offset_delta, reason))` for the first structural problem.
#[pyfunction]
fn decode_records<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    sec_start: PyReadonlyArray1<'py, i64>,
    sec_end: PyReadonlyArray1<'py, i64>,
    counts: PyReadonlyArray1<'py, i64>,
) -> PyResult<(Option<Bound<'py, PyDict>>, Option<Problem>)> {
    let bytes = data.as_bytes();
    let (s, e, n) = (
        sec_start.as_slice()?,
        sec_end.as_slice()?,
        counts.as_slice()?,
    );
    if s.len() != n.len() || e.len() != n.len() {
        return Err(PyValueError::new_err(
            "sec_start, sec_end and counts differ in length",
        ));
    }
    match py.allow_threads(|| records::decode(bytes, s, e, n)) {
        Ok(c) => {
            let out = PyDict::new(py);
            for (name, column) in [
                ("batch", c.batch),
                ("start", c.start),
                ("end", c.end),
                ("timestamp_delta", c.timestamp_delta),
                ("body_start", c.body_start),
                ("offset_delta", c.offset_delta),
                ("key_start", c.key_start),
                ("key_length", c.key_length),
                ("value_start", c.value_start),
                ("value_length", c.value_length),
                ("headers_count", c.headers_count),
                ("headers_start", c.headers_start),
            ] {
                out.set_item(name, column.into_pyarray(py))?;
            }
            Ok((Some(out), None))
        }
        Err(p) => Ok((None, Some((p.batch, p.position, p.offset_delta, p.reason)))),
    }
}

/// xxh3-128 of each key `data[starts[i]..ends[i]]`, as `n * 16` bytes (big-endian digests,
/// as `xxhash.xxh3_128_digest` gives them).
#[pyfunction]
fn digest_keys<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    starts: PyReadonlyArray1<'py, i64>,
    ends: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let bytes = data.as_bytes();
    let (s, e) = checked_spans(&starts, &ends, bytes.len(), "key span")?;
    let out = py.allow_threads(|| {
        let mut out = Vec::with_capacity(s.len() * 16);
        for (&a, &b) in s.iter().zip(e) {
            let digest = xxhash_rust::xxh3::xxh3_128(&bytes[a as usize..b as usize]);
            out.extend_from_slice(&digest.to_be_bytes());
        }
        out
    });
    Ok(out.into_pyarray(py))
}

/// Put `digests` (n * 16 bytes) with their stored offsets into the offset map's rows,
/// in order; returns how many slots were newly taken.
#[pyfunction]
fn offset_map_insert<'py>(
    py: Python<'py>,
    mut rows: PyReadwriteArray1<'py, u8>,
    mut partition_sizes: PyReadwriteArray1<'py, i64>,
    slots_per_partition: usize,
    digests: &Bound<'py, PyBytes>,
    stored: PyReadonlyArray1<'py, u32>,
) -> PyResult<usize> {
    let digests = digests.as_bytes();
    let stored = stored.as_slice()?;
    if digests.len() != stored.len() * 16 {
        return Err(PyValueError::new_err(
            "one 16-byte digest per stored offset",
        ));
    }
    let sizes = partition_sizes.as_slice_mut()?;
    let partitioned = sizes.len() > 1;
    let rows = rows.as_slice_mut()?;
    let row_size = rows.len() / (slots_per_partition * sizes.len());
    let mut table = offset_map::Table {
        rows,
        row_size,
        slots_per_partition,
        partitioned,
    };
    py.allow_threads(|| table.insert(digests, stored, sizes))
        .map_err(|i| PyValueError::new_err(format!("offset map partition full at key {i}")))
}

type SlotsFound<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<bool>>);

/// For each digest, the slot holding it and whether it was found (else the empty slot
/// that ends its probe sequence).
#[pyfunction]
fn offset_map_locate<'py>(
    py: Python<'py>,
    rows: PyReadonlyArray1<'py, u8>,
    partitions: usize,
    slots_per_partition: usize,
    digests: &Bound<'py, PyBytes>,
) -> PyResult<SlotsFound<'py>> {
    let digests = digests.as_bytes();
    let rows = rows.as_slice()?;
    let row_size = rows.len() / (slots_per_partition * partitions);
    let result = py.allow_threads(|| {
        let n = digests.len() / 16;
        let mut slots = Vec::with_capacity(n);
        let mut found = Vec::with_capacity(n);
        for (i, digest) in digests.chunks_exact(16).enumerate() {
            let ahead = i + offset_map::PREFETCH_DISTANCE;
            if let Some(next) = digests.get(ahead * 16..(ahead + 1) * 16) {
                offset_map::prefetch(rows, row_size, slots_per_partition, partitions > 1, next);
            }
            match offset_map::locate(rows, row_size, slots_per_partition, partitions > 1, digest)? {
                offset_map::Slot::Found(g) => {
                    slots.push(g as i64);
                    found.push(true);
                }
                offset_map::Slot::Empty(g) => {
                    slots.push(g as i64);
                    found.push(false);
                }
            }
        }
        Some((slots, found))
    });
    let (slots, found) =
        result.ok_or_else(|| PyValueError::new_err("offset map partition has no empty slot"))?;
    Ok((slots.into_pyarray(py), found.into_pyarray(py)))
}

/// The stored offsets of the occupied slots (the rows whose offset field is not 0), in slot
/// order: one sequential pass over the rows, where numpy needed a strided copy of every
/// slot's field, a comparison and a compress.
#[pyfunction]
fn offset_map_values<'py>(
    py: Python<'py>,
    rows: PyReadonlyArray1<'py, u8>,
    row_size: usize,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let rows = rows.as_slice()?;
    if row_size < offset_map::OFFSET_BYTES || rows.len() % row_size != 0 {
        return Err(PyValueError::new_err("rows are not a whole number of rows"));
    }
    let values = py.allow_threads(|| {
        rows.chunks_exact(row_size)
            .filter_map(|row| {
                let stored =
                    u32::from_le_bytes(row[..offset_map::OFFSET_BYTES].try_into().unwrap());
                (stored != 0).then_some(stored)
            })
            .collect::<Vec<u32>>()
    });
    Ok(values.into_pyarray(py))
}

type BytesEnds<'py> = (Bound<'py, PyBytes>, Bound<'py, PyArray1<i64>>);

/// Kept records re-encoded with new timestamp deltas: `(bytes, record ends)`.
#[pyfunction]
fn reencode_records<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    body_start: PyReadonlyArray1<'py, i64>,
    end: PyReadonlyArray1<'py, i64>,
    deltas: PyReadonlyArray1<'py, i64>,
) -> PyResult<BytesEnds<'py>> {
    let bytes = data.as_bytes();
    let (s, e) = checked_spans(&body_start, &end, bytes.len(), "record body")?;
    let d = deltas.as_slice()?;
    if d.len() != e.len() {
        return Err(PyValueError::new_err("one timestamp delta per record"));
    }
    let (out, ends) = py.allow_threads(|| batches::reencode(bytes, s, e, d));
    Ok((PyBytes::new(py, &out), ends.into_pyarray(py)))
}

/// v2 batches from header columns and their (already compressed) records sections:
/// `(bytes, batch ends)`, each batch with its CRC-32C.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn assemble_batches<'py>(
    py: Python<'py>,
    base_offset: PyReadonlyArray1<'py, i64>,
    last_offset_delta: PyReadonlyArray1<'py, i32>,
    partition_leader_epoch: PyReadonlyArray1<'py, i32>,
    attributes: PyReadonlyArray1<'py, i16>,
    base_timestamp: PyReadonlyArray1<'py, i64>,
    max_timestamp: PyReadonlyArray1<'py, i64>,
    producer_id: PyReadonlyArray1<'py, i64>,
    producer_epoch: PyReadonlyArray1<'py, i16>,
    base_sequence: PyReadonlyArray1<'py, i32>,
    records_count: PyReadonlyArray1<'py, i32>,
    sections: &Bound<'py, PyBytes>,
    bounds: PyReadonlyArray1<'py, i64>,
) -> PyResult<BytesEnds<'py>> {
    let h = batches::Headers {
        base_offset: base_offset.as_slice()?,
        last_offset_delta: last_offset_delta.as_slice()?,
        partition_leader_epoch: partition_leader_epoch.as_slice()?,
        attributes: attributes.as_slice()?,
        base_timestamp: base_timestamp.as_slice()?,
        max_timestamp: max_timestamp.as_slice()?,
        producer_id: producer_id.as_slice()?,
        producer_epoch: producer_epoch.as_slice()?,
        base_sequence: base_sequence.as_slice()?,
        records_count: records_count.as_slice()?,
    };
    let n = h.base_offset.len();
    let columns = [
        h.last_offset_delta.len(),
        h.partition_leader_epoch.len(),
        h.attributes.len(),
        h.base_timestamp.len(),
        h.max_timestamp.len(),
        h.producer_id.len(),
        h.producer_epoch.len(),
        h.base_sequence.len(),
        h.records_count.len(),
    ];
    let sections = sections.as_bytes();
    let bounds = bounds.as_slice()?;
    if columns.iter().any(|&len| len != n) || bounds.len() != n + 1 {
        return Err(PyValueError::new_err(
            "one header entry per batch and n + 1 section bounds",
        ));
    }
    if bounds.windows(2).any(|w| w[0] < 0 || w[1] < w[0])
        || bounds.last().is_some_and(|&b| b as usize > sections.len())
    {
        return Err(PyValueError::new_err(
            "section bounds lie outside the sections",
        ));
    }
    let (out, ends) = py.allow_threads(|| batches::assemble(&h, sections, bounds));
    Ok((PyBytes::new(py, &out), ends.into_pyarray(py)))
}

/// The bytes of any C-contiguous buffer (bytes, bytearray, memoryview, mmap, numpy).
///
/// The `PyBuffer` export keeps the memory alive and its size fixed (a bytearray cannot be
/// resized while exported), so the slice may be read with the GIL released.
fn contiguous(buffer: &PyBuffer<u8>) -> PyResult<&[u8]> {
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("the buffer is not contiguous"));
    }
    // SAFETY: a contiguous u8 buffer of `len_bytes()` bytes, alive while `buffer` is.
    Ok(unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) })
}

/// CRC-32C (Castagnoli, as Kafka's `Crc32C`) of `data`, continuing from `crc` (0 to start).
#[pyfunction]
#[pyo3(name = "crc32c", signature = (data, crc = 0))]
fn crc32c_of(py: Python<'_>, data: PyBuffer<u8>, crc: u32) -> PyResult<u32> {
    let bytes = contiguous(&data)?;
    Ok(py.allow_threads(|| ::crc32c::crc32c_append(crc, bytes)))
}

/// CRC-32C of each span `data[starts[i]..ends[i]]` (a v2 batch from its attributes to its
/// end: what the batch's CRC field covers), computed with the GIL released.
#[pyfunction]
fn crc32c_spans<'py>(
    py: Python<'py>,
    data: PyBuffer<u8>,
    starts: PyReadonlyArray1<'py, i64>,
    ends: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let bytes = contiguous(&data)?;
    let (s, e) = checked_spans(&starts, &ends, bytes.len(), "span")?;
    let crcs = py.allow_threads(|| {
        s.iter()
            .zip(e)
            .map(|(&a, &b)| ::crc32c::crc32c(&bytes[a as usize..b as usize]))
            .collect::<Vec<u32>>()
    });
    Ok(crcs.into_pyarray(py))
}

/// The first unreadable section of a chunk: (batch, reason, position in the section).
type SectionProblem = (usize, String, Option<usize>);
type Decompressed<'py> = (
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyArray1<i64>>>,
    Option<Bound<'py, PyArray1<i64>>>,
    Option<SectionProblem>,
);

/// Sections' starts, ends, codecs and magics.
type SectionArgs<'a> = (&'a [i64], &'a [i64], &'a [i64], &'a [i64]);

/// The per-section arguments of `decompress_sections` and `compress_sections`, checked.
fn section_args<'a>(
    data: &'a [u8],
    starts: &'a PyReadonlyArray1<'_, i64>,
    ends: &'a PyReadonlyArray1<'_, i64>,
    codec_ids: &'a PyReadonlyArray1<'_, i64>,
    magics: &'a PyReadonlyArray1<'_, i64>,
    threads: Option<usize>,
) -> PyResult<SectionArgs<'a>> {
    let (s, e) = checked_spans(starts, ends, data.len(), "section")?;
    let (c, m) = (codec_ids.as_slice()?, magics.as_slice()?);
    if c.len() != s.len() || m.len() != s.len() {
        return Err(PyValueError::new_err("one codec and one magic per section"));
    }
    if threads == Some(0) {
        return Err(PyValueError::new_err("threads must be at least 1"));
    }
    Ok((s, e, c, m))
}

/// Runs of sections for the threads: about equal input bytes each.
fn section_runs(s: &[i64], e: &[i64], threads: Option<usize>) -> Vec<std::ops::Range<usize>> {
    let lengths: Vec<usize> = s.iter().zip(e).map(|(&a, &b)| (b - a) as usize).collect();
    let total = lengths.iter().sum();
    codecs::split(
        &lengths,
        codecs::thread_count(threads, total, lengths.len()),
    )
}

/// The parts' outputs as one bytes object (copied in with the GIL released: the new object
/// is not visible to any other code yet) and each section's `(start, end)` in it.
fn join_parts<'py>(
    py: Python<'py>,
    parts: Vec<codecs::Part>,
) -> PyResult<(Bound<'py, PyBytes>, Vec<i64>, Vec<i64>)> {
    let total: usize = parts.iter().map(|p| p.out.len()).sum();
    let size = isize::try_from(total).map_err(|_| PyValueError::new_err("output too large"))?;
    // SAFETY: a new, uninitialized bytes object of `total` bytes (filled below before any
    // Python code can see it); PyBytes_AsString of a bytes object is its buffer.
    let (out, buf) = unsafe {
        let ptr = ffi::PyBytes_FromStringAndSize(std::ptr::null(), size);
        if ptr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let buf = ffi::PyBytes_AsString(ptr) as usize;
        (
            Bound::from_owned_ptr(py, ptr).downcast_into_unchecked::<PyBytes>(),
            buf,
        )
    };
    let mut starts = Vec::with_capacity(parts.iter().map(|p| p.spans.len()).sum());
    let mut ends = Vec::with_capacity(starts.capacity());
    let mut at = 0;
    for part in &parts {
        for &(a, b) in &part.spans {
            starts.push((at + a) as i64);
            ends.push((at + b) as i64);
        }
        at += part.out.len();
    }
    py.allow_threads(|| {
        let mut at = 0;
        for part in &parts {
            // SAFETY: `buf` has `total` bytes; the parts fill it exactly, in order.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    part.out.as_ptr(),
                    (buf + at) as *mut u8,
                    part.out.len(),
                )
            };
            at += part.out.len();
        }
    });
    for part in parts {
        codecs::give_scratch(part.out);
    }
    Ok((out, starts, ends))
}

/// Decompress the records sections `data[starts[i]..ends[i]]` (codec ids `codecs[i]`: 0
/// copied as is, 3 lz4, 4 zstd; batch magics `magics[i]`) into one bytes object, with the
/// GIL released and on up to `threads` threads (default: the usable cores, at most 4, one
/// per 256 KiB of input). Returns `(bytes, starts, ends, None)` with each section's span in
/// the bytes, or `(None, None, None, (batch, reason, position))` for the first section
/// Kafka's readers would reject. `max_size` bounds each section's decompressed size.
#[pyfunction]
#[pyo3(signature = (data, starts, ends, codecs, magics, max_size = None, threads = None))]
#[allow(clippy::too_many_arguments)]
fn decompress_sections<'py>(
    py: Python<'py>,
    data: PyBuffer<u8>,
    starts: PyReadonlyArray1<'py, i64>,
    ends: PyReadonlyArray1<'py, i64>,
    codecs: PyReadonlyArray1<'py, i64>,
    magics: PyReadonlyArray1<'py, i64>,
    max_size: Option<usize>,
    threads: Option<usize>,
) -> PyResult<Decompressed<'py>> {
    let bytes = contiguous(&data)?;
    let (s, e, c, m) = section_args(bytes, &starts, &ends, &codecs, &magics, threads)?;
    let result = py.allow_threads(|| {
        let runs = section_runs(s, e, threads);
        codecs::run_parts(&runs, |run| {
            codecs::decompress_run(bytes, s, e, c, m, max_size, run)
        })
    });
    match result {
        Ok(parts) => {
            let (out, starts, ends) = join_parts(py, parts)?;
            Ok((
                Some(out),
                Some(starts.into_pyarray(py)),
                Some(ends.into_pyarray(py)),
                None,
            ))
        }
        Err(p) => Ok((
            None,
            None,
            None,
            Some((p.batch, p.corrupt.reason, p.corrupt.position)),
        )),
    }
}

/// Compress the sections `data[starts[i]..ends[i]]` with codec ids `codecs[i]` (0 copied as
/// is, 3 lz4, 4 zstd) as Kafka's writers would, into one bytes object, with the GIL released
/// and on up to `threads` threads (default as for `decompress_sections`). Returns the bytes
/// and the n + 1 bounds of the compressed sections in them.
#[pyfunction]
#[pyo3(signature = (data, starts, ends, codecs, magics, threads = None))]
fn compress_sections<'py>(
    py: Python<'py>,
    data: PyBuffer<u8>,
    starts: PyReadonlyArray1<'py, i64>,
    ends: PyReadonlyArray1<'py, i64>,
    codecs: PyReadonlyArray1<'py, i64>,
    magics: PyReadonlyArray1<'py, i64>,
    threads: Option<usize>,
) -> PyResult<BytesEnds<'py>> {
    let bytes = contiguous(&data)?;
    let (s, e, c, m) = section_args(bytes, &starts, &ends, &codecs, &magics, threads)?;
    if let Some(bad) = c
        .iter()
        .find(|&&id| ![codecs::NONE, codecs::LZ4, codecs::ZSTD].contains(&id))
    {
        return Err(PyValueError::new_err(format!(
            "codec {bad} is not compressed in the compiled core (0, 3 and 4 are)"
        )));
    }
    let parts = py
        .allow_threads(|| {
            let runs = section_runs(s, e, threads);
            codecs::run_parts(&runs, |run| {
                Ok(codecs::compress_run(bytes, s, e, c, m, run))
            })
        })
        .unwrap_or_else(|_: codecs::Problem| unreachable!("compression does not fail"));
    let (out, starts, ends) = join_parts(py, parts)?;
    let mut bounds = Vec::with_capacity(ends.len() + 1);
    bounds.push(starts.first().copied().unwrap_or(0));
    bounds.extend(ends);
    Ok((out, bounds.into_pyarray(py)))
}

type OneSection<'py> = (Option<Bound<'py, PyBytes>>, Option<(String, Option<usize>)>);

/// One section decompressed: `(bytes, None)` or `(None, (reason, position))`.
#[pyfunction]
#[pyo3(signature = (codec, data, max_size = None, magic = 2))]
fn decompress_section<'py>(
    py: Python<'py>,
    codec: i64,
    data: PyBuffer<u8>,
    max_size: Option<usize>,
    magic: i64,
) -> PyResult<OneSection<'py>> {
    let bytes = contiguous(&data)?;
    let result = py.allow_threads(|| {
        codecs::with_dctx(|dctx| {
            let mut out = codecs::take_scratch(bytes.len().saturating_mul(4));
            let result = codecs::decompress_into(&mut out, codec, magic, bytes, max_size, dctx);
            (out, result)
        })
    });
    let (out, result) = result;
    let answer = match result {
        Ok(()) => (Some(PyBytes::new(py, &out)), None),
        Err(c) => (None, Some((c.reason, c.position))),
    };
    codecs::give_scratch(out);
    Ok(answer)
}

/// One section compressed as Kafka's writer for `codec` (3 lz4, 4 zstd) writes it; for lz4,
/// magic 0 writes the broken header checksum of v0 wrappers.
#[pyfunction]
#[pyo3(signature = (codec, data, magic = 2))]
fn compress_section<'py>(
    py: Python<'py>,
    codec: i64,
    data: PyBuffer<u8>,
    magic: i64,
) -> PyResult<Bound<'py, PyBytes>> {
    if codec != codecs::LZ4 && codec != codecs::ZSTD {
        return Err(PyValueError::new_err(format!(
            "codec {codec} is not compressed in the compiled core (3 and 4 are)"
        )));
    }
    let bytes = contiguous(&data)?;
    let out = py.allow_threads(|| {
        codecs::with_cctx(|cctx| {
            let mut out = codecs::take_scratch(bytes.len() / 2 + 64);
            codecs::compress_into(&mut out, codec, magic, bytes, cctx);
            out
        })
    });
    let answer = PyBytes::new(py, &out);
    codecs::give_scratch(out);
    Ok(answer)
}

/// The LZ4 frame descriptor Kafka writes for a batch of `magic` (7 bytes).
#[pyfunction]
fn lz4_header(py: Python<'_>, magic: i64) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &codecs::lz4_header(magic))
}

/// The versions of the C libraries behind lz4 and zstd: `(liblz4, libzstd)`.
#[pyfunction]
fn codec_library_versions() -> (String, String) {
    codecs::library_versions()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reencode_records, m)?)?;
    m.add_function(wrap_pyfunction!(assemble_batches, m)?)?;
    m.add_function(wrap_pyfunction!(offset_map_insert, m)?)?;
    m.add_function(wrap_pyfunction!(offset_map_locate, m)?)?;
    m.add_function(wrap_pyfunction!(offset_map_values, m)?)?;
    m.add_function(wrap_pyfunction!(decode_records, m)?)?;
    m.add_function(wrap_pyfunction!(digest_keys, m)?)?;
    m.add_function(wrap_pyfunction!(crc32c_of, m)?)?;
    m.add_function(wrap_pyfunction!(crc32c_spans, m)?)?;
    m.add_function(wrap_pyfunction!(decompress_sections, m)?)?;
    m.add_function(wrap_pyfunction!(compress_sections, m)?)?;
    m.add_function(wrap_pyfunction!(decompress_section, m)?)?;
    m.add_function(wrap_pyfunction!(compress_section, m)?)?;
    m.add_function(wrap_pyfunction!(lz4_header, m)?)?;
    m.add_function(wrap_pyfunction!(codec_library_versions, m)?)?;
    Ok(())
}
