//! Owned, 4 KiB-aligned, zero-initialised I/O buffers and a per-worker pool.

/// Alignment of every I/O buffer (O_DIRECT needs the logical block size).
pub const ALIGN: usize = 4096;

/// An owned buffer aligned to [`ALIGN`], length a multiple of [`ALIGN`].
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation (like Vec<u8>), so moving it
// to another thread is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of the bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to a multiple of [`ALIGN`]).
    pub fn new(len: usize) -> Self {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size; a null return is handled below.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: buffers hold at least one block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Raw pointer for the kernel to write into.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    /// The bytes, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).expect("aligned layout");
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// A worker's pool of equally sized buffers.
pub struct BufferPool {
    free: Vec<AlignedBuf>,
    buf_len: usize,
    allocated: usize,
}

impl BufferPool {
    /// A pool handing out buffers of `buf_len` bytes (rounded up to [`ALIGN`]).
    pub fn new(buf_len: usize) -> Self {
        BufferPool {
            free: Vec::new(),
            buf_len: buf_len.max(1).div_ceil(ALIGN) * ALIGN,
            allocated: 0,
        }
    }
    /// A buffer, reused when one is free.
    pub fn get(&mut self) -> AlignedBuf {
        self.free.pop().unwrap_or_else(|| {
            self.allocated += 1;
            AlignedBuf::new(self.buf_len)
        })
    }
    /// Returns a buffer to the pool (buffers of another size are dropped).
    pub fn put(&mut self, buf: AlignedBuf) {
        if buf.len() == self.buf_len {
            self.free.push(buf);
        } else {
            self.allocated = self.allocated.saturating_sub(1);
        }
    }
    /// Size of each buffer.
    pub fn buf_len(&self) -> usize {
        self.buf_len
    }
    /// Buffers ever allocated by this pool (its memory is `allocated × buf_len`).
    pub fn allocated(&self) -> usize {
        self.allocated
    }
    /// Buffers back in the pool; equal to [`BufferPool::allocated`] when
    /// every buffer handed out has been returned.
    pub fn available(&self) -> usize {
        self.free.len()
    }
}
