//! Vector and ground-truth files.
//!
//! Formats: `.fbin/.u8bin/.i8bin/.f16bin` (int32 n, int32 d, row-major data),
//! `.fvecs/.bvecs/.ivecs` (each row: int32 d, then d values), `.npy` (2-D,
//! C order, dtype <f4, <f2, |u1, |i1; <f8 is read as float32, as the Python
//! API casts float64 arrays, refusing values beyond float32's range).
//! Ground truth: DiskANN format
//! (int32 n, int32 k, n·k u32 ids, n·k f32 distances) or `.ivecs` (ids only).
//!
//! All integers and values are little-endian, as written by DiskANN, the
//! big-ann-benchmarks tools and NumPy on every common platform.

use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::{oversized, squared_norm_f64};
use crate::elem::{DType, Element};
use crate::{Error, Result};
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// On-disk container of a vector file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorFileFormat {
    /// int32 n, int32 d, then n·d elements.
    Bin,
    /// Per row: int32 d, then d elements.
    Vecs,
    /// NumPy `.npy`.
    Npy,
}

/// What [`probe`] learned about a vector file without reading its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorFileInfo {
    pub format: VectorFileFormat,
    pub dtype: DType,
    pub n: usize,
    pub dim: usize,
    /// Byte offset of row 0 when the rows are contiguous (Bin, Npy); for Vecs
    /// the offset of row 0's values (4, after its dimension prefix).
    pub data_offset: usize,
    /// Whether rows are contiguous (memory-mappable as a matrix).
    pub contiguous: bool,
    /// The file stores float64 values (an `.npy` of `<f8`): they are read
    /// as float32 (`dtype`), converted into memory.
    pub from_f64: bool,
}

/// Extensions accepted for vector files, for error messages.
pub const SUPPORTED_EXTENSIONS: &str =
    ".fbin, .f16bin, .hbin, .u8bin, .i8bin, .bin (dtype from the caller, default float32), .fvecs, .bvecs, .npy";

/// What a file's extension says about its container and element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Bin family; `None` for a bare `.bin` (dtype from the caller).
    Bin(Option<DType>),
    Vecs(DType),
    Ivecs,
    Npy,
}

fn kind_of(path: &Path) -> Result<Kind> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    Ok(match ext.as_str() {
        "fbin" => Kind::Bin(Some(DType::F32)),
        "f16bin" | "hbin" => Kind::Bin(Some(DType::F16)),
        "u8bin" => Kind::Bin(Some(DType::U8)),
        "i8bin" => Kind::Bin(Some(DType::I8)),
        "bin" => Kind::Bin(None),
        "fvecs" => Kind::Vecs(DType::F32),
        "bvecs" => Kind::Vecs(DType::U8),
        "ivecs" => Kind::Ivecs,
        "npy" => Kind::Npy,
        _ => {
            let shown = if ext.is_empty() {
                "no extension".to_string()
            } else {
                format!("extension .{ext}")
            };
            return Err(Error::format(
                path,
                format!("unknown vector file type ({shown}): supported extensions are {SUPPORTED_EXTENSIONS}"),
            ));
        }
    })
}

fn ivecs_not_vectors(path: &Path) -> Error {
    Error::format(
        path,
        "an .ivecs file holds int32 ids (for example ground truth), not vectors: \
         use read_ground_truth, or store vectors as .fvecs, .bvecs, .fbin, .u8bin, .i8bin or .npy",
    )
}

fn open_len(path: &Path) -> Result<(File, u64)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    Ok((file, len))
}

fn read_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    file.read_exact_at(buf, offset)
        .map_err(|e| Error::io(path, e))
}

fn le_i32(b: &[u8]) -> i32 {
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn dtype_mismatch(path: &Path, file: DType, wanted: DType, who: &str) -> Error {
    Error::format(
        path,
        format!("file holds {file} vectors, but {who} {wanted}"),
    )
}

/// Reads the header of a vector file. The format comes from the extension;
/// `dtype_hint` is needed for a bare `.bin` (defaults to float32) and, if
/// given, must agree with what the file says.
pub fn probe(path: &Path, dtype_hint: Option<DType>) -> Result<VectorFileInfo> {
    let kind = kind_of(path)?;
    let (file, len) = open_len(path)?;
    let info = match kind {
        Kind::Ivecs => return Err(ivecs_not_vectors(path)),
        Kind::Bin(ext_dtype) => probe_bin(
            &file,
            path,
            len,
            ext_dtype.or(dtype_hint).unwrap_or(DType::F32),
        )?,
        Kind::Vecs(dtype) => probe_vecs(&file, path, len, dtype)?,
        Kind::Npy => probe_npy(&file, path, len)?,
    };
    if let Some(hint) = dtype_hint {
        if hint != info.dtype {
            return Err(dtype_mismatch(
                path,
                info.dtype,
                hint,
                "the requested dtype is",
            ));
        }
    }
    Ok(info)
}

/// `8 + n·d·size`, or an overflow error.
fn bin_size(path: &Path, header: usize, n: usize, d: usize, dtype: DType) -> Result<u64> {
    n.checked_mul(d)
        .and_then(|x| x.checked_mul(dtype.size()))
        .and_then(|x| x.checked_add(header))
        .map(|x| x as u64)
        .ok_or_else(|| Error::format(path, format!("n={n} × d={d} overflows the address space")))
}

fn check_exact_size(
    path: &Path,
    len: u64,
    expected: u64,
    n: usize,
    d: usize,
    dtype: DType,
) -> Result<()> {
    if len > expected {
        Err(Error::format(
            path,
            format!(
                "trailing bytes: expected exactly {expected} bytes for n={n} d={d} {dtype}, found {len} ({} extra)",
                len - expected
            ),
        ))
    } else if len < expected {
        Err(Error::format(
            path,
            format!("truncated: expected {expected} bytes for n={n} d={d} {dtype}, found {len}"),
        ))
    } else {
        Ok(())
    }
}

fn probe_bin(file: &File, path: &Path, len: u64, dtype: DType) -> Result<VectorFileInfo> {
    if len == 0 {
        return Err(Error::format(
            path,
            "file is empty: expected an 8-byte header (int32 n, int32 d) followed by the vectors",
        ));
    }
    if len < 8 {
        return Err(Error::format(
            path,
            format!("header is {len} bytes, expected 8 (int32 n, int32 d)"),
        ));
    }
    let mut h = [0u8; 8];
    read_at(file, path, &mut h, 0)?;
    let (n, d) = (le_i32(&h[0..4]), le_i32(&h[4..8]));
    if n < 0 {
        return Err(Error::format(
            path,
            format!("header field n (number of vectors) is {n}, expected n >= 0"),
        ));
    }
    if d < 1 {
        return Err(Error::format(
            path,
            format!("header field d (dimension) is {d}, expected d >= 1"),
        ));
    }
    let (n, d) = (n as usize, d as usize);
    let expected = bin_size(path, 8, n, d, dtype)?;
    check_exact_size(path, len, expected, n, d, dtype)?;
    Ok(VectorFileInfo {
        format: VectorFileFormat::Bin,
        dtype,
        n,
        dim: d,
        data_offset: 8,
        contiguous: true,
        from_f64: false,
    })
}

/// Number of rows whose prefix [`probe`] spot-checks in a vecs file.
const VECS_SPOT_CHECKS: usize = 64;

fn probe_vecs(file: &File, path: &Path, len: u64, dtype: DType) -> Result<VectorFileInfo> {
    if len == 0 {
        return Err(Error::format(
            path,
            "file is empty: a vecs file needs at least one row (int32 d, then d values) to know its dimension",
        ));
    }
    if len < 4 {
        return Err(Error::format(
            path,
            format!("file is {len} bytes, shorter than one int32 row prefix"),
        ));
    }
    let mut h = [0u8; 4];
    read_at(file, path, &mut h, 0)?;
    let d = le_i32(&h);
    if d < 1 {
        return Err(Error::format(
            path,
            format!("row 0: dimension prefix is {d}, expected d >= 1"),
        ));
    }
    let d = d as usize;
    let row = 4 + d as u64 * dtype.size() as u64;
    if !len.is_multiple_of(row) {
        return Err(Error::format(
            path,
            format!(
                "size {len} bytes is not a multiple of the row size {row} (int32 d={d} + {d} {dtype} values): \
                 the file is truncated or its rows have different dimensions"
            ),
        ));
    }
    let n = (len / row) as usize;
    // Spot-check evenly spaced rows, always including the last one;
    // `open_vectors` checks every row.
    let checks = n.min(VECS_SPOT_CHECKS);
    for j in 1..=checks {
        let r = if checks == 1 {
            n - 1
        } else {
            (n - 1) * j / checks
        };
        read_at(file, path, &mut h, r as u64 * row)?;
        check_vecs_prefix(path, r, le_i32(&h), d)?;
    }
    Ok(VectorFileInfo {
        format: VectorFileFormat::Vecs,
        dtype,
        n,
        dim: d,
        data_offset: 4,
        contiguous: false,
        from_f64: false,
    })
}

fn vecs_prefix_error(path: &Path, row: usize, found: i32, d: usize) -> Error {
    Error::format(
        path,
        format!("row {row}: dimension prefix is {found}, expected {d} (the dimension of row 0)"),
    )
}

fn check_vecs_prefix(path: &Path, row: usize, found: i32, d: usize) -> Result<()> {
    if found < 0 || found as usize != d {
        return Err(vecs_prefix_error(path, row, found, d));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// NumPy .npy

const NPY_MAGIC: &[u8; 6] = b"\x93NUMPY";

/// A value in the `.npy` header dictionary.
#[derive(Debug, Clone, PartialEq)]
enum PyValue {
    Str(String),
    Bool(bool),
    Tuple(Vec<i64>),
}

/// A tiny parser for the Python dict literal of a `.npy` header.
struct HeaderParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> HeaderParser<'a> {
    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }
    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        match self.peek() {
            Some(x) if x == c => {
                self.pos += 1;
                Ok(())
            }
            Some(x) => Err(format!(
                "expected '{}' at byte {}, found '{}'",
                c as char, self.pos, x as char
            )),
            None => Err(format!(
                "expected '{}', found the end of the header",
                c as char
            )),
        }
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let q = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a quoted string at byte {}", self.pos)),
        };
        self.pos += 1;
        let start = self.pos;
        while self.pos < self.s.len() && self.s[self.pos] != q {
            self.pos += 1;
        }
        if self.pos >= self.s.len() {
            return Err("unterminated string".into());
        }
        let out = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        self.pos += 1;
        Ok(out)
    }
    fn int(&mut self) -> std::result::Result<i64, String> {
        self.skip_ws();
        let start = self.pos;
        if self.pos < self.s.len() && self.s[self.pos] == b'-' {
            self.pos += 1;
        }
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
            self.pos += 1;
        }
        // Python 2 era writers emit `10L`.
        let text = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        let v = text
            .parse::<i64>()
            .map_err(|_| format!("expected an integer at byte {start}"))?;
        if self.pos < self.s.len() && self.s[self.pos] == b'L' {
            self.pos += 1;
        }
        Ok(v)
    }
    fn value(&mut self) -> std::result::Result<PyValue, String> {
        match self.peek() {
            Some(b'\'' | b'"') => Ok(PyValue::Str(self.string()?)),
            Some(b'(') => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some(b')') {
                        self.pos += 1;
                        break;
                    }
                    items.push(self.int()?);
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b')') => {}
                        _ => {
                            return Err(format!(
                                "expected ',' or ')' in the shape tuple at byte {}",
                                self.pos
                            ))
                        }
                    }
                }
                Ok(PyValue::Tuple(items))
            }
            Some(b'T') if self.s[self.pos..].starts_with(b"True") => {
                self.pos += 4;
                Ok(PyValue::Bool(true))
            }
            Some(b'F') if self.s[self.pos..].starts_with(b"False") => {
                self.pos += 5;
                Ok(PyValue::Bool(false))
            }
            Some(b'[') => Err("structured (record) dtypes are not supported".into()),
            _ => Err(format!("unsupported value at byte {}", self.pos)),
        }
    }
    fn dict(&mut self) -> std::result::Result<Vec<(String, PyValue)>, String> {
        self.expect(b'{')?;
        let mut out = Vec::new();
        loop {
            if self.peek() == Some(b'}') {
                self.pos += 1;
                break;
            }
            let key = self.string()?;
            self.expect(b':')?;
            let v = self.value()?;
            out.push((key, v));
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(format!("expected ',' or '}}' at byte {}", self.pos)),
            }
        }
        Ok(out)
    }
}

