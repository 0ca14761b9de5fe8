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

impl<T: Pod> Store<T> {
    /// The first `len` elements (a heap store holds exactly `len`).
    fn slice(&self, len: usize) -> &[T] {
        match self {
            Store::Heap(v) => v,
            Store::Map(m, _) => bytemuck::cast_slice(&m[..len * std::mem::size_of::<T>()]),
        }
    }

    fn slice_mut(&mut self, len: usize) -> &mut [T] {
        match self {
            Store::Heap(v) => v,
            Store::Map(m, _) => bytemuck::cast_slice_mut(&mut m[..len * std::mem::size_of::<T>()]),
        }
    }
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
        self.store.slice(self.len)
    }
}

impl<T: Pod> DerefMut for BigBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.store.slice_mut(self.len)
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

/// A growable buffer of `T` that hands memory back when it shrinks: the
/// storage of a cache that gives up entries while a search borrows its
/// memory and takes them back afterwards. Past one page it lives in its own
/// anonymous mapping of the capacity it was created with (untouched pages
/// cost nothing), [`BigVec::truncate`] returns the whole pages past the new
/// end to the kernel at once, and growing back within the capacity touches
/// them again; growing past it moves the buffer to a larger mapping. Smaller
/// buffers are heap vectors of exact capacity.
pub struct BigVec<T: Pod> {
    store: Store<T>,
    len: usize,
    /// Elements the mapping holds (a heap buffer: its vector's capacity).
    cap: usize,
}

impl<T: Pod> BigVec<T> {
    /// An empty buffer.
    pub fn new() -> Self {
        BigVec {
            store: Store::Heap(Vec::new()),
            len: 0,
            cap: 0,
        }
    }

    /// An empty buffer with room for `cap` elements.
    pub fn with_capacity(cap: usize) -> Self {
        let size = std::mem::size_of::<T>();
        let bytes = cap.saturating_mul(size);
        if size == 0 || bytes < PAGE || std::mem::align_of::<T>() > PAGE {
            return BigVec {
                store: Store::Heap(Vec::with_capacity(cap)),
                len: 0,
                cap,
            };
        }
        match MmapMut::map_anon(bytes) {
            Ok(map) => BigVec {
                store: Store::Map(map, PhantomData),
                len: 0,
                cap,
            },
            Err(_) => BigVec {
                store: Store::Heap(Vec::with_capacity(cap)),
                len: 0,
                cap,
            },
        }
    }

    /// Makes room for `extra` more elements (a mapped buffer moves to a
    /// mapping of the larger size, a heap one grows exactly).
    fn reserve(&mut self, extra: usize) {
        let want = self.len.saturating_add(extra);
        match &mut self.store {
            Store::Heap(v) => {
                if want <= v.capacity() {
                    return;
                }
                if want.saturating_mul(std::mem::size_of::<T>()) < PAGE {
                    v.reserve_exact(want - v.len());
                    self.cap = v.capacity();
                    return;
                }
                // Past a page: into a mapping, with room to grow.
                let mut bigger = BigVec::with_capacity(want.max(v.len().saturating_mul(2)));
                bigger.extend_from_slice(v);
                *self = bigger;
            }
            Store::Map(..) => {
                if want > self.cap {
                    let mut bigger = BigVec::with_capacity(want.max(self.cap.saturating_mul(2)));
                    bigger.extend_from_slice(&self[..]);
                    *self = bigger;
                }
            }
        }
    }

    /// Appends `src`.
    pub fn extend_from_slice(&mut self, src: &[T]) {
        self.reserve(src.len());
        let (start, end) = (self.len, self.len + src.len());
        match &mut self.store {
            Store::Heap(v) => v.extend_from_slice(src),
            Store::Map(m, _) => {
                let size = std::mem::size_of::<T>();
                let dst: &mut [T] = bytemuck::cast_slice_mut(&mut m[start * size..end * size]);
                dst.copy_from_slice(src);
            }
        }
        self.len = end;
    }

