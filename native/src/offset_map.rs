//! The offset map's open-addressing table (`cleaner/engine/offset_map.py` owns the
//! memory and Kafka's put rules; this is its probe loop).
//!
//! One row per slot, so that a probe touches one cache line: the stored offset (u32,
//! little-endian: the round-relative offset plus one, 0 = empty), then the digest's
//! bytes 1..16; when the table is not partitioned, byte 0 follows (partitioned, byte 0
//! chose the partition and is implied). Double hashing within the partition: the probe
//! starts at `a % s` and steps by `b % (s - 1) + 1` over a prime `s` slots (`a`, `b`:
//! the big-endian u64 and u32 at digest bytes 1 and 9), so it visits every slot.

pub const OFFSET_BYTES: usize = 4;

pub struct Table<'t> {
    pub rows: &'t mut [u8],
    pub row_size: usize,
    pub slots_per_partition: usize,
    pub partitioned: bool,
}

pub enum Slot {
    Found(usize),
    Empty(usize),
}

#[inline]
fn stored_offset(rows: &[u8], row_size: usize, g: usize) -> u32 {
    let at = g * row_size;
    u32::from_le_bytes(rows[at..at + OFFSET_BYTES].try_into().unwrap())
}

/// The slot of `digest`: where it is, or the first empty slot of its probe sequence;
/// None only if its partition has no empty slot left (the map's reserved free slot per
/// partition makes that impossible while its put rules are kept).
pub fn locate(
    rows: &[u8],
    row_size: usize,
    s: usize,
    partitioned: bool,
    digest: &[u8],
) -> Option<Slot> {
    let a = u64::from_be_bytes(digest[1..9].try_into().unwrap());
    let b = u32::from_be_bytes(digest[9..13].try_into().unwrap());
    let origin = if partitioned {
        digest[0] as usize * s
    } else {
        0
    };
    let mut pos = (a % s as u64) as usize;
    let step = if s > 2 { (b as usize % (s - 1)) + 1 } else { 1 };
    for _ in 0..s {
        let g = origin + pos;
        if stored_offset(rows, row_size, g) == 0 {
            return Some(Slot::Empty(g));
        }
        let at = g * row_size + OFFSET_BYTES;
        let same =
            rows[at..at + 15] == digest[1..16] && (partitioned || rows[at + 15] == digest[0]);
        if same {
            return Some(Slot::Found(g));
        }
        pos = (pos + step) % s;
    }
    None
}

impl Table<'_> {
    /// Put each digest with its stored offset, in order (a later offset of the same key
    /// replaces an earlier one). Returns how many slots were newly taken, or the index of
    /// a digest whose partition had no empty slot.
    pub fn insert(
        &mut self,
        digests: &[u8],
        stored: &[u32],
        partition_sizes: &mut [i64],
    ) -> Result<usize, usize> {
        let (r, s) = (self.row_size, self.slots_per_partition);
        let mut taken = 0;
        for (i, digest) in digests.chunks_exact(16).enumerate() {
            match locate(self.rows, r, s, self.partitioned, digest) {
                Some(Slot::Found(g)) => {
                    let at = g * r;
                    let current = stored_offset(self.rows, r, g);
                    self.rows[at..at + OFFSET_BYTES]
                        .copy_from_slice(&current.max(stored[i]).to_le_bytes());
                }
                Some(Slot::Empty(g)) => {
                    let at = g * r;
                    self.rows[at..at + OFFSET_BYTES].copy_from_slice(&stored[i].to_le_bytes());
                    self.rows[at + OFFSET_BYTES..at + OFFSET_BYTES + 15]
                        .copy_from_slice(&digest[1..16]);
                    if !self.partitioned {
                        self.rows[at + OFFSET_BYTES + 15] = digest[0];
                    }
                    partition_sizes[if self.partitioned {
                        digest[0] as usize
                    } else {
                        0
                    }] += 1;
                    taken += 1;
                }
                None => return Err(i),
            }
        }
        Ok(taken)
    }
}
