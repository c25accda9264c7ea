//! Records of v2 batches decoded to columns (Kafka's `DefaultRecord.readFrom`, for every
//! record of every batch of a chunk in one pass), with the same structural checks.

use crate::varint::{read, MAX_VARINT_BYTES, MAX_VARLONG_BYTES};

const MIN_HEADER_SIZE: i64 = 2;

/// One column per record field; positions index the decoded buffer.
#[derive(Default)]
pub struct Columns {
    pub batch: Vec<i64>,
    pub start: Vec<i64>,
    pub end: Vec<i64>,
    pub timestamp_delta: Vec<i64>,
    pub body_start: Vec<i64>,
    pub offset_delta: Vec<i64>,
    pub key_start: Vec<i64>,
    pub key_length: Vec<i64>,
    pub value_start: Vec<i64>,
    pub value_length: Vec<i64>,
    pub headers_count: Vec<i64>,
    pub headers_start: Vec<i64>,
}

/// The first structural problem: the batch, the byte position (in the decoded buffer)
/// of the record or of what was left over, the record's offset delta when known, and why.
pub struct Problem {
    pub batch: usize,
    pub position: i64,
    pub offset_delta: Option<i64>,
    pub reason: String,
}

fn problem(
    batch: usize,
    position: usize,
    offset_delta: Option<i64>,
    reason: impl Into<String>,
) -> Problem {
    Problem {
        batch,
        position: position as i64,
        offset_delta,
        reason: reason.into(),
    }
}

/// Decode `counts[b]` records in `data[sec_start[b]..sec_end[b]]` for each batch `b`.
pub fn decode(
    data: &[u8],
    sec_start: &[i64],
    sec_end: &[i64],
    counts: &[i64],
) -> Result<Columns, Problem> {
    let total: usize = counts.iter().map(|&c| c.max(0) as usize).sum();
    let mut c = Columns::default();
    for column in [
        &mut c.batch,
        &mut c.start,
        &mut c.end,
        &mut c.timestamp_delta,
        &mut c.body_start,
        &mut c.offset_delta,
        &mut c.key_start,
        &mut c.key_length,
        &mut c.value_start,
        &mut c.value_length,
        &mut c.headers_count,
        &mut c.headers_start,
    ] {
        column.reserve_exact(total);
    }
    for b in 0..counts.len() {
        let limit = sec_end[b] as usize;
        if limit > data.len() {
            return Err(problem(
                b,
                sec_start[b] as usize,
                None,
                "records section extends beyond the buffer",
            ));
        }
        let mut pos = sec_start[b] as usize;
        for _ in 0..counts[b] {
            pos = record(data, pos, limit, b, &mut c)?;
        }
        if pos != limit {
            return Err(problem(
                b,
                pos,
                None,
                format!(
                    "incorrect declared batch size, {} bytes remain after {} records",
                    limit - pos,
                    counts[b]
                ),
            ));
        }
    }
    Ok(c)
}

/// One record at `start`; returns the position after it.
fn record(
    data: &[u8],
    start: usize,
    limit: usize,
    b: usize,
    c: &mut Columns,
) -> Result<usize, Problem> {
    let (length, size) = match read(data, start, limit, MAX_VARINT_BYTES) {
        Some(v) => v,
        None => {
            return Err(problem(
                b,
                start,
                None,
                "varint runs past the end of the buffer",
            ))
        }
    };
    if length < 0 {
        return Err(problem(
            b,
            start,
            None,
            format!("invalid negative record length {length}"),
        ));
    }
    let end = start + size + length as usize;
    if end > limit {
        return Err(problem(
            b,
            start,
            None,
            format!("record of {length} bytes extends beyond its batch"),
        ));
    }
    // Attributes: one byte, no bits defined, ignored as Kafka does.
    let mut p = start + size + 1;
    let field = |p: usize, max: usize, reason: &str| {
        read(data, p, end, max).ok_or_else(|| reason.to_string())
    };
    let fail = |od: Option<i64>, reason: String| problem(b, start, od, reason);
    let (ts_delta, n) = field(p, MAX_VARLONG_BYTES, "timestamp delta varlong is too long")
        .map_err(|r| fail(None, r))?;
    p += n;
    let body_start = p;
    let (offset_delta, n) =
        field(p, MAX_VARINT_BYTES, "offset delta varint is too long").map_err(|r| fail(None, r))?;
    p += n;
    let od = Some(offset_delta);
    let (key_length, n) =
        field(p, MAX_VARINT_BYTES, "invalid key length").map_err(|r| fail(od, r))?;
    if key_length < -1 {
        return Err(fail(od, "invalid key length".into()));
    }
    p += n;
    let key_start = p;
    p += key_length.max(0) as usize;
    if p > end {
        return Err(fail(od, "key extends beyond the record".into()));
    }
    let (value_length, n) =
        field(p, MAX_VARINT_BYTES, "invalid value length").map_err(|r| fail(od, r))?;
    if value_length < -1 {
        return Err(fail(od, "invalid value length".into()));
    }
    p += n;
    let value_start = p;
    p += value_length.max(0) as usize;
    if p > end {
        return Err(fail(od, "value extends beyond the record".into()));
    }
    let (headers_count, n) =
        field(p, MAX_VARINT_BYTES, "invalid header count").map_err(|r| fail(od, r))?;
    p += n;
    if headers_count < 0 || headers_count * MIN_HEADER_SIZE > end as i64 - p as i64 {
        return Err(fail(od, "invalid header count".into()));
    }
    let headers_start = p;
    for _ in 0..headers_count {
        p = header(data, p, end).ok_or_else(|| {
            fail(
                od,
                "invalid record size: the fields do not add up to the declared length".into(),
            )
        })?;
    }
    if p != end {
        return Err(fail(
            od,
            "invalid record size: the fields do not add up to the declared length".into(),
        ));
    }
    c.batch.push(b as i64);
    c.start.push(start as i64);
    c.end.push(end as i64);
    c.timestamp_delta.push(ts_delta);
    c.body_start.push(body_start as i64);
    c.offset_delta.push(offset_delta);
    c.key_start.push(key_start as i64);
    c.key_length.push(key_length);
    c.value_start.push(value_start as i64);
    c.value_length.push(value_length);
    c.headers_count.push(headers_count);
    c.headers_start.push(headers_start as i64);
    Ok(end)
}

/// Skip one header (key length, key, value length, value); None when it does not fit.
fn header(data: &[u8], p: usize, end: usize) -> Option<usize> {
    let (klen, n) = read(data, p, end, MAX_VARINT_BYTES)?;
    if klen < 0 {
        return None;
    }
    let q = p + n + klen as usize;
    let (vlen, n) = read(data, q, end, MAX_VARINT_BYTES)?;
    if vlen < -1 {
        return None;
    }
    let q = q + n + vlen.max(0) as usize;
    (q <= end).then_some(q)
}
