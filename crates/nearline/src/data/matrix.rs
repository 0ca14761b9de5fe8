//! Row-major matrices of vectors, owned or memory-mapped from a file.
//!
//! A memory-mapped matrix lets the build stream data larger than its memory
//! budget: pages are faulted in as rows are touched and can be evicted again.

use crate::elem::Element;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

enum Storage<T: Element> {
    Owned(Vec<T>),
    Mapped {
        map: memmap2::Mmap,
        offset: usize,
        path: PathBuf,
        /// The mapped file, kept open for reads that bypass the mapping.
        file: std::fs::File,
    },
}

/// A row-major `n × dim` matrix of `T`.
pub struct Matrix<T: Element> {
    storage: Storage<T>,
    n: usize,
    dim: usize,
}

/// A borrowed row-major `n × dim` matrix of `T`.
#[derive(Clone, Copy)]
pub struct MatrixView<'a, T: Element> {
    data: &'a [T],
    n: usize,
    dim: usize,
}

impl<T: Element> Matrix<T> {
    /// Wraps an owned buffer of `n * dim` elements.
    pub fn from_vec(data: Vec<T>, n: usize, dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::arg("vector dimension must be at least 1"));
        }
        if data.len() != n * dim {
            return Err(Error::arg(format!(
                "matrix buffer has {} elements, expected n * dim = {} * {} = {}",
                data.len(),
                n,
                dim,
                n * dim
            )));
        }
        Ok(Matrix {
            storage: Storage::Owned(data),
            n,
            dim,
        })
    }

    /// Maps `n × dim` elements of `path` starting at byte `offset`.
    pub fn map_file(path: &Path, offset: usize, n: usize, dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::format(path, "vector dimension is 0"));
        }
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
        let need = n
            .checked_mul(dim)
            .and_then(|x| x.checked_mul(std::mem::size_of::<T>()))
            .and_then(|x| x.checked_add(offset))
            .ok_or_else(|| Error::format(path, "n * dim overflows"))?;
        if len < need {
            return Err(Error::format(
                path,
                format!("file is truncated: {len} bytes, header promises {need} bytes ({n} vectors of dimension {dim}, {})", T::DTYPE),
            ));
        }
        if n == 0 {
            return Self::from_vec(Vec::new(), 0, dim);
        }
        // SAFETY: the file is opened read-only; nearline never writes to input
        // files while they are mapped. A concurrent external truncation would
        // raise SIGBUS, as with every memory-mapped reader.
        let map =
            unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| Error::io(path, e))?;
        let m = Matrix {
            storage: Storage::Mapped {
                map,
                offset,
                path: path.to_path_buf(),
                file,
            },
            n,
            dim,
        };
        // Validate alignment once so `as_slice` cannot fail later.
        if let Storage::Mapped { map, offset, .. } = &m.storage {
            let bytes = &map[*offset..*offset + n * dim * std::mem::size_of::<T>()];
            if bytemuck::try_cast_slice::<u8, T>(bytes).is_err() {
                return Err(Error::format(
                    path,
                    "vector data is not aligned to its element size",
                ));
            }
        }
        Ok(m)
    }

    /// Number of vectors.
    #[inline]
    pub fn n(&self) -> usize {
        self.n
    }
    /// Dimension.
    #[inline]
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// All elements, row-major.
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        match &self.storage {
            Storage::Owned(v) => v,
            Storage::Mapped { map, offset, .. } => {
                let bytes = &map[*offset..*offset + self.n * self.dim * std::mem::size_of::<T>()];
                // Alignment and size were checked in `map_file`.
                bytemuck::cast_slice(bytes)
            }
        }
    }
    /// Row `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &[T] {
        &self.as_slice()[i * self.dim..(i + 1) * self.dim]
    }
    /// A borrowed view.
    pub fn view(&self) -> MatrixView<'_, T> {
        MatrixView {
            data: self.as_slice(),
            n: self.n,
            dim: self.dim,
        }
    }
    /// Whether the data is memory-mapped (streamed) rather than owned.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
    /// The mapped file, if any.
    pub fn source_path(&self) -> Option<&Path> {
        match &self.storage {
            Storage::Mapped { path, .. } => Some(path),
            Storage::Owned(_) => None,
        }
    }
    /// Tells the kernel that rows `start..end` will not be touched again soon,
    /// so their pages leave this process's resident set (no-op when owned).
    /// Streaming passes call this to keep peak RSS within the build budget.
    pub fn release_rows(&self, start: usize, end: usize) {
        if let Storage::Mapped { map, offset, .. } = &self.storage {
            let esz = std::mem::size_of::<T>();
            let page = 4096usize;
            let lo = (offset + start * self.dim * esz).div_ceil(page) * page;
            let hi = ((offset + end.min(self.n) * self.dim * esz) / page) * page;
            if hi > lo {
                // SAFETY: the map is a private read-only file mapping; dropping
                // its pages only makes later accesses re-read them from the file,
                // so no live reference can observe changed contents.
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                };
            }
        }
    }
    /// Appends the rows `ids` (in that order) to `out`. Mapped rows are read
    /// from the file rather than through the mapping: touching scattered rows
    /// of a mapping pulls whole page-cache folios into the resident set
    /// (measured: 176 KiB per 256-byte row on this kernel, with or without
    /// `MADV_RANDOM`), which budgeted builds cannot afford.
    pub fn gather_rows(&self, ids: &[u32], out: &mut Vec<T>) -> Result<()> {
        let dim = self.dim;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.n) {
            return Err(Error::arg(format!(
                "row {bad} is out of range for a matrix of {} rows",
                self.n
            )));
        }
        match &self.storage {
            Storage::Owned(v) => {
                out.reserve(ids.len() * dim);
                for &i in ids {
                    out.extend_from_slice(&v[i as usize * dim..(i as usize + 1) * dim]);
                }
            }
            Storage::Mapped { .. } => {
                let start = out.len();
                out.resize(start + ids.len() * dim, T::zeroed());
                for (k, &i) in ids.iter().enumerate() {
                    self.read_row(i as usize, &mut out[start + k * dim..start + (k + 1) * dim])?;
                }
            }
        }
        Ok(())
    }
    /// Copies row `i` into `out` (`dim` elements); a mapped row is read from
    /// the file, not through the mapping (see [`Matrix::gather_rows`]).
    pub fn read_row(&self, i: usize, out: &mut [T]) -> Result<()> {
        if i >= self.n || out.len() != self.dim {
            return Err(Error::arg(format!(
                "read_row({i}) into {} elements: the matrix is {} × {}",
                out.len(),
                self.n,
                self.dim
            )));
        }
        match &self.storage {
            Storage::Owned(v) => out.copy_from_slice(&v[i * self.dim..(i + 1) * self.dim]),
            Storage::Mapped {
                offset, path, file, ..
            } => {
                use std::os::unix::fs::FileExt;
                let row_bytes = self.dim * std::mem::size_of::<T>();
                let at = (*offset + i * row_bytes) as u64;
                file.read_exact_at(bytemuck::cast_slice_mut(out), at)
                    .map_err(|e| Error::io(path, e))?;
            }
        }
        Ok(())
    }
    /// Takes the owned buffer, copying if mapped.
    pub fn into_vec(self) -> Vec<T> {
        match self.storage {
            Storage::Owned(v) => v,
            Storage::Mapped { .. } => self.as_slice().to_vec(),
        }
    }
}

impl<'a, T: Element> MatrixView<'a, T> {
    /// A view of `n × dim` elements.
    pub fn new(data: &'a [T], n: usize, dim: usize) -> Result<Self> {
        if dim == 0 || data.len() != n * dim {
            return Err(Error::arg(format!(
                "matrix view of {} elements does not match n={n} × dim={dim}",
                data.len()
            )));
        }
        Ok(MatrixView { data, n, dim })
    }
    #[inline]
    pub fn n(&self) -> usize {
        self.n
    }
    #[inline]
    pub fn dim(&self) -> usize {
        self.dim
    }
    #[inline]
    pub fn row(&self, i: usize) -> &'a [T] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
    #[inline]
    pub fn as_slice(&self) -> &'a [T] {
        self.data
    }
}
