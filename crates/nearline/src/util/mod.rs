//! Small utilities shared across components.

pub mod bigbuf;
pub mod bitpack;
pub mod budget;
pub mod huge;
pub mod idmap;
#[macro_use]
mod vocab;

pub use bigbuf::{BigBuf, BigVec};
pub use budget::Budget;
pub use huge::HugeBytes;
pub use idmap::{IdHasher, IdMap};
pub(crate) use vocab::vocabulary;

/// Hands memory freed by the allocator back to the kernel. glibc keeps freed
/// heap memory (and raises its mmap threshold after large frees), so scratch
/// freed by one phase (a shard's buffers, the BFS frontier of the cache load)
/// would otherwise stay resident and count against a memory budget.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases free heap
    // pages and never touches live allocations.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The allocation size from which glibc maps each block on its own (its
/// default initial threshold, 128 KiB).
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Keeps glibc's mmap threshold at [`MMAP_THRESHOLD`], process-wide (once;
/// later calls do nothing). By default glibc raises the threshold to the
/// size of each mapped block freed (up to 32 MiB), so the search workers'
/// large scratch (visited tables, candidate and result lists) moves from
/// its own mappings into the allocator's arenas, and once freed stays
/// resident there, fragmented across the per-thread arenas, where
/// `malloc_trim` no longer returns it: on a 30k × 256 index at 6 MB, a few
/// hundred searches of changing shapes left 13 MB resident beyond what the
/// index held. Pinned, a freed large block goes back to the kernel at once,
/// and what a search's workers held leaves with them. An open index calls it.
pub fn keep_large_frees_returned() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only sets an allocator parameter; it has no
            // preconditions and touches no allocation. Setting the threshold
            // turns off its dynamic adjustment (documented in mallopt(3)).
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
            }
        });
    }
}

/// Asks the CPU to bring the cache lines holding `bytes` into its caches
/// without waiting for them. A hint only: it never faults and never changes
/// what a later read returns. The search uses it to overlap the memory
/// misses of a node's neighbours' PQ codes (scattered over a table far
/// larger than the CPU caches) instead of taking them one after another.
#[inline(always)]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if let (Some(first), Some(last)) = (bytes.first(), bytes.last()) {
            let (a, b) = (first as *const u8, last as *const u8);
            // SAFETY: a prefetch is a hint that never faults and has no
            // architectural effect; both pointers come from live references
            // into `bytes`. SSE (which provides the instruction) is part of
            // the x86_64 baseline.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(a.cast());
                // A second line only when the bytes straddle one.
                if (a as usize) / 64 != (b as usize) / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(b.cast());
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = bytes;
    }
}
