//! Kafka's zigzag varints (`ByteUtils.readVarint` / `readVarlong`), bounded by the
//! buffer: a varint that runs past `limit` or is longer than `max_bytes` is `None`.

/// Decode the zigzag varint at `pos`; returns (value, size in bytes).
///
/// The value is accumulated as a 64-bit pattern (the tenth byte of a varlong only
/// contributes its lowest bit), then zigzag-decoded, exactly as the numpy reference in
/// `tests/records/reference_columns.py` does.
#[inline]
pub fn read(buf: &[u8], pos: usize, limit: usize, max_bytes: usize) -> Option<(i64, usize)> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    for i in 0..max_bytes {
        let p = pos + i;
        if p >= limit {
            return None;
        }
        let b = buf[p] as u64;
        if shift >= 63 {
            value |= (b & 0x01) << 63;
        } else {
            value |= (b & 0x7f) << shift;
        }
        if b < 0x80 {
            let decoded = ((value >> 1) as i64) ^ -((value & 1) as i64);
            return Some((decoded, i + 1));
        }
        shift += 7;
    }
    None
}

pub const MAX_VARINT_BYTES: usize = 5;
pub const MAX_VARLONG_BYTES: usize = 10;
