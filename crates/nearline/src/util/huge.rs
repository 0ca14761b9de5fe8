//! Byte tables the search reads at random, kept in transparent huge pages.
//!
//! The PQ codes of a large index are read at scattered rows, a few dozen per
//! expanded node. With 4 KiB pages nearly every such read also misses the
//! TLB (32 MB of codes span 8,192 pages, far more than the TLB holds), and
//! the page walk costs about as much as the cache miss itself. Backing the
//! table with 2 MiB pages removes most of those walks: on the 1M × 128
//! benchmark index it cut the search's CPU time per query by ~17%.
//!
//! Huge pages are only a request (`MADV_HUGEPAGE`, honoured when the
//! system's transparent-huge-page mode is `always` or `madvise`); without
//! them the table works the same, on small pages.

use memmap2::{Advice, MmapMut, MmapOptions};
use std::io::Read;
use std::ops::{Deref, DerefMut};

/// The huge-page size on x86_64 and most aarch64 kernels.
pub const HUGE_PAGE: usize = 2 << 20;

/// Tables smaller than this stay on the heap: rounding them up to whole
/// huge pages would waste more than the TLB misses they cost.
pub const HUGE_MIN_BYTES: usize = 16 << 20;

/// A zero-initialised byte table, in huge pages when it is large.
pub struct HugeBytes {
    store: Store,
    len: usize,
}

enum Store {
    Heap(Vec<u8>),
    /// An anonymous mapping and the offset of its first 2 MiB boundary,
    /// where the table starts.
    Map(MmapMut, usize),
}

impl HugeBytes {
    /// A table of `len` zero bytes.
    pub fn zeroed(len: usize) -> std::io::Result<Self> {
        if len < HUGE_MIN_BYTES {
            return Ok(HugeBytes {
                store: Store::Heap(vec![0; len]),
                len,
            });
        }
        Self::mapped(len, len.div_ceil(HUGE_PAGE) * HUGE_PAGE, true)
    }

    /// A table of `len` zero bytes that can [`grow`](Self::grow) by
    /// `room` bytes without moving: the mapping reserves address space for
    /// `len + room` (no memory: untouched pages never become resident, and
    /// the reservation is not charged against swap), so a table that grows
    /// never has a second copy resident beside it. Mapped whatever its size.
    pub fn growable(len: usize, room: usize) -> std::io::Result<Self> {
        let cap = len
            .checked_add(room)
            .and_then(|c| c.checked_next_multiple_of(HUGE_PAGE))
            .ok_or_else(|| std::io::Error::other("a growable table's room overflows"))?;
        Self::mapped(len, cap, false)
    }

    /// A table of `len` zero bytes at the first 2 MiB boundary of an
    /// anonymous mapping with room for `cap` bytes (a multiple of
    /// [`HUGE_PAGE`]), advised for huge pages; `reserve_swap`: the mapping
    /// is charged against swap as the kernel charges private mappings.
    fn mapped(len: usize, cap: usize, reserve_swap: bool) -> std::io::Result<Self> {
        // One huge page more than the room, so that the table can start on
        // a 2 MiB boundary; the unused head and tail are never touched, so
        // they never become resident.
        let mut o = MmapOptions::new();
        o.len(cap + HUGE_PAGE);
        if !reserve_swap {
            o.no_reserve_swap();
        }
        let map = o.map_anon()?;
        let addr = map.as_ptr() as usize;
        let start = addr.next_multiple_of(HUGE_PAGE) - addr;
        // Advice failing (a kernel without THP) leaves ordinary pages.
        let _ = map.advise_range(Advice::HugePage, start, cap);
        Ok(HugeBytes {
            store: Store::Map(map, start),
            len,
        })
    }

    /// A table filled with exactly `len` bytes from `r`.
    pub fn read_from(r: impl Read, len: usize) -> std::io::Result<Self> {
        Self::read_into(Self::zeroed(len)?, r)
    }

    /// [`HugeBytes::read_from`] into a [`growable`](Self::growable) table.
    pub fn read_growable(r: impl Read, len: usize, room: usize) -> std::io::Result<Self> {
        Self::read_into(Self::growable(len, room)?, r)
    }

    fn read_into(mut t: Self, mut r: impl Read) -> std::io::Result<Self> {
        r.read_exact(&mut t)?;
        Ok(t)
    }

