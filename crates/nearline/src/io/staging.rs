//! Staging directories for index builds (interim version; replaced by the
//! durable, atomic implementation).

use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// A hidden directory beside the target, renamed into place on commit and
/// removed otherwise.
pub struct Staging {
    target: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Staging {
    /// Starts a build of `target`.
    pub fn begin(
        target: &Path,
        overwrite: bool,
        is_index: &dyn Fn(&Path) -> bool,
        _protect: &[&Path],
    ) -> Result<Staging> {
        if target.exists() {
            if !overwrite {
                return Err(Error::arg(format!(
                    "{} already exists; pass overwrite=True (CLI: --overwrite) to replace it",
                    target.display()
                )));
            }
            if !is_index(target) {
                return Err(Error::arg(format!(
                    "{} is not a nearline index (no valid manifest.json); refusing to replace it",
                    target.display()
                )));
            }
        }
        let name = target
            .file_name()
            .ok_or_else(|| Error::arg(format!("{} is not a valid index path", target.display())))?
            .to_string_lossy()
            .to_string();
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(target, e))?;
        let path = parent.join(format!(".{name}.building-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).map_err(|e| Error::io(target, e))?;
        Ok(Staging {
            target: target.to_path_buf(),
            path,
            committed: false,
        })
    }

    /// The staging directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the staging directory into place.
    pub fn commit(mut self) -> Result<()> {
        if self.target.exists() {
            std::fs::remove_dir_all(&self.target).map_err(|e| Error::io(&self.target, e))?;
        }
        std::fs::rename(&self.path, &self.target).map_err(|e| Error::io(&self.target, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