/// The element type an `.npy` descr is read as, and whether the file holds
/// float64 (read as float32).
fn npy_dtype(path: &Path, descr: &str) -> Result<(DType, bool)> {
    match descr {
        "<f4" => Ok((DType::F32, false)),
        "<f8" => Ok((DType::F32, true)),
        "<f2" => Ok((DType::F16, false)),
        "|u1" | "<u1" | "u1" | "=u1" => Ok((DType::U8, false)),
        "|i1" | "<i1" | "i1" | "=i1" => Ok((DType::I8, false)),
        d if d.starts_with('>') => Err(Error::format(
            path,
            format!("npy dtype {d:?} is big-endian; save the array as little-endian (e.g. arr.astype('<f4'))"),
        )),
        d => Err(Error::format(
            path,
            format!("npy dtype {d:?} is not supported: expected '<f4' (float32), '<f8' (float64, read as float32), '<f2' (float16), '|u1' (uint8) or '|i1' (int8)"),
        )),
    }
}

fn probe_npy(file: &File, path: &Path, len: u64) -> Result<VectorFileInfo> {
    if len < 10 {
        return Err(Error::format(
            path,
            format!("npy file is {len} bytes, shorter than the 10-byte preamble (magic, version, header length)"),
        ));
    }
    let mut pre = [0u8; 12];
    let pre_len = if len >= 12 { 12 } else { 10 };
    read_at(file, path, &mut pre[..pre_len], 0)?;
    if &pre[..6] != NPY_MAGIC {
        return Err(Error::format(
            path,
            "not a NumPy .npy file: magic bytes \\x93NUMPY missing",
        ));
    }
    let major = pre[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([pre[8], pre[9]]) as u64, 10u64),
        2 | 3 => {
            if pre_len < 12 {
                return Err(Error::format(path, "npy header is truncated"));
            }
            (
                u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]) as u64,
                12u64,
            )
        }
        v => {
            return Err(Error::format(
                path,
                format!(
                    "npy format version {v}.{} is not supported (expected 1.0, 2.0 or 3.0)",
                    pre[7]
                ),
            ))
        }
    };
    if hstart + hlen > len {
        return Err(Error::format(
            path,
            format!("npy header length {hlen} runs past the end of the {len}-byte file"),
        ));
    }
    if hlen > 1 << 20 {
        return Err(Error::format(
            path,
            format!("npy header length {hlen} is implausibly large"),
        ));
    }
    let mut header = vec![0u8; hlen as usize];
    read_at(file, path, &mut header, hstart)?;
    let entries = HeaderParser { s: &header, pos: 0 }
        .dict()
        .map_err(|m| Error::format(path, format!("cannot parse the npy header: {m}")))?;
    let get = |k: &str| entries.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let descr = match get("descr") {
        Some(PyValue::Str(s)) => s.clone(),
        _ => {
            return Err(Error::format(
                path,
                "npy header has no string field 'descr'",
            ))
        }
    };
    match get("fortran_order") {
        Some(PyValue::Bool(false)) => {}
        Some(PyValue::Bool(true)) => {
            return Err(Error::format(
                path,
                "npy header field fortran_order is True, expected False (C order): save np.ascontiguousarray(arr)",
            ))
        }
        _ => return Err(Error::format(path, "npy header has no boolean field 'fortran_order'")),
    }
    let shape = match get("shape") {
        Some(PyValue::Tuple(t)) => t.clone(),
        _ => return Err(Error::format(path, "npy header has no tuple field 'shape'")),
    };
    let (dtype, from_f64) = npy_dtype(path, &descr)?;
    if shape.len() != 2 {
        return Err(Error::format(
            path,
            format!(
                "npy array has {} dimensions (shape {shape:?}), expected 2 (n, d)",
                shape.len()
            ),
        ));
    }
    let (n, d) = (shape[0], shape[1]);
    if n < 0 || d < 1 {
        return Err(Error::format(
            path,
            format!("npy shape ({n}, {d}): expected n >= 0 and d >= 1"),
        ));
    }
    let (n, d) = (n as usize, d as usize);
    let offset = (hstart + hlen) as usize;
    if from_f64 {
        // Twice the float32 size; the message names the stored type.
        let expected = bin_size(path, offset, n, 2 * d, dtype)?;
        if len != expected {
            return Err(Error::format(
                path,
                format!(
                    "npy data is {} bytes, expected {} bytes for shape ({n}, {d}) of float64",
                    len - offset as u64,
                    expected - offset as u64
                ),
            ));
        }
    } else {
        let expected = bin_size(path, offset, n, d, dtype)?;
        check_exact_size(path, len, expected, n, d, dtype)?;
    }
    Ok(VectorFileInfo {
        format: VectorFileFormat::Npy,
        dtype,
        n,
        dim: d,
        data_offset: offset,
        contiguous: !from_f64,
        from_f64,
    })
}

// ---------------------------------------------------------------------------
// Reading