    /// Bytes the table can grow to without moving.
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Heap(v) => v.len(),
            Store::Map(m, start) => m.len() - start,
        }
    }

    /// Grows the table to `len` bytes in place, the new bytes zero; false
    /// (nothing changed) when `len` is beyond [`capacity`](Self::capacity).
    /// A table never shrinks.
    pub fn grow(&mut self, len: usize) -> bool {
        if len > self.capacity() {
            return false;
        }
        // An anonymous mapping is zero-filled, and bytes past `len` were
        // never handed out, so they are still zero.
        self.len = self.len.max(len);
        true
    }

    /// Bytes of memory the table can occupy: its length, rounded up to whole
    /// huge pages when it lives in them.
    pub fn memory_bytes(&self) -> usize {
        match &self.store {
            Store::Heap(v) => v.capacity(),
            Store::Map(..) => self.len.div_ceil(HUGE_PAGE) * HUGE_PAGE,
        }
    }

    /// Whether the table lives in a mapping advised for huge pages.
    pub fn is_mapped(&self) -> bool {
        matches!(self.store, Store::Map(..))
    }
}

impl Deref for HugeBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.store {
            Store::Heap(v) => v,
            Store::Map(m, start) => &m[*start..*start + self.len],
        }
    }
}

impl DerefMut for HugeBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.store {
            Store::Heap(v) => v,
            Store::Map(m, start) => &mut m[*start..*start + self.len],
        }
    }
}

impl std::fmt::Debug for HugeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeBytes")
            .field("len", &self.len)
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tables_stay_on_the_heap() {
        let t = HugeBytes::zeroed(1000).unwrap();
        assert!(!t.is_mapped());
        assert_eq!(t.len(), 1000);
        assert!(t.iter().all(|&b| b == 0));
        assert_eq!(HugeBytes::zeroed(0).unwrap().len(), 0);
    }

    #[test]
    fn large_tables_start_on_a_huge_page_boundary() {
        let len = HUGE_MIN_BYTES + 12345;
        let mut t = HugeBytes::zeroed(len).unwrap();
        assert!(t.is_mapped());
        assert_eq!(t.len(), len);
        assert_eq!(t.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(t.memory_bytes(), len.div_ceil(HUGE_PAGE) * HUGE_PAGE);
        assert!(t.iter().all(|&b| b == 0));
        t[len - 1] = 7;
        t[0] = 3;
        assert_eq!((t[0], t[len - 1]), (3, 7));
    }

    #[test]
    fn a_growable_table_grows_in_place_and_keeps_its_bytes() {
        let src: Vec<u8> = (0..5000).map(|i| (i % 253) as u8).collect();
        let mut t = HugeBytes::read_growable(&src[..], src.len(), 3 * HUGE_PAGE).unwrap();
        assert!(t.is_mapped(), "mapped whatever its size");
        assert_eq!(t.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(&t[..], &src[..]);
        assert!(t.capacity() >= src.len() + 3 * HUGE_PAGE);
        let at = t.as_ptr();
        for len in [6000, HUGE_PAGE, 2 * HUGE_PAGE + 17, t.capacity()] {
            assert!(t.grow(len));
            assert_eq!(t.len(), len);
            assert_eq!(t.as_ptr(), at, "grew without moving");
            assert_eq!(&t[..src.len()], &src[..]);
            assert!(t[src.len()..].iter().all(|&b| b == 0));
            assert_eq!(t.memory_bytes(), len.div_ceil(HUGE_PAGE) * HUGE_PAGE);
        }
        let cap = t.capacity();
        assert!(!t.grow(cap + 1), "beyond the room");
        assert_eq!(t.len(), cap);
        assert!(t.grow(10), "a smaller length leaves the table as it is");
        assert_eq!(t.len(), cap);
        let last = t.len() - 1;
        t[last] = 9;
        assert_eq!(t[last], 9);
    }

    #[test]
    fn read_from_fills_exactly_and_rejects_short_input() {
        let src: Vec<u8> = (0..HUGE_MIN_BYTES + 99).map(|i| (i % 251) as u8).collect();
        let t = HugeBytes::read_from(&src[..], src.len()).unwrap();
        assert_eq!(&t[..], &src[..]);
        let small = HugeBytes::read_from(&src[..100], 100).unwrap();
        assert_eq!(&small[..], &src[..100]);
        let short = HugeBytes::read_from(&src[..10], 11).unwrap_err();
        assert_eq!(short.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
