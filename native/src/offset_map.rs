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

/// How many digests ahead the probe loops ask the CPU for a digest's first row. The
/// table is far larger than the caches, so each put or lookup is a cache (and TLB) miss;
/// with the rows of the next 16 digests already on their way, the misses overlap
/// instead of being paid one after another.
pub const PREFETCH_DISTANCE: usize = 16;

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

/// The first slot of `digest`'s probe sequence: `(origin of its partition, position)`.
#[inline]
fn probe_start(s: usize, partitioned: bool, digest: &[u8]) -> (usize, usize) {
    let a = u64::from_be_bytes(digest[1..9].try_into().unwrap());
    let origin = if partitioned {
        digest[0] as usize * s
    } else {
        0
    };
    (origin, (a % s as u64) as usize)
}

/// A hint to the CPU to load the first row of `digest`'s probe sequence into the caches
/// (a no-op where the target has no prefetch instruction). It changes nothing a probe
/// reads: only when the bytes arrive.
#[inline]
pub fn prefetch(rows: &[u8], row_size: usize, s: usize, partitioned: bool, digest: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let (origin, pos) = probe_start(s, partitioned, digest);
        if let Some(row) = rows.get((origin + pos) * row_size..) {
            // SAFETY: prefetching never faults and reads nothing; the pointer is in bounds.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    row.as_ptr().cast(),
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, row_size, s, partitioned, digest);
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
    let b = u32::from_be_bytes(digest[9..13].try_into().unwrap());
    let (origin, mut pos) = probe_start(s, partitioned, digest);
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
            if let Some(ahead) =
                digests.get((i + PREFETCH_DISTANCE) * 16..(i + PREFETCH_DISTANCE + 1) * 16)
            {
                prefetch(self.rows, r, s, self.partitioned, ahead);
            }
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
