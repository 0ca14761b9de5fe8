//! Small utilities shared across components.

pub mod budget;

pub use budget::Budget;

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