    /// Grows to `len` elements, the new ones zero, or shortens as
    /// [`BigVec::truncate`] does.
    pub fn resize(&mut self, len: usize) {
        if len <= self.len {
            self.truncate(len);
            return;
        }
        self.reserve(len - self.len);
        match &mut self.store {
            Store::Heap(v) => v.resize(len, T::zeroed()),
            Store::Map(m, _) => {
                let size = std::mem::size_of::<T>();
                // Pages given back read as zeros; the part of the last kept
                // page past the old end may hold old elements.
                m[self.len * size..len * size].fill(0);
            }
        }
        self.len = len;
    }

    /// Shortens the buffer to `len` elements (no-op when it is not longer)
    /// and returns the memory past the new end: whole pages of a mapping go
    /// back to the kernel (the mapping keeps its capacity), a heap buffer
    /// shrinks to fit.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        match &mut self.store {
            Store::Heap(v) => {
                v.truncate(len);
                v.shrink_to_fit();
                self.cap = v.capacity();
            }
            Store::Map(map, _) => {
                let keep = (len * std::mem::size_of::<T>()).next_multiple_of(PAGE);
                let mapped = map.len();
                if keep < mapped {
                    // SAFETY: the advised range lies inside the mapping, which
                    // this buffer owns; no reference into it outlives the
                    // `&mut self` borrow, and the bytes past the new length
                    // are never read before they are written again (DONTNEED
                    // on a private anonymous mapping reads back as zero pages).
                    let _ = unsafe {
                        map.unchecked_advise_range(UncheckedAdvice::DontNeed, keep, mapped - keep)
                    };
                }
            }
        }
        self.len = len;
    }

    /// A heap buffer's capacity down to its length (a mapped one holds no
    /// more than its length already).
    pub fn shrink_to_fit(&mut self) {
        if let Store::Heap(v) = &mut self.store {
            v.shrink_to_fit();
            self.cap = v.capacity();
        }
    }

    /// Resident bytes: the elements of a mapping (its pages past them are
    /// given back or never touched), a heap buffer's capacity.
    pub fn memory_bytes(&self) -> usize {
        let size = std::mem::size_of::<T>();
        match &self.store {
            Store::Heap(v) => v.capacity() * size,
            Store::Map(..) => self.len * size,
        }
    }

    /// Elements it holds without growing.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Whether the buffer lives in its own mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self.store, Store::Map(..))
    }
}

impl<T: Pod> Default for BigVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Pod> Deref for BigVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.store.slice(self.len)
    }
}

impl<T: Pod> DerefMut for BigVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.store.slice_mut(self.len)
    }
}

impl<T: Pod> std::fmt::Debug for BigVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigVec")
            .field("len", &self.len)
            .field("cap", &self.cap)
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

    #[test]
    fn big_vec_shrinks_and_grows_back_within_its_mapping() {
        for cap in [100usize, 3 * PAGE] {
            let mut b: BigVec<u32> = BigVec::with_capacity(cap);
            assert_eq!(b.is_mapped(), cap * 4 >= PAGE);
            let src: Vec<u32> = (0..cap as u32).collect();
            b.extend_from_slice(&src[..cap / 2]);
            b.extend_from_slice(&src[cap / 2..]);
            assert_eq!(&b[..], &src[..]);
            assert_eq!(b.memory_bytes(), cap * 4);
            b.truncate(cap / 5);
            assert_eq!(&b[..], &src[..cap / 5]);
            assert!(b.memory_bytes() <= cap / 5 * 4 + if b.is_mapped() { 0 } else { 64 });
            // Growing back: zeros, then what is written.
            b.resize(cap);
            assert!(b[cap / 5..].iter().all(|&x| x == 0));
            b[cap / 5..].copy_from_slice(&src[cap / 5..]);
            assert_eq!(&b[..], &src[..]);
            // Past the capacity it moves, keeping its elements.
            b.extend_from_slice(&[7, 8]);
            assert_eq!(b.len(), cap + 2);
            assert_eq!(&b[..cap], &src[..]);
            assert_eq!(&b[cap..], &[7, 8]);
            b.truncate(0);
            assert!(b.is_empty() && b.memory_bytes() == 0);
        }
        let e: BigVec<u8> = BigVec::default();
        assert!(e.is_empty() && e.memory_bytes() == 0);
    }
}