/// Opens a vector file as a matrix of `T`: memory-mapped when its rows are
/// contiguous, read into memory otherwise. Errors if the file's dtype is not `T`.
///
/// Every row prefix of a vecs file is checked; a wrong one names the row.
pub fn open_vectors<T: Element>(path: &Path) -> Result<Matrix<T>> {
    let hint = match kind_of(path)? {
        Kind::Bin(None) => Some(T::DTYPE),
        _ => None,
    };
    let info = probe(path, hint)?;
    if info.dtype != T::DTYPE {
        return Err(dtype_mismatch(
            path,
            info.dtype,
            T::DTYPE,
            "it was opened as",
        ));
    }
    if info.from_f64 {
        read_f64_as_f32(path, &info)
    } else if info.contiguous {
        if info.n == 0 || info.data_offset.is_multiple_of(std::mem::align_of::<T>()) {
            Matrix::map_file(path, info.data_offset, info.n, info.dim)
        } else {
            // A header whose length leaves the data misaligned for `T` (some
            // third-party npy writers): copy into an aligned buffer.
            read_contiguous_owned(path, &info)
        }
    } else {
        read_vecs(path, &info)
    }
}

fn read_contiguous_owned<T: Element>(path: &Path, info: &VectorFileInfo) -> Result<Matrix<T>> {
    let (file, _) = open_len(path)?;
    let mut data = vec![<T as bytemuck::Zeroable>::zeroed(); info.n * info.dim];
    read_at(
        &file,
        path,
        bytemuck::cast_slice_mut(&mut data),
        info.data_offset as u64,
    )?;
    Matrix::from_vec(data, info.n, info.dim)
}

/// Reads the float64 values of an `.npy` file as float32 (the file's
/// `dtype` is F32, so `T` is f32), refusing finite values beyond float32's
/// range (NaN and infinities pass, for the callers' finiteness checks).
fn read_f64_as_f32<T: Element>(path: &Path, info: &VectorFileInfo) -> Result<Matrix<T>> {
    let (file, len) = open_len(path)?;
    let (n, d) = (info.n, info.dim);
    if len as usize != info.data_offset + n * d * 8 {
        return Err(Error::format(path, "file changed size while being read"));
    }
    let mut data = vec![<T as bytemuck::Zeroable>::zeroed(); n * d];
    if n == 0 {
        return Matrix::from_vec(data, n, d);
    }
    // SAFETY: read-only private mapping of a file we only read; concurrent
    // external truncation would raise SIGBUS, as with every mmap reader.
    let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| Error::io(path, e))?;
    let src = &map[info.data_offset..];
    let per = rows_per_task(d);
    let bad = data
        .par_chunks_mut(per * d)
        .enumerate()
        .map(|(ci, dst)| {
            let first = ci * per * d;
            for (j, out) in dst.iter_mut().enumerate() {
                let at = (first + j) * 8;
                let mut b = [0u8; 8];
                b.copy_from_slice(&src[at..at + 8]);
                let v = f64::from_le_bytes(b);
                if v.is_finite() && v.abs() > f32::MAX as f64 {
                    return Some((first + j, v));
                }
                match T::from_f32(v as f32) {
                    Some(x) => *out = x,
                    None => return Some((first + j, v)),
                }
            }
            None
        })
        .find_first(Option::is_some)
        .flatten();
    if let Some((i, v)) = bad {
        return Err(Error::arg(format!(
            "{}: row {}, column {} is {v:e}, beyond float32's range (values are read as float32); \
             scale the data down",
            path.display(),
            i / d,
            i % d
        )));
    }
    Matrix::from_vec(data, n, d)
}

/// Rows per parallel task when copying/scanning.
fn rows_per_task(dim: usize) -> usize {
    (1 << 16) / dim.max(1) + 1
}

fn read_vecs<T: Element>(path: &Path, info: &VectorFileInfo) -> Result<Matrix<T>> {
    let (file, len) = open_len(path)?;
    let (n, d) = (info.n, info.dim);
    let row_bytes = 4 + d * std::mem::size_of::<T>();
    if len as usize != n * row_bytes {
        return Err(Error::format(path, "file changed size while being read"));
    }
    // SAFETY: read-only private mapping of a file we only read; concurrent
    // external truncation would raise SIGBUS, as with every mmap reader.
    let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| Error::io(path, e))?;
    let mut data = vec![<T as bytemuck::Zeroable>::zeroed(); n * d];
    let per = rows_per_task(d);
    let bad = data
        .par_chunks_mut(per * d)
        .enumerate()
        .map(|(ci, dst)| {
            let first = ci * per;
            for (j, out) in dst.chunks_exact_mut(d).enumerate() {
                let r = first + j;
                let src = &map[r * row_bytes..(r + 1) * row_bytes];
                let prefix = le_i32(&src[..4]);
                if prefix < 0 || prefix as usize != d {
                    return Some((r, prefix));
                }
                bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(&src[4..]);
            }
            None
        })
        .filter_map(|x| x)
        .min_by_key(|&(r, _)| r);
    if let Some((r, prefix)) = bad {
        return Err(vecs_prefix_error(path, r, prefix, d));
    }
    Matrix::from_vec(data, n, d)
}

// ---------------------------------------------------------------------------
// Writing

/// Writes `path` through a temporary file in the same directory that is
/// renamed over it once complete: readers that have the old file mapped keep
/// their contents, and a failed write leaves no half-written file behind.
/// The parent directory must exist.
fn write_file(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<()> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        if !parent.is_dir() {
            return Err(Error::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("directory {} does not exist", parent.display()),
                ),
            ));
        }
    }
    let name = path
        .file_name()
        .ok_or_else(|| Error::arg(format!("cannot write {}: not a file path", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(tmp_name);
    let file = File::create(&tmp).map_err(|e| Error::io(path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let written = body(&mut w).and_then(|()| w.flush());
    drop(w);
    let done = written.and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    Ok(())
}

fn to_i32(path: &Path, field: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::arg(format!(
            "cannot write {}: {field}={v} does not fit the format's int32 field",
            path.display()
        ))
    })
}

/// The `.npy` descr of a dtype.
fn npy_descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
    }
}

