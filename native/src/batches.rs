//! Writing v2 batches (Kafka's `MemoryRecordsBuilder` for the cleaner's rewrites): each
//! kept record as `length | attributes 0 | timestampDelta | body` with the body (offset
//! delta .. headers) copied byte for byte, and each batch as its 61-byte header, records
//! section and CRC-32C. Sections arrive here already compressed (lz4 and zstd by
//! `codecs.rs`, gzip and snappy in Python).

pub const RECORD_BATCH_OVERHEAD: usize = 61;
const LOG_OVERHEAD: usize = 12;
const ATTRIBUTES_OFFSET: usize = 21;
const CRC_OFFSET: usize = 17;
const MAGIC_V2: u8 = 2;

fn put_varint(out: &mut Vec<u8>, value: i64) {
    let mut u = ((value << 1) ^ (value >> 63)) as u64;
    while u >= 0x80 {
        out.push((u as u8 & 0x7f) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

fn varint_size(value: i64) -> usize {
    let u = ((value << 1) ^ (value >> 63)) as u64;
    (64 - u.leading_zeros()).max(1).div_ceil(7) as usize
}

/// The records `body_start[i]..end[i]` of `data`, each re-encoded with timestamp delta
/// `deltas[i]`; returns the bytes and where each record ends in them.
pub fn reencode(
    data: &[u8],
    body_start: &[i64],
    end: &[i64],
    deltas: &[i64],
) -> (Vec<u8>, Vec<i64>) {
    let total: usize = body_start
        .iter()
        .zip(end)
        .map(|(&s, &e)| (e - s) as usize + 16)
        .sum();
    let mut out = Vec::with_capacity(total);
    let mut ends = Vec::with_capacity(end.len());
    for ((&s, &e), &delta) in body_start.iter().zip(end).zip(deltas) {
        let body = &data[s as usize..e as usize];
        let length = 1 + varint_size(delta) + body.len();
        put_varint(&mut out, length as i64);
        out.push(0);
        put_varint(&mut out, delta);
        out.extend_from_slice(body);
        ends.push(out.len() as i64);
    }
    (out, ends)
}

/// Header fields of the batches to write, one entry per batch.
pub struct Headers<'a> {
    pub base_offset: &'a [i64],
    pub last_offset_delta: &'a [i32],
    pub partition_leader_epoch: &'a [i32],
    pub attributes: &'a [i16],
    pub base_timestamp: &'a [i64],
    pub max_timestamp: &'a [i64],
    pub producer_id: &'a [i64],
    pub producer_epoch: &'a [i16],
    pub base_sequence: &'a [i32],
    pub records_count: &'a [i32],
}

/// Every batch: header, `sections[bounds[j]..bounds[j + 1]]`, CRC-32C over attributes..end.
pub fn assemble(h: &Headers, sections: &[u8], bounds: &[i64]) -> (Vec<u8>, Vec<i64>) {
    let n = h.base_offset.len();
    let mut out = Vec::with_capacity(sections.len() + n * RECORD_BATCH_OVERHEAD);
    let mut ends = Vec::with_capacity(n);
    for j in 0..n {
        let section = &sections[bounds[j] as usize..bounds[j + 1] as usize];
        let start = out.len();
        out.extend_from_slice(&h.base_offset[j].to_be_bytes());
        out.extend_from_slice(
            &((RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + section.len()) as i32).to_be_bytes(),
        );
        out.extend_from_slice(&h.partition_leader_epoch[j].to_be_bytes());
        out.push(MAGIC_V2);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&h.attributes[j].to_be_bytes());
        out.extend_from_slice(&h.last_offset_delta[j].to_be_bytes());
        out.extend_from_slice(&h.base_timestamp[j].to_be_bytes());
        out.extend_from_slice(&h.max_timestamp[j].to_be_bytes());
        out.extend_from_slice(&h.producer_id[j].to_be_bytes());
        out.extend_from_slice(&h.producer_epoch[j].to_be_bytes());
        out.extend_from_slice(&h.base_sequence[j].to_be_bytes());
        out.extend_from_slice(&h.records_count[j].to_be_bytes());
        out.extend_from_slice(section);
        let crc = crc32c::crc32c(&out[start + ATTRIBUTES_OFFSET..]);
        out[start + CRC_OFFSET..start + CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        ends.push(out.len() as i64);
    }
    (out, ends)
}
