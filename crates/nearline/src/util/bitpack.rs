//! Fixed-width bit packing of node ids: `bits` bits per id, least
//! significant first, so an adjacency list of an index of `n` nodes takes
//! `⌈len · bits / 8⌉` bytes instead of `4 · len` (17 bits at 100k nodes,
//! 20 at 1M: 53–63% of the plain list). A reader takes any id with one
//! unaligned 8-byte load, which needs [`PAD`] readable bytes after a list's
//! last byte.

/// Readable bytes a packed buffer keeps after its last list.
pub const PAD: usize = 8;

/// Bits per id for an index of `n` nodes: enough for `n − 1`, at least 8
/// (a list's byte length then gives its length back: the rounding adds
/// fewer bits than one id) and at most 32.
pub fn bits_for(n: usize) -> u32 {
    let top = n.saturating_sub(1) as u64;
    (64 - top.leading_zeros()).clamp(8, 32)
}

/// Bytes of `len` ids packed at `bits` bits.
#[inline]
pub fn packed_len(len: usize, bits: u32) -> usize {
    (len * bits as usize).div_ceil(8)
}

/// Ids a packed list of `bytes` bytes holds at `bits` (≥ 8) bits.
#[inline]
pub fn ids_in(bytes: usize, bits: u32) -> usize {
    bytes * 8 / bits as usize
}

/// Appends `ids` packed at `bits` bits to `out`, starting at a byte
/// boundary. Every id must be below `2^bits`.
pub fn pack(ids: &[u32], bits: u32, out: &mut Vec<u8>) {
    debug_assert!((8..=32).contains(&bits));
    let mut acc: u64 = 0;
    let mut have = 0u32;
    for &id in ids {
        debug_assert!(bits == 32 || id < (1u32 << bits));
        acc |= (id as u64) << have;
        have += bits;
        while have >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            have -= 8;
        }
    }
    if have > 0 {
        out.push(acc as u8);
    }
}

/// Id `i` of a list packed at `bits` bits from the start of `bytes`, which
/// must extend [`PAD`] − 1 bytes past the list's end.
#[inline]
pub fn get(bytes: &[u8], bits: u32, i: usize) -> u32 {
    let bit = i * bits as usize;
    let at = bit / 8;
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    let mask = (1u64 << bits) - 1;
    ((u64::from_le_bytes(w) >> (bit % 8)) & mask) as u32
}

/// Unpacks `len` ids at `bits` bits from `bytes` (padded as for [`get`])
/// into `out`, replacing its contents.
#[inline]
pub fn unpack_into(bytes: &[u8], bits: u32, len: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend((0..len).map(|i| get(bytes, bits, i)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bits_cover_the_largest_id() {
        assert_eq!(bits_for(0), 8);
        assert_eq!(bits_for(1), 8);
        assert_eq!(bits_for(256), 8);
        assert_eq!(bits_for(257), 9);
        assert_eq!(bits_for(114_895), 17);
        assert_eq!(bits_for(1 << 20), 20);
        assert_eq!(bits_for((1 << 20) + 1), 21);
        assert_eq!(bits_for(usize::MAX), 32);
    }

    proptest! {
        #[test]
        fn lists_round_trip(
            n in 1usize..5_000_000,
            lists in prop::collection::vec(prop::collection::vec(any::<u32>(), 0..70), 1..8),
        ) {
            let bits = bits_for(n);
            let lists: Vec<Vec<u32>> = lists
                .into_iter()
                .map(|l| l.into_iter().map(|x| x % n as u32).collect())
                .collect();
            let mut buf = Vec::new();
            let mut starts = Vec::new();
            for l in &lists {
                starts.push(buf.len());
                pack(l, bits, &mut buf);
                prop_assert_eq!(buf.len() - starts.last().copied().unwrap_or(0), packed_len(l.len(), bits));
            }
            starts.push(buf.len());
            buf.extend_from_slice(&[0u8; PAD]);
            let mut out = Vec::new();
            for (i, l) in lists.iter().enumerate() {
                let (a, b) = (starts[i], starts[i + 1]);
                prop_assert_eq!(ids_in(b - a, bits), l.len());
                unpack_into(&buf[a..b + PAD - 1], bits, l.len(), &mut out);
                prop_assert_eq!(&out, l);
            }
        }
    }
}
