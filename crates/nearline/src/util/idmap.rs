//! Hash maps keyed by node id, with a fast multiplicative hasher.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A multiplicative hasher for u32 node ids (SipHash is needlessly slow here).
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        // hashbrown takes its 7-bit tags from the top bits and the bucket from
        // the low bits: both halves must be mixed.
        let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

/// A hash map keyed by node id.
pub type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod hasher_tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn id_hash_mixes_top_and_low_bits() {
        let b = BuildHasherDefault::<IdHasher>::default();
        let tags: std::collections::HashSet<u64> =
            (0u32..4096).map(|i| b.hash_one(i) >> 57).collect();
        assert!(
            tags.len() > 100,
            "top 7 bits must vary: {} distinct",
            tags.len()
        );
        let lows: std::collections::HashSet<u64> =
            (0u32..4096).map(|i| b.hash_one(i * 1024) & 1023).collect();
        assert!(
            lows.len() > 500,
            "low bits must vary for strided ids: {}",
            lows.len()
        );
    }
}
