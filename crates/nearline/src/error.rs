//! The crate's error type. Every message names the file, the field and what
//! was expected, so a user can act on it without reading the source.

use std::path::{Path, PathBuf};

/// Errors returned by every public function of the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error while touching `path`.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file exists but its contents do not have the expected shape
    /// (wrong size, wrong header, unexpected dtype, bad value).
    #[error("invalid file {path}: {msg}")]
    Format { path: PathBuf, msg: String },
    /// A checksum or structural check failed: the file was damaged.
    #[error("corrupt index data in {path}: {msg}")]
    Corrupt { path: PathBuf, msg: String },
    /// The index was written by a newer, incompatible format version.
    #[error("unsupported index format in {path}: {msg}")]
    Version { path: PathBuf, msg: String },
    /// A caller-supplied argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation was cancelled (for example Ctrl-C during a build).
    #[error("operation cancelled")]
    Cancelled,
    /// The I/O engine could not be set up or failed while running.
    #[error("I/O engine error: {0}")]
    Engine(String),
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
    /// A malformed file.
    pub fn format(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }
    /// A damaged file (checksum or structure).
    pub fn corrupt(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }
    /// A bad caller argument.
    pub fn arg(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}
