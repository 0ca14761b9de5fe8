//! Whole-file reads and writes of an index directory's small files: the
//! manifest and the sections, checked against the manifest (size, CRC32C)
//! as they are read, written durably (fsynced) as they are written.

use crate::format::manifest::{Manifest, Section, SectionInfo, MANIFEST_FILE};
use crate::format::section;
use crate::util::HugeBytes;
use crate::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Reads and checks `dir/manifest.json`. A missing directory is an I/O
/// error of kind `NotFound` naming it.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    if !dir.exists() {
        return Err(Error::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "index directory does not exist",
            ),
        ));
    }
    if !dir.is_dir() {
        return Err(Error::format(
            dir,
            "not an index directory (it is a file, not a directory)",
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    Manifest::parse(&path, &text)
}

/// Whether `dir` holds a nearline index (a manifest that parses and checks).
pub fn is_index(dir: &Path) -> bool {
    read_manifest(dir).is_ok()
}

/// Writes `dir/manifest.json` durably: a temporary file, fsynced, renamed
/// over the old one.
pub fn write_manifest(dir: &Path, m: &Manifest) -> Result<()> {
    let path = dir.join(MANIFEST_FILE);
    let tmp = dir.join(".manifest.json.tmp");
    let text = m.to_text(&path)?;
    write_durable(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    sync_dir(dir)
}

/// Writes `bytes` to `path` and fsyncs it.
pub fn write_durable(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

/// Fsyncs a directory (its entries: files created, renamed or removed).
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Writes a section file `file` into `dir` durably and returns its
/// manifest entry (`kind` names its codec).
pub fn write_section(dir: &Path, file: &str, kind: &str, bytes: &[u8]) -> Result<SectionInfo> {
    write_durable(&dir.join(file), bytes)?;
    Ok(SectionInfo {
        file: file.into(),
        kind: kind.into(),
        bytes: bytes.len() as u64,
        crc32c: Some(crc32c::crc32c(bytes)),
    })
}

/// Writes a section file `file` into `dir` durably from what `fill`
/// writes (streamed: the section is never whole in memory) and returns its
/// manifest entry.
pub fn write_section_with(
    dir: &Path,
    file: &str,
    kind: &str,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<SectionInfo> {
    /// Counts and checksums what passes through.
    struct Summing<W: Write> {
        inner: W,
        crc: u32,
        bytes: u64,
    }
    impl<W: Write> Write for Summing<W> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let k = self.inner.write(buf)?;
            self.crc = crc32c::crc32c_append(self.crc, &buf[..k]);
            self.bytes += k as u64;
            Ok(k)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.inner.flush()
        }
    }
    let path = dir.join(file);
    let f = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
    let mut w = Summing {
        inner: std::io::BufWriter::with_capacity(1 << 20, f),
        crc: 0,
        bytes: 0,
    };
    fill(&mut w).map_err(|e| Error::io(&path, e))?;
    let (crc, bytes) = (w.crc, w.bytes);
    let f = w
        .inner
        .into_inner()
        .map_err(|e| Error::io(&path, e.into_error()))?;
    f.sync_all().map_err(|e| Error::io(&path, e))?;
    Ok(SectionInfo {
        file: file.into(),
        kind: kind.into(),
        bytes,
        crc32c: Some(crc),
    })
}

/// Bytes [`read_section_stream`] reads at a time: what streaming a section
/// holds besides what its reader keeps (a cache taking back entries while
/// searches run counts it against the memory budget).
pub const SECTION_STREAM_CHUNK: usize = 64 << 10;

/// Reads section `s` in chunks handed to `each` (never whole in memory),
/// checked against the manifest: the size before reading, the CRC32C at
/// the end. `each` may see bytes of a damaged section before the checksum
/// fails, so what it builds is only good once this returns `Ok`.
pub fn read_section_stream(
    dir: &Path,
    m: &Manifest,
    s: Section,
    each: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    use std::io::Read;
    let (mut file, path, info, len) = open_section(dir, m, s)?;
    let mut buf = vec![0u8; SECTION_STREAM_CHUNK.min(len.max(1))];
    let mut left = len;
    let mut crc = 0u32;
    while left > 0 {
        let k = buf.len().min(left);
        file.read_exact(&mut buf[..k])
            .map_err(|e| truncated_while_read(&path, s, e))?;
        crc = crc32c::crc32c_append(crc, &buf[..k]);
        each(&buf[..k])?;
        left -= k;
    }
    if let Some(want) = info.crc32c {
        if want != crc {
            return Err(Error::corrupt(
                &path,
                format!(
                    "section {:?} fails its CRC32C check (expected {want:#010x}, got {crc:#010x})",
                    s.name()
                ),
            ));
        }
    }
    Ok(())
}

/// The file of section `s` (the manifest's path when it has none).
pub fn section_path(dir: &Path, m: &Manifest, s: Section) -> PathBuf {
    match m.sections.get(&s) {
        Some(info) if !info.file.is_empty() => dir.join(&info.file),
        _ => dir.join(MANIFEST_FILE),
    }
}

/// Opens the file of section `s` once its size is known to be what the
/// manifest records: a damaged manifest may name a file that is not a
/// regular file (a device such as `/dev/zero` never ends; opening a FIFO
/// blocks), or one of another size. Returns the open file, its path, the
/// manifest entry and the size as a `usize`.
fn open_section<'m>(
    dir: &Path,
    m: &'m Manifest,
    s: Section,
) -> Result<(std::fs::File, PathBuf, &'m SectionInfo, usize)> {
    let info = m.section(&dir.join(MANIFEST_FILE), s)?;
    let path = dir.join(&info.file);
    // Checked before opening: open(2) on a FIFO waits for a writer.
    let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
    if !meta.is_file() {
        return Err(Error::corrupt(
            &path,
            format!("section {:?} is not a regular file", s.name()),
        ));
    }
    let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
    if len != info.bytes {
        return Err(section::size_error(&path, s.name(), len, info.bytes));
    }
    let len = usize::try_from(len).map_err(|_| {
        Error::corrupt(
            &path,
            format!("section {:?} is too large for this machine", s.name()),
        )
    })?;
    Ok((file, path, info, len))
}

/// The error for a section file that ended before the size it had when it
/// was opened.
fn truncated_while_read(path: &Path, s: Section, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Error::corrupt(
            path,
            format!("section {:?} was truncated while it was read", s.name()),
        )
    } else {
        Error::io(path, e)
    }
}

/// Reads section `s` whole, checked against the manifest (size, CRC32C).
/// The size is checked before reading, and no more than it is read.
pub fn read_section(dir: &Path, m: &Manifest, s: Section) -> Result<Vec<u8>> {
    use std::io::Read;
    let (file, path, info, len) = open_section(dir, m, s)?;
    let mut bytes = vec![0u8; len];
    (&file)
        .read_exact(&mut bytes)
        .map_err(|e| truncated_while_read(&path, s, e))?;
    section::check(&path, s.name(), info, &bytes)?;
    Ok(bytes)
}

/// [`read_section`] into a table the search reads at random rows (in huge
/// pages when it is large; see [`HugeBytes`]).
pub fn read_section_huge(dir: &Path, m: &Manifest, s: Section) -> Result<HugeBytes> {
    read_section_growable(dir, m, s, None)
}

/// [`read_section_huge`] into a table that can grow by `room` bytes
/// without moving ([`HugeBytes::growable`]; `None`: a fixed table).
pub fn read_section_growable(
    dir: &Path,
    m: &Manifest,
    s: Section,
    room: Option<usize>,
) -> Result<HugeBytes> {
    let (file, path, info, len) = open_section(dir, m, s)?;
    let bytes = match room {
        Some(room) => HugeBytes::read_growable(file, len, room),
        None => HugeBytes::read_from(file, len),
    }
    .map_err(|e| truncated_while_read(&path, s, e))?;
    section::check(&path, s.name(), info, &bytes)?;
    Ok(bytes)
}

/// Fsyncs a file written by other code (the page file's writer).
pub fn sync_file(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(path, e))
}
