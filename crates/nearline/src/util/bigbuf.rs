//! Large build buffers in their own anonymous mappings.
//!
//! A build allocates a few buffers of many megabytes per phase (a shard's
//! vectors and graph, the merged adjacency, the k-means and PQ training
//! samples, the PQ codes) and frees them when the phase ends. Through glibc's
//! `malloc` such buffers do not reliably go back to the kernel: after the
//! first large free, glibc raises its mmap threshold (up to 32 MiB), so the
//! next buffers of that size come from a per-thread arena, and freed arena
//! memory stays resident. Measured on a 120k × 64 sharded build under a
//! 48 MB budget, this kept the peak 7 MB above the planned one, and left
//! 38 MB resident after the build had returned.
//!
//! [`BigBuf`] gives each large buffer its own mapping, which is unmapped when
//! the buffer drops, and lets [`BigBuf::truncate`] hand the pages past the
//! new end back at once. Small buffers stay ordinary heap vectors.

use bytemuck::Pod;
use memmap2::{MmapMut, UncheckedAdvice};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// Buffers at least this large get their own mapping.
pub const BIG_MIN_BYTES: usize = 1 << 20;

const PAGE: usize = 4096;

/// A fixed-length, zero-initialised buffer of `T`, in its own anonymous
/// mapping when it is large (see the module documentation).
pub struct BigBuf<T: Pod> {
    store: Store<T>,
    len: usize,
}

enum Store<T> {
    Heap(Vec<T>),
    Map(MmapMut, PhantomData<T>),
}

impl<T: Pod> BigBuf<T> {
    /// `len` zero elements.
    pub fn zeroed(len: usize) -> Self {
        let size = std::mem::size_of::<T>();
        let bytes = len.saturating_mul(size);
        // Zero-sized types and over-aligned types (a page is aligned enough
        // for every element type the engine stores) stay on the heap.
        if size == 0 || bytes < BIG_MIN_BYTES || std::mem::align_of::<T>() > PAGE {
            return BigBuf {
                store: Store::Heap(vec![T::zeroed(); len]),
                len,
            };
        }
        match MmapMut::map_anon(bytes) {
            Ok(map) => BigBuf {
                store: Store::Map(map, PhantomData),
                len,
            },
            // No mapping to be had: the heap (which aborts on exhaustion,
            // like every other allocation) is the same buffer.
            Err(_) => BigBuf {
                store: Store::Heap(vec![T::zeroed(); len]),
                len,
            },
        }
    }

    /// A buffer holding a copy of `src`.
    pub fn from_slice(src: &[T]) -> Self {
        let mut b = Self::zeroed(src.len());
        b.copy_from_slice(src);
        b
    }

    /// Shortens the buffer to `len` elements (no-op when it is not longer)
    /// and returns the memory past the new end: the whole pages of a mapped
    /// buffer go back to the kernel at once, a heap buffer shrinks.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        match &mut self.store {
            Store::Heap(v) => {
                v.truncate(len);
                v.shrink_to_fit();
            }
            Store::Map(map, _) => {
                let keep = (len * std::mem::size_of::<T>()).next_multiple_of(PAGE);
                let mapped = map.len();
                if keep < mapped {
                    // SAFETY: the advised range lies inside the mapping, which
                    // this buffer owns; no reference into it outlives the
                    // `&mut self` borrow, and the bytes past the new length are
                    // never read again (DONTNEED on a private anonymous
                    // mapping reads back as zero pages if they were).
                    let _ = unsafe {
                        map.unchecked_advise_range(UncheckedAdvice::DontNeed, keep, mapped - keep)
                    };
                }
            }
        }
        self.len = len;
    }

    /// Whether the buffer lives in its own mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self.store, Store::Map(..))
    }
}

impl<T: Pod> Deref for BigBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.store {
            Store::Heap(v) => v,
            Store::Map(m, _) => bytemuck::cast_slice(&m[..self.len * std::mem::size_of::<T>()]),
        }
    }
}

impl<T: Pod> DerefMut for BigBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let len = self.len;
        match &mut self.store {
            Store::Heap(v) => v,
            Store::Map(m, _) => bytemuck::cast_slice_mut(&mut m[..len * std::mem::size_of::<T>()]),
        }
    }
}

impl<T: Pod> Clone for BigBuf<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl<T: Pod + PartialEq> PartialEq for BigBuf<T> {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl<T: Pod> std::fmt::Debug for BigBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigBuf")
            .field("len", &self.len)
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_stay_on_the_heap_and_large_ones_are_mapped() {
        let s: BigBuf<u32> = BigBuf::zeroed(10);
        assert!(!s.is_mapped());
        assert_eq!(&s[..], &[0u32; 10]);
        let mut b: BigBuf<u32> = BigBuf::zeroed(BIG_MIN_BYTES / 4 + 3);
        assert!(b.is_mapped());
        assert_eq!(b.len(), BIG_MIN_BYTES / 4 + 3);
        assert!(b.iter().all(|&x| x == 0));
        let n = b.len();
        b[0] = 1;
        b[n - 1] = 9;
        assert_eq!((b[0], b[n - 1]), (1, 9));
        let c = b.clone();
        assert_eq!(c, b);
        assert!(c.is_mapped());
        assert_eq!(BigBuf::<f32>::zeroed(0).len(), 0);
    }

    #[test]
    fn truncate_keeps_the_head_and_both_kinds_agree() {
        for len in [100usize, 3 * BIG_MIN_BYTES / 4] {
            let mut b: BigBuf<u32> = BigBuf::zeroed(len);
            for (i, x) in b.iter_mut().enumerate() {
                *x = i as u32;
            }
            b.truncate(len / 3 + 1);
            assert_eq!(b.len(), len / 3 + 1);
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as u32));
            b.truncate(len); // growing is not truncating
            assert_eq!(b.len(), len / 3 + 1);
        }
    }
}