/// A version-1 `.npy` preamble and header, padded with spaces and a final
/// newline so the data starts at a multiple of 64 bytes.
fn npy_header(dtype: DType, n: usize, d: usize) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({n}, {d}), }}",
        npy_descr(dtype)
    );
    let unpadded = 10 + dict.len() + 1;
    let total = unpadded.div_ceil(64) * 64;
    let hlen = total - 10;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    // A dict of three short fields is far below 65535 bytes.
    out.extend_from_slice(&(hlen as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// Writes vectors; the format comes from the extension and must match `T`.
///
/// `.bin` accepts any dtype; `.fvecs` needs float32 and `.bvecs` uint8 (and at
/// least one row, since vecs files store the dimension in each row); `.npy`
/// writes format version 1.0. The parent directory must exist.
pub fn write_vectors<T: Element>(path: &Path, data: MatrixView<'_, T>) -> Result<()> {
    let kind = kind_of(path)?;
    let (n, d) = (data.n(), data.dim());
    let ext_dtype = match kind {
        Kind::Ivecs => return Err(ivecs_not_vectors(path)),
        Kind::Bin(dt) => dt,
        Kind::Vecs(dt) => Some(dt),
        Kind::Npy => None,
    };
    if let Some(dt) = ext_dtype {
        if dt != T::DTYPE {
            return Err(Error::arg(format!(
                "cannot write {} vectors to {}: its extension means {dt}",
                T::DTYPE,
                path.display()
            )));
        }
    }
    let bytes: &[u8] = bytemuck::cast_slice(data.as_slice());
    match kind {
        Kind::Bin(_) => {
            let (ni, di) = (to_i32(path, "n", n)?, to_i32(path, "d", d)?);
            write_file(path, |w| {
                w.write_all(&ni.to_le_bytes())?;
                w.write_all(&di.to_le_bytes())?;
                w.write_all(bytes)
            })
        }
        Kind::Vecs(_) => {
            if n == 0 {
                return Err(Error::arg(format!(
                    "cannot write 0 vectors to {}: a vecs file stores the dimension in each row, \
                     so an empty one could not be read back; use .fbin/.u8bin or .npy",
                    path.display()
                )));
            }
            let prefix = to_i32(path, "d", d)?.to_le_bytes();
            let row_bytes = d * std::mem::size_of::<T>();
            write_file(path, |w| {
                for row in bytes.chunks_exact(row_bytes) {
                    w.write_all(&prefix)?;
                    w.write_all(row)?;
                }
                Ok(())
            })
        }
        Kind::Npy => write_file(path, |w| {
            w.write_all(&npy_header(T::DTYPE, n, d))?;
            w.write_all(bytes)
        }),
        Kind::Ivecs => Err(ivecs_not_vectors(path)),
    }
}

// ---------------------------------------------------------------------------
// Validation

/// Checks that every element is finite (float types); the error names the
/// file (`what`) and the first offending row and column (0-based), as
/// `"{what}: row R, column C is NaN"` (or `inf` / `-inf`).
/// Integer types are always finite. Runs on the caller's rayon pool.
pub fn check_finite<T: Element>(what: &str, data: MatrixView<'_, T>) -> Result<()> {
    if !T::DTYPE.is_float() || data.n() == 0 {
        return Ok(());
    }
    let d = data.dim();
    let per = rows_per_task(d);
    let bad = data
        .as_slice()
        .par_chunks(per * d)
        .enumerate()
        .find_map_first(|(ci, chunk)| {
            chunk
                .iter()
                .position(|x| !x.to_f32().is_finite())
                .map(|i| (ci * per + i / d, i % d, chunk[i].to_f32()))
        });
    if let Some((r, c, v)) = bad {
        let what_is = if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        return Err(Error::arg(format!(
            "{what}: row {r}, column {c} is {what_is} (vectors must be finite)"
        )));
    }
    // Finite values whose squares overflow would give infinite distances.
    let big = (0..data.n())
        .into_par_iter()
        .with_min_len(per)
        .map(|r| (r, squared_norm_f64(data.row(r))))
        .find_first(|&(_, n2)| oversized(n2).is_some());
    match big.and_then(|(r, n2)| Some((r, oversized(n2)?))) {
        None => Ok(()),
        Some((r, why)) => Err(Error::arg(format!("{what}: row {r} {why}"))),
    }
}

// ---------------------------------------------------------------------------
// Ground truth

/// Exact nearest neighbours of a query set.
#[derive(Debug, Clone, PartialEq)]
pub struct GroundTruth {
    pub n: usize,
    pub k: usize,
    /// Row-major `n × k` internal ids (row order of the base file).
    pub ids: Vec<u32>,
    /// Row-major `n × k` user-facing distances (squared L2, inner product or
    /// cosine similarity), best first. Empty when the file held ids only.
    pub distances: Vec<f32>,
}

/// Reads a ground-truth file (DiskANN binary format or `.ivecs`).
///
/// The DiskANN format is int32 n, int32 k, n·k uint32 ids, n·k float32
/// distances: exactly `8 + 8·n·k` bytes. The ids-only variant of exactly
/// `8 + 4·n·k` bytes is accepted too, as is `.ivecs` (per row: int32 k, then k
/// int32 ids); for both, `distances` is left empty.
pub fn read_ground_truth(path: &Path) -> Result<GroundTruth> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let is_ivecs = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("ivecs"));
    if is_ivecs {
        return read_gt_ivecs(path, &bytes);
    }
    let len = bytes.len();
    if len < 8 {
        return Err(Error::format(
            path,
            if len == 0 {
                "ground-truth file is empty: expected an 8-byte header (int32 n, int32 k)"
                    .to_string()
            } else {
                format!("ground-truth header is {len} bytes, expected 8 (int32 n, int32 k)")
            },
        ));
    }
    let (n, k) = (le_i32(&bytes[0..4]), le_i32(&bytes[4..8]));
    if n < 0 || k < 0 {
        return Err(Error::format(
            path,
            format!("ground-truth header n={n}, k={k}: expected n >= 0 and k >= 0"),
        ));
    }
    let (n, k) = (n as usize, k as usize);
    let nk = n
        .checked_mul(k)
        .filter(|nk| {
            nk.checked_mul(8)
                .is_some_and(|b| b.checked_add(8).is_some())
        })
        .ok_or_else(|| {
            Error::format(path, format!("ground-truth header n={n} × k={k} overflows"))
        })?;
    let full = 8 + 8 * nk;
    let ids_only = 8 + 4 * nk;
    if len != full && len != ids_only {
        return Err(Error::format(
            path,
            format!(
                "ground-truth file is {len} bytes; for n={n} k={k} expected exactly {full} \
                 (ids and distances) or {ids_only} (ids only)"
            ),
        ));
    }
    let ids: Vec<u32> = bytes[8..8 + 4 * nk]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let distances: Vec<f32> = if len == full {
        bytes[8 + 4 * nk..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    } else {
        Vec::new()
    };
    Ok(GroundTruth {
        n,
        k,
        ids,
        distances,
    })
}

fn read_gt_ivecs(path: &Path, bytes: &[u8]) -> Result<GroundTruth> {
    if bytes.is_empty() {
        return Ok(GroundTruth {
            n: 0,
            k: 0,
            ids: Vec::new(),
            distances: Vec::new(),
        });
    }
    if bytes.len() < 4 {
        return Err(Error::format(
            path,
            format!(
                "file is {} bytes, shorter than one int32 row prefix",
                bytes.len()
            ),
        ));
    }
    let k = le_i32(&bytes[..4]);
    if k < 0 {
        return Err(Error::format(
            path,
            format!("row 0: length prefix is {k}, expected k >= 0"),
        ));
    }
    let k = k as usize;
    let row = 4 + 4 * k;
    if !bytes.len().is_multiple_of(row) {
        return Err(Error::format(
            path,
            format!(
                "size {} bytes is not a multiple of the row size {row} (int32 k={k} + {k} int32 ids): \
                 the file is truncated or its rows have different lengths",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / row;
    let mut ids = Vec::with_capacity(n * k);
    for (r, chunk) in bytes.chunks_exact(row).enumerate() {
        let p = le_i32(&chunk[..4]);
        if p < 0 || p as usize != k {
            return Err(Error::format(
                path,
                format!("row {r}: length prefix is {p}, expected {k} (the length of row 0)"),
            ));
        }
        for (c, b) in chunk[4..].chunks_exact(4).enumerate() {
            let id = le_i32(b);
            if id < 0 {
                return Err(Error::format(
                    path,
                    format!("row {r}, column {c}: id {id} is negative"),
                ));
            }
            ids.push(id as u32);
        }
    }
    Ok(GroundTruth {
        n,
        k,
        ids,
        distances: Vec::new(),
    })
}

/// Writes a ground-truth file in DiskANN's binary format. If `distances` is
/// empty (ids-only ground truth, e.g. read from `.ivecs`), the ids-only variant
/// is written, which [`read_ground_truth`] reads back.
pub fn write_ground_truth(path: &Path, gt: &GroundTruth) -> Result<()> {
    let nk =
        gt.n.checked_mul(gt.k)
            .ok_or_else(|| Error::arg(format!("ground truth n={} × k={} overflows", gt.n, gt.k)))?;
    if gt.ids.len() != nk {
        return Err(Error::arg(format!(
            "ground truth has {} ids, expected n × k = {} × {} = {nk}",
            gt.ids.len(),
            gt.n,
            gt.k
        )));
    }
    if !gt.distances.is_empty() && gt.distances.len() != nk {
        return Err(Error::arg(format!(
            "ground truth has {} distances, expected n × k = {} × {} = {nk} (or none)",
            gt.distances.len(),
            gt.n,
            gt.k
        )));
    }
    let (ni, ki) = (to_i32(path, "n", gt.n)?, to_i32(path, "k", gt.k)?);
    write_file(path, |w| {
        w.write_all(&ni.to_le_bytes())?;
        w.write_all(&ki.to_le_bytes())?;
        w.write_all(bytemuck::cast_slice(&gt.ids))?;
        w.write_all(bytemuck::cast_slice(&gt.distances))
    })
}

// ---------------------------------------------------------------------------
// Range ground truth

/// Exact range-search answers of a query set, in CSR form: the results of
/// query `i` are `ids[lims[i]..lims[i + 1]]` (internal ids, row order of the
/// base file), closest first, with their user-facing `distances` (squared L2,
/// inner product or cosine similarity; empty when the file held ids only).
#[derive(Debug, Clone, PartialEq)]
pub struct RangeGroundTruth {
    /// `n + 1` offsets, starting at 0, non-decreasing, ending at `ids.len()`.
    pub lims: Vec<u64>,
    pub ids: Vec<u32>,
    pub distances: Vec<f32>,
}

impl RangeGroundTruth {
    /// Number of queries.
    pub fn n(&self) -> usize {
        self.lims.len().saturating_sub(1)
    }

    /// Checks the CSR invariants; the error says which one fails.
    pub fn validate(&self) -> Result<()> {
        let Some((&first, _)) = self.lims.split_first() else {
            return Err(Error::arg(
                "range ground truth: lims is empty; it needs n + 1 entries starting at 0",
            ));
        };
        if first != 0 {
            return Err(Error::arg(format!(
                "range ground truth: lims[0] is {first}, expected 0"
            )));
        }
        if let Some(i) = self.lims.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::arg(format!(
                "range ground truth: lims decreases at query {i} ({} then {})",
                self.lims[i],
                self.lims[i + 1]
            )));
        }
        let last = self.lims[self.lims.len() - 1];
        if last != self.ids.len() as u64 {
            return Err(Error::arg(format!(
                "range ground truth: lims ends at {last} but there are {} ids",
                self.ids.len()
            )));
        }
        if !self.distances.is_empty() && self.distances.len() != self.ids.len() {
            return Err(Error::arg(format!(
                "range ground truth has {} distances for {} ids (expected as many, or none)",
                self.distances.len(),
                self.ids.len()
            )));
        }
        Ok(())
    }
}

/// Reads a range ground-truth file.
///
/// The layout is DiskANN's range ground truth followed by distances, all
/// little-endian: uint32 n, uint32 total, n uint32 counts (results per query),
/// total uint32 ids (query after query), then total float32 distances. The
/// file is exactly `8 + 4·n + 8·total` bytes; DiskANN's ids-only variant of
/// `8 + 4·n + 4·total` bytes is accepted too (`distances` is then empty).
/// The counts must add up to `total`.
pub fn read_range_ground_truth(path: &Path) -> Result<RangeGroundTruth> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let len = bytes.len() as u64;
    if len < 8 {
        return Err(Error::format(
            path,
            if len == 0 {
                "range ground-truth file is empty: expected an 8-byte header (uint32 n, uint32 total)"
                    .to_string()
            } else {
                format!(
                    "range ground-truth header is {len} bytes, expected 8 (uint32 n, uint32 total)"
                )
            },
        ));
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let (n, total) = (u32_at(0) as u64, u32_at(4) as u64);
    let ids_only = 8 + 4 * n + 4 * total;
    let full = ids_only + 4 * total;
    if len != full && len != ids_only {
        return Err(Error::format(
            path,
            format!(
                "range ground-truth file is {len} bytes; for n={n} total={total} expected exactly \
                 {full} (counts, ids and distances) or {ids_only} (counts and ids)"
            ),
        ));
    }
    let (n, total) = (n as usize, total as usize);
    let mut lims = Vec::with_capacity(n + 1);
    lims.push(0u64);
    let mut sum = 0u64;
    for i in 0..n {
        sum += u32_at(8 + 4 * i) as u64;
        lims.push(sum);
    }
    if sum != total as u64 {
        return Err(Error::format(
            path,
            format!("range ground truth: the {n} per-query counts add up to {sum}, the header says total={total}"),
        ));
    }
    let id_start = 8 + 4 * n;
    let ids: Vec<u32> = bytes[id_start..id_start + 4 * total]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let distances: Vec<f32> = if len == full {
        bytes[id_start + 4 * total..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    } else {
        Vec::new()
    };
    Ok(RangeGroundTruth {
        lims,
        ids,
        distances,
    })
}

/// Writes a range ground-truth file in the layout [`read_range_ground_truth`]
/// reads (without distances when `distances` is empty).
pub fn write_range_ground_truth(path: &Path, gt: &RangeGroundTruth) -> Result<()> {
    gt.validate()?;
    let n = u32::try_from(gt.n()).map_err(|_| {
        Error::arg(format!(
            "cannot write {}: {} queries do not fit the format's uint32 n",
            path.display(),
            gt.n()
        ))
    })?;
    let total = u32::try_from(gt.ids.len()).map_err(|_| {
        Error::arg(format!(
            "cannot write {}: {} results do not fit the format's uint32 total",
            path.display(),
            gt.ids.len()
        ))
    })?;
    // Each count is at most total, so it fits too.
    let counts: Vec<u32> = gt.lims.windows(2).map(|w| (w[1] - w[0]) as u32).collect();
    write_file(path, |w| {
        w.write_all(&n.to_le_bytes())?;
        w.write_all(&total.to_le_bytes())?;
        w.write_all(bytemuck::cast_slice(&counts))?;
        w.write_all(bytemuck::cast_slice(&gt.ids))?;
        w.write_all(bytemuck::cast_slice(&gt.distances))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::path::PathBuf;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn err_text<T>(r: Result<T>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    fn random<T: Element>(n: usize, d: usize, seed: u64) -> Vec<T> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n * d)
            .map(|_| {
                let v: f32 = match T::DTYPE {
                    DType::F32 | DType::F16 => rng.random_range(-4.0f32..4.0),
                    DType::U8 => rng.random_range(0..=255) as f32,
                    DType::I8 => rng.random_range(-128..=127) as f32,
                };
                T::from_f32(v).unwrap()
            })
            .collect()
    }

    fn roundtrip<T: Element>(dir: &Path, name: &str, n: usize, d: usize, mapped: bool) {
        let path = dir.join(name);
        let data = random::<T>(n, d, n as u64 * 31 + d as u64);
        let view = MatrixView::new(&data, n, d).unwrap();
        write_vectors(&path, view).unwrap();
        let hint = if name.to_ascii_lowercase().ends_with(".bin") {
            Some(T::DTYPE)
        } else {
            None
        };
        let info = probe(&path, hint).unwrap();
        assert_eq!((info.n, info.dim, info.dtype), (n, d, T::DTYPE), "{name}");
        let m = open_vectors::<T>(&path).unwrap();
        assert_eq!((m.n(), m.dim()), (n, d), "{name}");
        assert_eq!(m.as_slice(), &data[..], "{name}");
        if n > 0 {
            assert_eq!(m.is_mapped(), mapped, "{name}");
        }
    }

    #[test]
    fn bin_roundtrip_every_dtype() {
        let dir = tmp();
        for &(n, d) in &[(0usize, 3usize), (1, 1), (37, 13), (200, 128)] {
            roundtrip::<f32>(dir.path(), "a.fbin", n, d, true);
            roundtrip::<f32>(dir.path(), "a.bin", n, d, true);
            roundtrip::<f16>(dir.path(), "a.f16bin", n, d, true);
            roundtrip::<f16>(dir.path(), "a.hbin", n, d, true);
            roundtrip::<f16>(dir.path(), "b.bin", n, d, true);
            roundtrip::<u8>(dir.path(), "a.u8bin", n, d, true);
            roundtrip::<u8>(dir.path(), "c.bin", n, d, true);
            roundtrip::<i8>(dir.path(), "a.i8bin", n, d, true);
            roundtrip::<i8>(dir.path(), "d.BIN", n, d, true);
        }
        let info = probe(&dir.path().join("a.fbin"), None).unwrap();
        assert_eq!(info.format, VectorFileFormat::Bin);
        assert_eq!(info.data_offset, 8);
        assert!(info.contiguous);
    }

    #[test]
    fn vecs_roundtrip() {
        let dir = tmp();
        for &(n, d) in &[(1usize, 1usize), (50, 7), (300, 96)] {
            roundtrip::<f32>(dir.path(), "a.fvecs", n, d, false);
            roundtrip::<u8>(dir.path(), "a.bvecs", n, d, false);
        }
        let info = probe(&dir.path().join("a.fvecs"), None).unwrap();
        assert_eq!(info.format, VectorFileFormat::Vecs);
        assert!(!info.contiguous);
        let len = std::fs::metadata(dir.path().join("a.bvecs")).unwrap().len();
        assert_eq!(len, 300 * (4 + 96));
    }

    #[test]
    fn npy_roundtrip_every_dtype() {
        let dir = tmp();
        for &(n, d) in &[(0usize, 5usize), (1, 1), (41, 17), (128, 100)] {
            roundtrip::<f32>(dir.path(), "a.npy", n, d, true);
            roundtrip::<f16>(dir.path(), "b.npy", n, d, true);
            roundtrip::<u8>(dir.path(), "c.npy", n, d, true);
            roundtrip::<i8>(dir.path(), "d.npy", n, d, true);
        }
        let info = probe(&dir.path().join("a.npy"), None).unwrap();
        assert_eq!(info.format, VectorFileFormat::Npy);
        assert_eq!(info.data_offset % 64, 0);
        let bytes = std::fs::read(dir.path().join("a.npy")).unwrap();
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(bytes[info.data_offset - 1], b'\n');
        let header = std::str::from_utf8(&bytes[10..info.data_offset]).unwrap();
        assert!(
            header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (128, 100), }")
        );
        for name in ["b.npy", "c.npy", "d.npy"] {
            let b = std::fs::read(dir.path().join(name)).unwrap();
            let want = match name {
                "b.npy" => "'<f2'",
                "c.npy" => "'|u1'",
                _ => "'|i1'",
            };
            assert!(String::from_utf8_lossy(&b[..64]).contains(want), "{name}");
        }
    }

    /// Builds an npy file by hand: `version`, header text (padded so the data
    /// starts at `10/12 + header` rounded to `pad`), then `data`.
    fn npy_file(path: &Path, version: u8, dict: &str, pad: usize, data: &[u8]) {
        let pre = if version == 1 { 10 } else { 12 };
        let mut header = dict.as_bytes().to_vec();
        let total = (pre + header.len() + 1).div_ceil(pad) * pad;
        header.resize(total - pre - 1, b' ');
        header.push(b'\n');
        let mut out = b"\x93NUMPY".to_vec();
        out.extend_from_slice(&[version, 0]);
        if version == 1 {
            out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn npy_header_variants() {
        let dir = tmp();
        let p = dir.path().join("v.npy");
        let vals: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
        let raw: &[u8] = bytemuck::cast_slice(&vals);
        // Version 2 and 3, double quotes, no trailing comma, Python-2 longs.
        for (ver, dict) in [
            (
                2u8,
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            ),
            (
                3,
                "{\"descr\": \"<f4\", \"shape\": (2L, 3L), \"fortran_order\": False}",
            ),
            (1, "{'fortran_order':False,'shape':(2,3),'descr':'<f4'}"),
        ] {
            npy_file(&p, ver, dict, 64, raw);
            let m = open_vectors::<f32>(&p).unwrap();
            assert_eq!((m.n(), m.dim()), (2, 3));
            assert_eq!(m.as_slice(), &vals[..]);
        }
        // Data misaligned for f32 (no padding, odd header length): copied.
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}";
        let dict = if (11 + dict.len()).is_multiple_of(4) {
            format!("{dict} ")
        } else {
            dict.to_string()
        };
        npy_file(&p, 1, &dict, 1, raw);
        let info = probe(&p, None).unwrap();
        assert_ne!(info.data_offset % 4, 0);
        let m = open_vectors::<f32>(&p).unwrap();
        assert!(!m.is_mapped());
        assert_eq!(m.as_slice(), &vals[..]);
        // Every spelling of the byte types.
        for descr in ["|u1", "<u1", "u1"] {
            npy_file(
                &p,
                1,
                &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2, 2), }}"),
                64,
                &[1, 2, 3, 4],
            );
            assert_eq!(open_vectors::<u8>(&p).unwrap().as_slice(), &[1, 2, 3, 4]);
        }
        for descr in ["|i1", "<i1", "i1"] {
            npy_file(
                &p,
                1,
                &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (1, 4), }}"),
                64,
                &[255, 2, 3, 4],
            );
            assert_eq!(open_vectors::<i8>(&p).unwrap().as_slice(), &[-1, 2, 3, 4]);
        }
    }

    /// float64 `.npy` files read as float32, as the Python API casts
    /// float64 arrays: whatever the header's alignment; values beyond
    /// float32's range are refused with their row and column.
    #[test]
    fn npy_float64_reads_as_float32() {
        let dir = tmp();
        let p = dir.path().join("f8.npy");
        let vals: Vec<f64> = (0..12).map(|i| i as f64 / 3.0 - 1.5).collect();
        let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }";
        let want: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
        for pad in [64, 1] {
            npy_file(&p, 1, dict, pad, &raw);
            let info = probe(&p, None).unwrap();
            assert_eq!((info.dtype, info.n, info.dim), (DType::F32, 4, 3));
            assert!(info.from_f64 && !info.contiguous);
            assert_eq!(probe(&p, Some(DType::F32)).unwrap(), info);
            let m = open_vectors::<f32>(&p).unwrap();
            assert_eq!((m.n(), m.dim()), (4, 3));
            assert_eq!(m.as_slice(), &want[..]);
            let e = err_text(open_vectors::<u8>(&p));
            assert!(e.contains("float32"), "{e}");
        }
        // Empty arrays and the largest float32 read; beyond it is refused.
        npy_file(
            &p,
            1,
            "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 3), }",
            64,
            &[],
        );
        assert_eq!(open_vectors::<f32>(&p).unwrap().n(), 0);
        let mut big = vals.clone();
        big[5] = f32::MAX as f64;
        big[7] = -1e39;
        let raw: Vec<u8> = big.iter().flat_map(|v| v.to_le_bytes()).collect();
        npy_file(&p, 1, dict, 64, &raw);
        let e = err_text(open_vectors::<f32>(&p));
        assert!(
            e.contains("row 2, column 1 is -1e39, beyond float32's range"),
            "{e}"
        );
        big[7] = f64::NAN;
        let raw: Vec<u8> = big.iter().flat_map(|v| v.to_le_bytes()).collect();
        npy_file(&p, 1, dict, 64, &raw);
        let m = open_vectors::<f32>(&p).unwrap();
        assert_eq!(m.as_slice()[5], f32::MAX);
        // NaN passes the reader; builds and searches refuse it by row.
        assert!(m.as_slice()[7].is_nan());
        let e = err_text(check_finite("f8.npy", m.view()));
        assert!(e.contains("row 2, column 1 is NaN"), "{e}");
        // Big-endian float64 is refused as every big-endian type.
        npy_file(
            &p,
            1,
            "{'descr': '>f8', 'fortran_order': False, 'shape': (4, 3), }",
            64,
            &raw,
        );
        assert!(err_text(probe(&p, None)).contains("big-endian"));
    }

    #[test]
    fn npy_bad_inputs() {
        let dir = tmp();
        let p = dir.path().join("bad.npy");
        let data = [0u8; 24];
        let cases: [(&str, &[u8], &str); 9] = [
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }",
                &data,
                "big-endian",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
                &data,
                "expected 48 bytes for shape (2, 3) of float64",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                &data,
                "fortran_order is True",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
                &data,
                "1 dimensions",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }",
                &data,
                "3 dimensions",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }",
                &data,
                "truncated: expected",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }",
                &data,
                "trailing bytes",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }",
                &data,
                "structured",
            ),
            (
                "{'descr': '<f4', 'shape': (2, 3), }",
                &data,
                "fortran_order",
            ),
        ];
        for (dict, payload, want) in cases {
            npy_file(&p, 1, dict, 64, payload);
            let e = err_text(probe(&p, None));
            assert!(e.contains(want), "{dict}: {e}");
            assert!(e.contains("bad.npy"), "{e}");
        }
        std::fs::write(&p, b"\x93NUMPX\x01\x00\x10\x00{}").unwrap();
        assert!(err_text(probe(&p, None)).contains("magic"));
        std::fs::write(&p, b"\x93NUMPY\x04\x00\x10\x00{}").unwrap();
        assert!(err_text(probe(&p, None)).contains("version 4"));
        std::fs::write(&p, b"\x93NUMPY\x01\x00\xff\x00{}").unwrap();
        assert!(err_text(probe(&p, None)).contains("past the end"));
        std::fs::write(&p, b"\x93NUM").unwrap();
        assert!(err_text(probe(&p, None)).contains("shorter"));
        // Right file, wrong requested type.
        npy_file(
            &p,
            1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            64,
            &data,
        );
        let e = err_text(open_vectors::<u8>(&p));
        assert!(e.contains("float32") && e.contains("uint8"), "{e}");
    }

    fn bin_bytes(n: i32, d: i32, payload: usize) -> Vec<u8> {
        let mut v = n.to_le_bytes().to_vec();
        v.extend_from_slice(&d.to_le_bytes());
        v.resize(8 + payload, 7);
        v
    }

    #[test]
    fn bin_bad_inputs() {
        let dir = tmp();
        let p = dir.path().join("x.fbin");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "file is empty"),
            (vec![1, 0, 0, 0, 2], "header is 5 bytes, expected 8"),
            (bin_bytes(-1, 4, 0), "n (number of vectors) is -1"),
            (bin_bytes(2, 0, 0), "d (dimension) is 0"),
            (bin_bytes(2, -3, 0), "d (dimension) is -3"),
            (
                bin_bytes(2, 4, 31),
                "truncated: expected 40 bytes for n=2 d=4 float32, found 39",
            ),
            (bin_bytes(2, 4, 33), "trailing bytes"),
            (bin_bytes(i32::MAX, i32::MAX, 0), "truncated"),
        ];
        for (bytes, want) in cases {
            std::fs::write(&p, &bytes).unwrap();
            let e = err_text(probe(&p, None));
            assert!(e.contains(want), "want {want:?}, got {e}");
            assert!(e.contains("x.fbin"), "{e}");
            assert!(open_vectors::<f32>(&p).is_err());
        }
        // n = 0 is a valid, empty file.
        std::fs::write(&p, bin_bytes(0, 4, 0)).unwrap();
        let m = open_vectors::<f32>(&p).unwrap();
        assert_eq!((m.n(), m.dim()), (0, 4));
    }

    #[test]
    fn dtype_disagreements() {
        let dir = tmp();
        let f = dir.path().join("a.fbin");
        let data = random::<f32>(4, 4, 1);
        write_vectors(&f, MatrixView::new(&data, 4, 4).unwrap()).unwrap();
        let e = err_text(probe(&f, Some(DType::U8)));
        assert!(e.contains("float32") && e.contains("uint8"), "{e}");
        let e = err_text(open_vectors::<i8>(&f));
        assert!(e.contains("float32") && e.contains("int8"), "{e}");
        // A bare .bin takes its dtype from the hint (default float32).
        let b = dir.path().join("a.bin");
        let bytes = random::<u8>(3, 8, 2);
        write_vectors(&b, MatrixView::new(&bytes, 3, 8).unwrap()).unwrap();
        assert_eq!(probe(&b, Some(DType::U8)).unwrap().dtype, DType::U8);
        let e = err_text(probe(&b, None));
        assert!(e.contains("float32") && e.contains("truncated"), "{e}");
        assert_eq!(open_vectors::<u8>(&b).unwrap().as_slice(), &bytes[..]);
        // Writing: the extension's dtype must match.
        let e = err_text(write_vectors(
            &dir.path().join("z.u8bin"),
            MatrixView::new(&data, 4, 4).unwrap(),
        ));
        assert!(e.contains("float32") && e.contains("uint8"), "{e}");
        assert!(write_vectors(
            &dir.path().join("z.bvecs"),
            MatrixView::new(&data, 4, 4).unwrap()
        )
        .is_err());
        assert!(write_vectors(
            &dir.path().join("z.fvecs"),
            MatrixView::new(&bytes, 3, 8).unwrap()
        )
        .is_err());
        let e = err_text(open_vectors::<u8>(&dir.path().join("a.fbin")));
        assert!(e.contains("uint8"));
    }

    #[test]
    fn vecs_bad_inputs() {
        let dir = tmp();
        let p = dir.path().join("v.fvecs");
        let d = 3usize;
        let n = 500usize;
        let mut bytes = Vec::new();
        for r in 0..n {
            bytes.extend_from_slice(&(d as i32).to_le_bytes());
            for c in 0..d {
                bytes.extend_from_slice(&((r * d + c) as f32).to_le_bytes());
            }
        }
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(
            open_vectors::<f32>(&p).unwrap().row(499),
            &[1497.0, 1498.0, 1499.0]
        );
        // A wrong prefix on a row the probe does not spot-check: open names it.
        let row = 4 + 4 * d;
        let mut bad = bytes.clone();
        bad[3 * row..3 * row + 4].copy_from_slice(&4i32.to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        probe(&p, None).unwrap();
        let e = err_text(open_vectors::<f32>(&p));
        assert!(
            e.contains("row 3: dimension prefix is 4, expected 3"),
            "{e}"
        );
        // Two bad rows: the first is named.
        bad[2 * row..2 * row + 4].copy_from_slice(&(-1i32).to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(err_text(open_vectors::<f32>(&p)).contains("row 2:"));
        // The last row is always spot-checked by probe.
        let mut bad = bytes.clone();
        bad[(n - 1) * row..(n - 1) * row + 4].copy_from_slice(&9i32.to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(err_text(probe(&p, None)).contains("row 499"));
        // Size not a multiple of the row size.
        std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
        assert!(err_text(probe(&p, None)).contains("not a multiple of the row size 16"));
        // Empty file, zero / negative dimension.
        std::fs::write(&p, b"").unwrap();
        assert!(err_text(probe(&p, None)).contains("empty"));
        std::fs::write(&p, 0i32.to_le_bytes()).unwrap();
        assert!(err_text(probe(&p, None)).contains("expected d >= 1"));
        std::fs::write(&p, [1u8, 0]).unwrap();
        assert!(err_text(probe(&p, None)).contains("shorter"));
        // Writing zero rows to vecs is refused (unreadable result).
        let e = err_text(write_vectors::<f32>(
            &p,
            MatrixView::new(&[], 0, 3).unwrap(),
        ));
        assert!(e.contains("0 vectors"), "{e}");
    }

    #[test]
    fn unsupported_paths() {
        let dir = tmp();
        let iv = dir.path().join("gt.ivecs");
        std::fs::write(&iv, [1u8, 0, 0, 0, 5, 0, 0, 0]).unwrap();
        let e = err_text(probe(&iv, None));
        assert!(e.contains("int32 ids") && e.contains("ground truth"), "{e}");
        assert!(open_vectors::<f32>(&iv).is_err());
        let data = [1.0f32];
        assert!(write_vectors(&iv, MatrixView::new(&data, 1, 1).unwrap()).is_err());
        for name in ["x.csv", "noext"] {
            let p = dir.path().join(name);
            std::fs::write(&p, b"1,2").unwrap();
            let e = err_text(probe(&p, None));
            assert!(
                e.contains(".fbin") && e.contains(".npy") && e.contains(".fvecs"),
                "{e}"
            );
        }
        let missing: PathBuf = dir.path().join("nope").join("a.fbin");
        let e = err_text(write_vectors(
            &missing,
            MatrixView::new(&data, 1, 1).unwrap(),
        ));
        assert!(e.contains("does not exist"), "{e}");
        assert!(matches!(
            probe(&dir.path().join("absent.fbin"), None),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn rewrite_keeps_mapped_readers_and_leaves_no_temp_files() {
        let dir = tmp();
        let p = dir.path().join("a.fbin");
        let old = random::<f32>(64, 8, 3);
        write_vectors(&p, MatrixView::new(&old, 64, 8).unwrap()).unwrap();
        let mapped = open_vectors::<f32>(&p).unwrap();
        assert!(mapped.is_mapped());
        let new = random::<f32>(2, 8, 4);
        write_vectors(&p, MatrixView::new(&new, 2, 8).unwrap()).unwrap();
        assert_eq!(mapped.as_slice(), &old[..]);
        assert_eq!(open_vectors::<f32>(&p).unwrap().as_slice(), &new[..]);
        write_ground_truth(&dir.path().join("gt.bin"), &sample_gt(2, 2)).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, vec!["a.fbin", "gt.bin"], "{names:?}");
    }

    #[test]
    fn check_finite_names_first_bad_element() {
        let d = 7;
        let n = 30_000; // several parallel chunks
        let mut v = vec![0.5f32; n * d];
        check_finite("base.fbin", MatrixView::new(&v, n, d).unwrap()).unwrap();
        v[25_000 * d + 1] = f32::INFINITY;
        v[20_000 * d + 3] = f32::NAN;
        let e = err_text(check_finite(
            "base.fbin",
            MatrixView::new(&v, n, d).unwrap(),
        ));
        assert!(e.contains("base.fbin: row 20000, column 3 is NaN"), "{e}");
        v[20_000 * d + 3] = 0.0;
        let e = err_text(check_finite("q", MatrixView::new(&v, n, d).unwrap()));
        assert!(e.contains("q: row 25000, column 1 is inf"), "{e}");
        v[2] = f32::NEG_INFINITY;
        let e = err_text(check_finite("q", MatrixView::new(&v, n, d).unwrap()));
        assert!(e.contains("q: row 0, column 2 is -inf"), "{e}");
        let h = vec![f16::from_f32(1.0), f16::NAN, f16::ONE, f16::ONE];
        let e = err_text(check_finite("h", MatrixView::new(&h, 2, 2).unwrap()));
        assert!(e.contains("h: row 0, column 1 is NaN"), "{e}");
        let h = vec![f16::ONE, f16::ONE, f16::ONE, f16::INFINITY];
        assert!(
            err_text(check_finite("h", MatrixView::new(&h, 2, 2).unwrap()))
                .contains("row 1, column 1 is inf")
        );
        check_finite("u", MatrixView::new(&[255u8, 0], 1, 2).unwrap()).unwrap();
        // Finite values whose squared norm overflows float32 distances.
        let mut v = vec![0.5f32; n * d];
        v[17_000 * d + 2] = 1e38;
        v[29_000 * d] = 3e19;
        let e = err_text(check_finite("big", MatrixView::new(&v, n, d).unwrap()));
        assert!(
            e.contains("big: row 17000 has squared norm 1.000e76") && e.contains("scale the data"),
            "{e}"
        );
        v[17_000 * d + 2] = 0.0;
        // 3e19 squared (9e38) is finite in f64 but beyond f32::MAX / 4.
        let e = err_text(check_finite("big", MatrixView::new(&v, n, d).unwrap()));
        assert!(
            e.contains("big: row 29000 has squared norm 9.000e38"),
            "{e}"
        );
        // Just inside the limit: accepted.
        v[29_000 * d] = 9e18;
        check_finite("big", MatrixView::new(&v, n, d).unwrap()).unwrap();
        check_finite("i", MatrixView::new(&[-128i8, 0], 2, 1).unwrap()).unwrap();
        check_finite::<f32>("e", MatrixView::new(&[], 0, 2).unwrap()).unwrap();
    }

    fn sample_gt(n: usize, k: usize) -> GroundTruth {
        GroundTruth {
            n,
            k,
            ids: (0..(n * k) as u32).map(|i| i * 7 % 1000).collect(),
            distances: (0..n * k).map(|i| i as f32 * 0.25 - 3.0).collect(),
        }
    }

    #[test]
    fn ground_truth_file_roundtrip() {
        let dir = tmp();
        let p = dir.path().join("gt.bin");
        for &(n, k) in &[(0usize, 10usize), (1, 1), (13, 10), (100, 100)] {
            let gt = sample_gt(n, k);
            write_ground_truth(&p, &gt).unwrap();
            let len = std::fs::metadata(&p).unwrap().len() as usize;
            assert_eq!(len, 8 + 8 * n * k);
            assert_eq!(read_ground_truth(&p).unwrap(), gt);
        }
        // Ids only: written and read back with empty distances.
        let mut gt = sample_gt(5, 3);
        gt.distances.clear();
        write_ground_truth(&p, &gt).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 8 + 4 * 15);
        assert_eq!(read_ground_truth(&p).unwrap(), gt);
        // Inconsistent lengths are refused.
        let mut bad = sample_gt(5, 3);
        bad.ids.pop();
        assert!(err_text(write_ground_truth(&p, &bad)).contains("14 ids"));
        let mut bad = sample_gt(5, 3);
        bad.distances.push(0.0);
        assert!(err_text(write_ground_truth(&p, &bad)).contains("16 distances"));
    }

    #[test]
    fn ground_truth_file_bad_sizes() {
        let dir = tmp();
        let p = dir.path().join("gt.bin");
        let gt = sample_gt(4, 5);
        write_ground_truth(&p, &gt).unwrap();
        let good = std::fs::read(&p).unwrap();
        let mut longer = good.clone();
        longer.push(0);
        std::fs::write(&p, &longer).unwrap();
        let e = err_text(read_ground_truth(&p));
        assert!(
            e.contains("169 bytes") && e.contains("168") && e.contains("88"),
            "{e}"
        );
        std::fs::write(&p, &good[..100]).unwrap();
        assert!(read_ground_truth(&p).is_err());
        std::fs::write(&p, &good[..6]).unwrap();
        assert!(err_text(read_ground_truth(&p)).contains("expected 8"));
        std::fs::write(&p, b"").unwrap();
        assert!(err_text(read_ground_truth(&p)).contains("empty"));
        std::fs::write(&p, bin_bytes(-2, 5, 0)).unwrap();
        assert!(err_text(read_ground_truth(&p)).contains("n=-2"));
        std::fs::write(&p, bin_bytes(i32::MAX, i32::MAX, 0)).unwrap();
        assert!(read_ground_truth(&p).is_err());
    }

    #[test]
    fn ground_truth_ivecs() {
        let dir = tmp();
        let p = dir.path().join("gt.ivecs");
        let (n, k) = (6usize, 4usize);
        let mut bytes = Vec::new();
        for r in 0..n {
            bytes.extend_from_slice(&(k as i32).to_le_bytes());
            for c in 0..k {
                bytes.extend_from_slice(&((r * 10 + c) as i32).to_le_bytes());
            }
        }
        std::fs::write(&p, &bytes).unwrap();
        let gt = read_ground_truth(&p).unwrap();
        assert_eq!((gt.n, gt.k), (n, k));
        assert_eq!(&gt.ids[4..8], &[10, 11, 12, 13]);
        assert!(gt.distances.is_empty());
        let row = 4 + 4 * k;
        let mut bad = bytes.clone();
        bad[2 * row..2 * row + 4].copy_from_slice(&3i32.to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(err_text(read_ground_truth(&p)).contains("row 2: length prefix is 3, expected 4"));
        let mut bad = bytes.clone();
        bad[row + 8..row + 12].copy_from_slice(&(-1i32).to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(err_text(read_ground_truth(&p)).contains("row 1, column 1: id -1"));
        std::fs::write(&p, &bytes[..bytes.len() - 2]).unwrap();
        assert!(err_text(read_ground_truth(&p)).contains("not a multiple"));
    }

    fn sample_range_gt(counts: &[u64]) -> RangeGroundTruth {
        let mut lims = vec![0u64];
        for c in counts {
            lims.push(lims.last().unwrap() + c);
        }
        let total = *lims.last().unwrap() as usize;
        RangeGroundTruth {
            lims,
            ids: (0..total as u32).map(|i| i * 13 % 977).collect(),
            distances: (0..total).map(|i| i as f32 * 0.5 - 2.0).collect(),
        }
    }

    #[test]
    fn range_ground_truth_file_roundtrip() {
        let dir = tmp();
        let p = dir.path().join("range.bin");
        for counts in [&[][..], &[0], &[3], &[2, 0, 5, 0, 0, 1], &[0, 0, 0]] {
            let gt = sample_range_gt(counts);
            write_range_ground_truth(&p, &gt).unwrap();
            let (n, total) = (counts.len(), gt.ids.len());
            let len = std::fs::metadata(&p).unwrap().len() as usize;
            assert_eq!(len, 8 + 4 * n + 8 * total);
            let back = read_range_ground_truth(&p).unwrap();
            assert_eq!(back, gt);
            assert_eq!(back.n(), n);
            // The header and counts are DiskANN's layout.
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(le_i32(&bytes[0..4]) as usize, n);
            assert_eq!(le_i32(&bytes[4..8]) as usize, total);
            for (i, &c) in counts.iter().enumerate() {
                assert_eq!(le_i32(&bytes[8 + 4 * i..12 + 4 * i]) as u64, c);
            }
        }
        // Ids only (DiskANN writes no distances): read back with none.
        let mut gt = sample_range_gt(&[2, 1]);
        gt.distances.clear();
        write_range_ground_truth(&p, &gt).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 8 + 8 + 12);
        assert_eq!(read_range_ground_truth(&p).unwrap(), gt);
    }

    #[test]
    fn range_ground_truth_refuses_inconsistent_data() {
        let dir = tmp();
        let p = dir.path().join("range.bin");
        let mut bad = sample_range_gt(&[2, 1]);
        bad.ids.pop();
        let e = err_text(write_range_ground_truth(&p, &bad));
        assert!(e.contains("ends at 3") && e.contains("2 ids"), "{e}");
        let mut bad = sample_range_gt(&[2, 1]);
        bad.distances.pop();
        assert!(err_text(write_range_ground_truth(&p, &bad)).contains("2 distances for 3 ids"));
        let mut bad = sample_range_gt(&[2, 1]);
        bad.lims = vec![0, 3, 2];
        bad.ids.truncate(2);
        bad.distances.truncate(2);
        assert!(err_text(write_range_ground_truth(&p, &bad)).contains("decreases at query 1"));
        let mut bad = sample_range_gt(&[2]);
        bad.lims = vec![1, 2];
        assert!(err_text(write_range_ground_truth(&p, &bad)).contains("lims[0] is 1"));
        let mut bad = sample_range_gt(&[]);
        bad.lims.clear();
        assert!(err_text(write_range_ground_truth(&p, &bad)).contains("lims is empty"));
        assert!(!p.exists(), "nothing is written for refused data");
    }

    #[test]
    fn range_ground_truth_file_bad_sizes() {
        let dir = tmp();
        let p = dir.path().join("range.bin");
        let gt = sample_range_gt(&[2, 0, 3]);
        write_range_ground_truth(&p, &gt).unwrap();
        let good = std::fs::read(&p).unwrap();
        assert_eq!(good.len(), 8 + 12 + 40);
        // Truncated and extended files name the file and the sizes.
        for len in [good.len() - 1, good.len() - 21, 21, 9] {
            std::fs::write(&p, &good[..len]).unwrap();
            let e = err_text(read_range_ground_truth(&p));
            assert!(
                e.contains(&format!("{len} bytes")) && e.contains("60") && e.contains("40"),
                "{len}: {e}"
            );
            assert!(e.contains("range.bin"), "{e}");
        }
        let mut longer = good.clone();
        longer.extend_from_slice(&[0; 4]);
        std::fs::write(&p, &longer).unwrap();
        assert!(err_text(read_range_ground_truth(&p)).contains("64 bytes"));
        std::fs::write(&p, &good[..5]).unwrap();
        assert!(err_text(read_range_ground_truth(&p)).contains("expected 8"));
        std::fs::write(&p, b"").unwrap();
        assert!(err_text(read_range_ground_truth(&p)).contains("empty"));
        // Counts that do not add up to the total.
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&3u32.to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        let e = err_text(read_range_ground_truth(&p));
        assert!(e.contains("add up to 6") && e.contains("total=5"), "{e}");
        // A huge header with a small file is refused, not allocated.
        let mut huge = vec![0u8; 16];
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&p, &huge).unwrap();
        assert!(err_text(read_range_ground_truth(&p)).contains("16 bytes"));
        assert!(
            err_text(read_range_ground_truth(&dir.path().join("missing.bin")))
                .contains("missing.bin")
        );
    }

    #[test]
    fn npy_header_is_padded_to_64() {
        for (n, d) in [(0usize, 1usize), (7, 3), (123_456_789, 4096)] {
            for dt in [DType::F32, DType::F16, DType::U8, DType::I8] {
                let h = npy_header(dt, n, d);
                assert_eq!(h.len() % 64, 0);
                assert_eq!(*h.last().unwrap(), b'\n');
                assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize, h.len() - 10);
            }
        }
    }
}
