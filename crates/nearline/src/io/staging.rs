//! Durable, atomic creation and replacement of an index directory.
//!
//! A build never writes into the index directory it produces. It fills a
//! hidden *staging* directory beside the target and, once every file is
//! complete, makes the result durable and swaps it into place:
//!
//! 1. [`Staging::begin`] checks the target (an existing target is replaced
//!    only when the caller allows it, it is a directory, the caller's
//!    predicate recognises it as an index, and it holds none of the build's
//!    inputs), recovers what killed builds of the same target left behind,
//!    and creates `.NAME.building-PID` in the target's parent.
//! 2. The build writes its files there ([`Staging::write_file`] writes and
//!    fsyncs; [`Staging::sync_file`] fsyncs a file written by other code).
//! 3. [`Staging::commit`] fsyncs every file of the staging directory and
//!    the directory itself, then replaces the target:
//!    * target absent: `rename` (with `RENAME_NOREPLACE` on Linux, so a
//!      directory that appeared meanwhile is never clobbered);
//!    * target present: `renameat2(RENAME_EXCHANGE)` swaps the old and the
//!      new directory in one step, so at every instant the target path holds
//!      either the complete old index or the complete new one; the old one,
//!      now under the staging name, is then removed. Where the file system
//!      or kernel lacks `RENAME_EXCHANGE` the fallback renames the old
//!      directory to `.NAME.old-PID`, renames the new one in and removes the
//!      old one. Between those two renames (two metadata operations, no data
//!      copied) the target path is briefly absent; a crash exactly there
//!      leaves the old index at `.NAME.old-PID`, and the next `begin` for the
//!      same target moves it back.
//!
//!    The parent directory is fsynced after the rename(s).
//! 4. Dropping a `Staging` that was not committed removes its directory, so
//!    a cancelled or failed build leaves nothing.
//!
//! Leftovers of killed builds (`.NAME.building-PID` and `.NAME.old-PID`
//! whose PID no longer runs) are cleaned by the next `begin` of the same
//! target. Liveness is checked with `kill(pid, 0)`: a directory whose PID is
//! alive (or was reused by an unrelated process) is kept, which is safe but
//! may leave it until that PID exits. Processes that share the parent
//! directory from different PID namespaces (containers on a shared volume)
//! cannot see each other's PIDs and must not build the same target at once.
//! Within one process two builds of the same target at once are refused.
//!
//! Error messages name the target path the user gave, never the staging
//! path: that is the path the user acts on.

use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// Infix of a staging directory's name: `.NAME.building-PID`.
const BUILDING: &str = ".building-";
/// Infix of the old index moved aside by the fallback swap: `.NAME.old-PID`.
const OLD: &str = ".old-";

/// Targets (resolved paths) that a live `Staging` of this process is
/// building. A process's own staging directories are only touched by the
/// `Staging` that owns them; one not listed here is a leftover.
static ACTIVE: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Tests force the fallback swap (no `renameat2`) with this flag.
#[cfg(test)]
static FORCE_FALLBACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn active() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    // A panic while holding the lock cannot leave the set inconsistent
    // (every operation is a single insert or remove).
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A hidden directory beside the target that becomes the target on
/// [`commit`](Staging::commit) and disappears on drop otherwise.
#[derive(Debug)]
pub struct Staging {
    /// The path as the caller gave it: named in every error.
    target: PathBuf,
    /// Where the index directory goes (`target` with a symbolic link at
    /// its end resolved, so a link to an index rebuilds what it points to).
    dest: PathBuf,
    /// The directory holding `dest` and the staging directory.
    parent: PathBuf,
    /// `dest`'s file name.
    name: OsString,
    /// The staging directory.
    path: PathBuf,
    /// `begin` validated an existing target for replacement.
    replace: bool,
    /// The staging directory was renamed into place (or handed over).
    committed: bool,
}

impl Staging {
    /// Prepares a build of `target`.
    ///
    /// * An existing `target` that is not a directory is refused.
    /// * An existing directory is refused unless `overwrite` is set,
    ///   `is_index` accepts it (the caller checks for a valid manifest) and
    ///   no path of `protect` (the build's inputs) lies inside it.
    /// * Leftovers of killed builds of the same target are removed (an old
    ///   index moved aside by an interrupted fallback swap is moved back
    ///   when the target is absent).
    /// * The parent directory is created if needed, then the staging
    ///   directory `.NAME.building-PID` inside it.
    pub fn begin(
        target: &Path,
        overwrite: bool,
        is_index: &dyn Fn(&Path) -> bool,
        protect: &[&Path],
    ) -> Result<Staging> {
        let link = match fs::symlink_metadata(target) {
            Ok(m) => m.file_type().is_symlink(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(context(target, "cannot inspect it", e)),
        };
        let dest = if link {
            fs::canonicalize(target).map_err(|e| {
                Error::arg(format!(
                    "{} is a symbolic link that cannot be resolved ({e}); refusing to replace it",
                    target.display()
                ))
            })?
        } else {
            target.to_path_buf()
        };
        let (parent, name) = split(target, &dest)?;

        let parent_existed = parent.is_dir();
        if parent_existed {
            recover_leftovers(target, &parent, &name, &dest)?;
        }

        let mut replace = false;
        match fs::symlink_metadata(&dest) {
            Ok(m) if !m.is_dir() => {
                return Err(Error::arg(format!(
                    "{} exists and is not a directory; refusing to replace it with an index",
                    target.display()
                )))
            }
            Ok(_) => {
                if !overwrite {
                    return Err(Error::arg(format!(
                        "{} already exists; pass overwrite=True (CLI: --overwrite) to replace it",
                        target.display()
                    )));
                }
                if !is_index(&dest) {
                    return Err(Error::arg(format!(
                        "{} is not a nearline index (no valid manifest.json); refusing to replace it",
                        target.display()
                    )));
                }
                let inside =
                    fs::canonicalize(&dest).map_err(|e| context(target, "cannot resolve it", e))?;
                for p in protect {
                    // A path that does not exist cannot be lost.
                    if let Ok(cp) = fs::canonicalize(p) {
                        if cp.starts_with(&inside) {
                            return Err(Error::arg(format!(
                                "{} is read by this build and lies inside {}; refusing to replace \
                                 the directory that holds it (write the index elsewhere)",
                                p.display(),
                                target.display()
                            )));
                        }
                    }
                }
                replace = true;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(context(target, "cannot inspect it", e)),
        }

        if !parent_existed {
            create_parent(target, &parent)?;
        }

        if !active().insert(dest.clone()) {
            return Err(Error::arg(format!(
                "another build of {} is already running in this process",
                target.display()
            )));
        }
        // From here on, dropping `staging` unregisters and cleans up.
        let staging = Staging {
            path: parent.join(hidden_name(&name, BUILDING, std::process::id())),
            target: target.to_path_buf(),
            dest,
            parent,
            name,
            replace,
            committed: false,
        };
        // A directory of this process's PID that no live `Staging` owns is
        // a leftover (for example an old index whose removal failed).
        remove_any(&staging.path);
        fs::create_dir(&staging.path)
            .map_err(|e| context(target, "cannot create the build directory beside it", e))?;
        Ok(staging)
    }

    /// The staging directory, where the build writes its files.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The target as the caller gave it.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Writes `bytes` to the file `name` of the staging directory (created
    /// or truncated) and fsyncs it. Returns its length and CRC32C, the
    /// values a manifest section records.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(u64, u32)> {
        let plain = !name.is_empty()
            && matches!(
                Path::new(name).components().collect::<Vec<_>>().as_slice(),
                [Component::Normal(_)]
            );
        if !plain {
            return Err(Error::arg(format!(
                "{name:?} is not a plain file name inside the index directory"
            )));
        }
        let path = self.path.join(name);
        let shown = self.target.join(name);
        let mut f = File::create(&path).map_err(|e| Error::io(&shown, e))?;
        f.write_all(bytes).map_err(|e| Error::io(&shown, e))?;
        f.sync_all().map_err(|e| Error::io(&shown, e))?;
        Ok((bytes.len() as u64, crc32c::crc32c(bytes)))
    }

    /// Fsyncs a file written into the staging directory by other code (a
    /// page file written through its own writer). `path` is relative to the
    /// staging directory or absolute. [`commit`](Staging::commit) fsyncs
    /// every file anyway; this lets a phase make its output durable early.
    pub fn sync_file(&self, path: &Path) -> Result<()> {
        let full = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.path.join(path)
        };
        sync_path(&full).map_err(|e| Error::io(self.shown(&full), e))
    }

    /// Makes the staging directory durable and atomically puts it in place
    /// of the target (see the module documentation). On error the target is
    /// left as it was and the staging directory is removed.
    pub fn commit(mut self) -> Result<()> {
        sync_tree(&self.path).map_err(|(p, e)| Error::io(self.shown(&p), e))?;
        match fs::symlink_metadata(&self.dest) {
            Ok(m) => {
                if !self.replace {
                    return Err(Error::arg(format!(
                        "{} was created by someone else while this build ran; not replacing it",
                        self.target.display()
                    )));
                }
                if !m.is_dir() {
                    return Err(Error::arg(format!(
                        "{} was replaced by a file while this build ran; not replacing it",
                        self.target.display()
                    )));
                }
                self.swap_in()
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                rename_noreplace(&self.path, &self.dest).map_err(|e| {
                    context(&self.target, "cannot move the new index into place", e)
                })?;
                self.committed = true;
                sync_path(&self.parent).map_err(|e| {
                    context(&self.target, "cannot make the new index's name durable", e)
                })
            }
            Err(e) => Err(context(&self.target, "cannot inspect it", e)),
        }
    }

    /// Replaces the existing target by the staging directory.
    fn swap_in(&mut self) -> Result<()> {
        match rename_exchange(&self.path, &self.dest) {
            Ok(()) => {
                // The staging path now holds the old index: removing it is
                // what `Drop` does for an uncommitted staging directory.
                self.committed = true;
                let synced = sync_path(&self.parent).map_err(|e| {
                    context(&self.target, "cannot make the new index's name durable", e)
                });
                // A failed removal leaves a leftover that the next `begin`
                // of this target removes; the new index is in place.
                remove_any(&self.path);
                synced
            }
            Err(e) if unsupported(&e) => {
                let old = self
                    .parent
                    .join(hidden_name(&self.name, OLD, std::process::id()));
                remove_any(&old);
                fs::rename(&self.dest, &old)
                    .map_err(|e| context(&self.target, "cannot move the old index aside", e))?;
                // The window: the target path is absent until the next rename.
                if let Err(e) = fs::rename(&self.path, &self.dest) {
                    let _ = fs::rename(&old, &self.dest);
                    return Err(context(
                        &self.target,
                        "cannot move the new index into place",
                        e,
                    ));
                }
                self.committed = true;
                let synced = sync_path(&self.parent).map_err(|e| {
                    context(&self.target, "cannot make the new index's name durable", e)
                });
                remove_any(&old);
                synced
            }
            Err(e) => Err(context(
                &self.target,
                "cannot swap the new index into place",
                e,
            )),
        }
    }

    /// `full` (inside the staging directory) as the user will see it: under
    /// the target.
    fn shown(&self, full: &Path) -> PathBuf {
        match full.strip_prefix(&self.path) {
            Ok(rest) => self.target.join(rest),
            Err(_) => full.to_path_buf(),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            remove_any(&self.path);
        }
        active().remove(&self.dest);
    }
}

/// An I/O error on the user's target with what was being done.
fn context(target: &Path, what: &str, e: io::Error) -> Error {
    Error::io(target, io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// The parent directory and file name of `dest` (`target` names it in errors).
fn split(target: &Path, dest: &Path) -> Result<(PathBuf, OsString)> {
    let mut comps = dest.components();
    match comps.next_back() {
        Some(Component::Normal(name)) => {
            let rest = comps.as_path();
            let parent = if rest.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                rest.to_path_buf()
            };
            Ok((parent, name.to_os_string()))
        }
        _ => Err(Error::arg(format!(
            "{} is not a valid index directory name",
            target.display()
        ))),
    }
}

/// `.NAME<infix>PID`.
fn hidden_name(name: &OsStr, infix: &str, pid: u32) -> OsString {
    let mut s = OsString::from(".");
    s.push(name);
    s.push(infix);
    s.push(pid.to_string());
    s
}

/// The PID of `entry` if it is `.NAME<infix>PID`.
fn parse_hidden(entry: &OsStr, name: &OsStr, infix: &str) -> Option<u32> {
    let prefix = hidden_name(name, infix, 0);
    // Compare bytes: names need not be UTF-8.
    use std::os::unix::ffi::OsStrExt;
    let prefix = prefix.as_bytes();
    let prefix = &prefix[..prefix.len() - 1];
    let rest = entry.as_bytes().strip_prefix(prefix)?;
    if rest.is_empty() || rest.len() > 10 || !rest.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(rest).ok()?.parse().ok()
}

/// Whether process `pid` exists (for our purposes: might still be building).
fn pid_alive(pid: u32) -> bool {
    // PID 0 and values past pid_t's range are never a process; kill(0, ..)
    // and negative values would address process groups.
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks that the process
    // exists and that we may signal it. No memory is passed.
    let r = unsafe { libc::kill(p, 0) };
    // EPERM: it exists but belongs to someone else.
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes what killed builds of `dest` left in `parent`; moves an old
/// index back when an interrupted fallback swap left the target absent.
fn recover_leftovers(target: &Path, parent: &Path, name: &OsStr, dest: &Path) -> Result<()> {
    let entries = match fs::read_dir(parent) {
        Ok(e) => e,
        // Nothing readable, nothing to clean: creating the staging
        // directory reports a real problem with the parent.
        Err(_) => return Ok(()),
    };
    let me = std::process::id();
    let mine_active = active().contains(dest);
    let mut building = Vec::new();
    let mut old = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        for (infix, list) in [(BUILDING, &mut building), (OLD, &mut old)] {
            if let Some(pid) = parse_hidden(&file_name, name, infix) {
                let leftover = if pid == me {
                    !mine_active
                } else {
                    !pid_alive(pid)
                };
                if leftover {
                    list.push(entry.path());
                }
            }
        }
    }
    for p in &building {
        remove_any(p);
    }
    for p in &old {
        let target_absent = matches!(
            fs::symlink_metadata(dest),
            Err(e) if e.kind() == io::ErrorKind::NotFound
        );
        if target_absent {
            fs::rename(p, dest).map_err(|e| {
                context(
                    target,
                    &format!(
                        "a killed build left the previous index at {} and it cannot be moved back",
                        p.display()
                    ),
                    e,
                )
            })?;
            sync_path(parent).map_err(|e| context(target, "cannot sync its parent", e))?;
        } else {
            remove_any(p);
        }
    }
    Ok(())
}

/// Creates `parent` and the missing directories above it, durably.
fn create_parent(target: &Path, parent: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = parent;
    while !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_err() {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(up) => p = up,
            None => break,
        }
    }
    fs::create_dir_all(parent)
        .map_err(|e| context(target, "cannot create its parent directory", e))?;
    // Each new directory's entry lives in the directory above it.
    for dir in missing.iter().rev() {
        let up = match dir.parent() {
            Some(up) if !up.as_os_str().is_empty() => up,
            _ => Path::new("."),
        };
        sync_path(up).map_err(|e| context(target, "cannot sync its parent directory", e))?;
    }
    Ok(())
}

/// Removes a file or directory tree, ignoring errors (leftovers are
/// retried by the next `begin`).
fn remove_any(p: &Path) {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = fs::remove_file(p);
        }
        Err(_) => {}
    }
}

/// Fsyncs a file or directory.
fn sync_path(p: &Path) -> io::Result<()> {
    match File::open(p)?.sync_all() {
        // Some file systems refuse fsync on directories: nothing to do there.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && p.is_dir() => Ok(()),
        r => r,
    }
}

/// Fsyncs every file and directory under `root`, then `root` itself.
fn sync_tree(root: &Path) -> std::result::Result<(), (PathBuf, io::Error)> {
    let entries = fs::read_dir(root).map_err(|e| (root.to_path_buf(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| (root.to_path_buf(), e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| (path.clone(), e))?;
        if kind.is_dir() {
            sync_tree(&path)?;
        } else if kind.is_file() {
            sync_path(&path).map_err(|e| (path, e))?;
        }
    }
    sync_path(root).map_err(|e| (root.to_path_buf(), e))
}

/// Whether a `renameat2` flag failed because the kernel or file system
/// lacks it.
fn unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
        || matches!(
            e.raw_os_error(),
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
        )
}

#[cfg(target_os = "linux")]
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    #[cfg(test)]
    if FORCE_FALLBACK.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let from = std::ffi::CString::new(from.as_os_str().as_bytes())?;
    let to = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: both pointers are NUL-terminated strings that live until the
    // call returns and the kernel only reads them; AT_FDCWD resolves
    // relative paths against the working directory, as `std::fs::rename`
    // does. The raw syscall avoids depending on the C library's wrapper.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn renameat2(_from: &Path, _to: &Path, _flags: u32) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Atomically swaps two existing paths.
fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    let flag = libc::RENAME_EXCHANGE;
    #[cfg(not(target_os = "linux"))]
    let flag = 0;
    renameat2(a, b, flag)
}

/// Renames `from` to `to`, failing if `to` exists. Without
/// `RENAME_NOREPLACE` the check and the rename are two steps.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    let flag = libc::RENAME_NOREPLACE;
    #[cfg(not(target_os = "linux"))]
    let flag = 0;
    match renameat2(from, to, flag) {
        Err(e) if unsupported(&e) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists));
            }
            fs::rename(from, to)
        }
        r => r,
    }
}

#[cfg(test)]
pub(crate) mod crash {
    //! Killing a process at a random point of a staged build.

    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// Runs the `#[ignore]`d test `child_test` of this test binary in a
    /// child process with `envs` set, kills it with SIGKILL after `delay`
    /// (a kill lands wherever the child happens to be) and reaps it.
    /// Panics if the child exited on its own before the kill: the child is
    /// expected to loop until killed.
    pub(crate) fn run_and_kill(child_test: &str, envs: &[(&str, &Path)], delay: Duration) {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = Command::new(exe);
        cmd.args([child_test, "--exact", "--ignored", "--test-threads=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn the crash child");
        std::thread::sleep(delay);
        if let Some(status) = child.try_wait().expect("poll the crash child") {
            panic!("crash child exited before being killed: {status}");
        }
        child.kill().expect("SIGKILL the crash child");
        child.wait().expect("reap the crash child");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::process::Command;
    use std::time::Duration;

    fn has_manifest(p: &Path) -> bool {
        p.join("manifest.json").is_file()
    }

    /// A fake index holding `version` in every file.
    fn write_index(dir: &Path, version: u64) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("pages.bin"), pattern(version, 40_000)).unwrap();
        fs::write(dir.join("ids.bin"), pattern(version + 7, 3_000)).unwrap();
        fs::write(dir.join("manifest.json"), version.to_string()).unwrap();
    }

    fn stage_index(s: &Staging, version: u64) {
        s.write_file("pages.bin", &pattern(version, 40_000))
            .unwrap();
        s.write_file("ids.bin", &pattern(version + 7, 3_000))
            .unwrap();
        s.write_file("manifest.json", version.to_string().as_bytes())
            .unwrap();
    }

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
            .collect()
    }

    /// The version of a complete fake index at `dir`, or a panic naming
    /// what is wrong with it.
    fn intact_version(dir: &Path) -> u64 {
        let v: u64 = fs::read_to_string(dir.join("manifest.json"))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            fs::read(dir.join("pages.bin")).unwrap(),
            pattern(v, 40_000),
            "pages of version {v}"
        );
        assert_eq!(
            fs::read(dir.join("ids.bin")).unwrap(),
            pattern(v + 7, 3_000),
            "ids of version {v}"
        );
        assert_eq!(
            fs::read_dir(dir).unwrap().count(),
            3,
            "files of version {v}"
        );
        v
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn dead_pid() -> u32 {
        let mut c = Command::new("/bin/true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn creates_new_index_and_leaves_no_hidden_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("a/b/idx");
        let s = Staging::begin(&target, false, &has_manifest, &[]).unwrap();
        assert!(s.path().starts_with(tmp.path().join("a/b")));
        let (len, crc) = s.write_file("pages.bin", b"hello").unwrap();
        assert_eq!((len, crc), (5, crc32c::crc32c(b"hello")));
        stage_index(&s, 3);
        s.commit().unwrap();
        assert_eq!(intact_version(&target), 3);
        assert_eq!(names(&tmp.path().join("a/b")), vec!["idx"]);
    }

    #[test]
    fn existing_target_needs_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        write_index(&target, 1);
        let e = Staging::begin(&target, false, &has_manifest, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("overwrite=True") && e.contains("--overwrite"),
            "{e}"
        );
        assert!(e.contains(&target.display().to_string()), "{e}");
        assert_eq!(intact_version(&target), 1);
    }

    #[test]
    fn overwrite_of_non_index_dir_is_refused_and_it_survives() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("photos");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("holiday.jpg"), b"precious").unwrap();
        let e = Staging::begin(&target, true, &has_manifest, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a nearline index"), "{e}");
        assert!(e.contains("no valid manifest.json"), "{e}");
        assert!(e.contains(&target.display().to_string()), "{e}");
        assert_eq!(fs::read(target.join("holiday.jpg")).unwrap(), b"precious");
        assert_eq!(names(tmp.path()), vec!["photos"]);
    }

    #[test]
    fn overwrite_of_dir_holding_the_input_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        write_index(&target, 1);
        let data = target.join("base.fbin");
        fs::write(&data, b"vectors").unwrap();
        let outside = tmp.path().join("other.fbin");
        fs::write(&outside, b"x").unwrap();
        let e = Staging::begin(&target, true, &has_manifest, &[&outside, &data])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&data.display().to_string()), "{e}");
        assert!(e.contains("refusing"), "{e}");
        // Reached through a link from outside: still refused.
        let link = tmp.path().join("link.fbin");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        let e = Staging::begin(&target, true, &has_manifest, &[&link])
            .unwrap_err()
            .to_string();
        assert!(e.contains("link.fbin"), "{e}");
        assert_eq!(fs::read(&data).unwrap(), b"vectors");
        // An input elsewhere does not stop the replacement.
        let s = Staging::begin(&target, true, &has_manifest, &[&outside]).unwrap();
        drop(s);
    }

    #[test]
    fn target_that_is_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        fs::write(&target, b"not a dir").unwrap();
        for overwrite in [false, true] {
            let e = Staging::begin(&target, overwrite, &|_: &Path| true, &[])
                .unwrap_err()
                .to_string();
            assert!(e.contains("is not a directory"), "{e}");
        }
        assert_eq!(fs::read(&target).unwrap(), b"not a dir");
        assert_eq!(names(tmp.path()), vec!["idx"]);
    }

    #[test]
    fn commit_over_a_target_that_became_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        // Replaced by a file while the build ran.
        write_index(&target, 1);
        let s = Staging::begin(&target, true, &has_manifest, &[]).unwrap();
        stage_index(&s, 2);
        fs::remove_dir_all(&target).unwrap();
        fs::write(&target, b"file").unwrap();
        let e = s.commit().unwrap_err().to_string();
        assert!(e.contains("replaced by a file"), "{e}");
        assert_eq!(fs::read(&target).unwrap(), b"file");
        assert_eq!(names(tmp.path()), vec!["idx"]);
        // Created as a file while a fresh build ran.
        let target = tmp.path().join("fresh");
        let s = Staging::begin(&target, true, &has_manifest, &[]).unwrap();
        fs::write(&target, b"file").unwrap();
        let e = s.commit().unwrap_err().to_string();
        assert!(e.contains("created by someone else"), "{e}");
        assert_eq!(fs::read(&target).unwrap(), b"file");
    }

    #[test]
    fn commit_replaces_an_index_atomically() {
        for fallback in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let target = tmp.path().join("idx");
            write_index(&target, 1);
            fs::write(target.join("stale-extra.bin"), b"old only").unwrap();
            let s = Staging::begin(&target, true, &has_manifest, &[]).unwrap();
            stage_index(&s, 2);
            // The old index stays readable until the commit.
            assert!(target.join("stale-extra.bin").exists());
            if fallback {
                FORCE_FALLBACK.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            let r = s.commit();
            FORCE_FALLBACK.store(false, std::sync::atomic::Ordering::Relaxed);
            r.unwrap();
            assert_eq!(intact_version(&target), 2, "fallback={fallback}");
            assert_eq!(names(tmp.path()), vec!["idx"], "fallback={fallback}");
        }
    }

    #[test]
    fn symlinked_index_is_rebuilt_where_it_points() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        write_index(&real, 1);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let s = Staging::begin(&link, true, &has_manifest, &[]).unwrap();
        stage_index(&s, 2);
        s.commit().unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(intact_version(&real), 2);
        assert_eq!(names(tmp.path()), vec!["link", "real"]);
    }

    #[test]
    fn drop_without_commit_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        let s = Staging::begin(&target, false, &has_manifest, &[]).unwrap();
        stage_index(&s, 1);
        fs::create_dir(s.path().join("sub")).unwrap();
        fs::write(s.path().join("sub/x"), b"x").unwrap();
        drop(s);
        assert!(names(tmp.path()).is_empty());
        // Over an existing index: the old one is untouched.
        write_index(&target, 5);
        let s = Staging::begin(&target, true, &has_manifest, &[]).unwrap();
        stage_index(&s, 6);
        drop(s);
        assert_eq!(intact_version(&target), 5);
        assert_eq!(names(tmp.path()), vec!["idx"]);
    }

    #[test]
    fn stale_dirs_of_dead_pids_go_and_live_ones_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        let dead = dead_pid();
        let stale = tmp.path().join(format!(".idx.building-{dead}"));
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("pages.bin"), b"partial").unwrap();
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let live = tmp.path().join(format!(".idx.building-{}", sleeper.id()));
        fs::create_dir(&live).unwrap();
        // Another target's staging directory and a look-alike name stay.
        let other = tmp.path().join(format!(".idx2.building-{dead}"));
        fs::create_dir(&other).unwrap();
        let odd = tmp.path().join(format!(".idx.building-{dead}x"));
        fs::create_dir(&odd).unwrap();
        // A leftover of this very process that no live build owns goes.
        let own = tmp
            .path()
            .join(format!(".idx.building-{}", std::process::id()));
        fs::create_dir(&own).unwrap();
        fs::write(own.join("junk"), b"j").unwrap();

        let s = Staging::begin(&target, false, &has_manifest, &[]).unwrap();
        assert!(!stale.exists());
        assert!(live.exists());
        assert!(other.exists() && odd.exists());
        assert_eq!(s.path(), own.as_path());
        assert!(names(s.path()).is_empty(), "own leftover was reused dirty");
        drop(s);
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }

    #[test]
    fn second_build_of_the_same_target_in_one_process_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        let s = Staging::begin(&target, false, &has_manifest, &[]).unwrap();
        stage_index(&s, 1);
        let e = Staging::begin(&target, false, &has_manifest, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("already running"), "{e}");
        // The refused attempt did not disturb the running build.
        assert_eq!(names(s.path()).len(), 3);
        s.commit().unwrap();
        assert_eq!(intact_version(&target), 1);
    }

    #[test]
    fn old_index_left_by_an_interrupted_fallback_swap_is_restored() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        let dead = dead_pid();
        write_index(&tmp.path().join(format!(".idx.old-{dead}")), 4);
        let half = tmp.path().join(format!(".idx.building-{dead}"));
        write_index(&half, 5);
        let e = Staging::begin(&target, false, &has_manifest, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        assert_eq!(intact_version(&target), 4);
        assert_eq!(names(tmp.path()), vec!["idx"]);
    }

    #[test]
    fn errors_name_the_target_not_the_staging_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        fs::write(&blocker, b"x").unwrap();
        let target = blocker.join("idx");
        let e = Staging::begin(&target, false, &has_manifest, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&target.display().to_string()), "{e}");
        assert!(!e.contains("building"), "{e}");
        let s = Staging::begin(&tmp.path().join("idx"), false, &has_manifest, &[]).unwrap();
        let e = s.write_file("../escape", b"x").unwrap_err().to_string();
        assert!(e.contains("plain file name"), "{e}");
        let e = s
            .sync_file(Path::new("missing.bin"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&tmp.path().join("idx/missing.bin").display().to_string()),
            "{e}"
        );
        assert!(Staging::begin(Path::new("/"), true, &has_manifest, &[]).is_err());
    }

    #[test]
    fn sync_file_accepts_relative_and_absolute_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Staging::begin(&tmp.path().join("idx"), false, &has_manifest, &[]).unwrap();
        fs::write(s.path().join("pages.bin"), b"p").unwrap();
        s.sync_file(Path::new("pages.bin")).unwrap();
        s.sync_file(&s.path().join("pages.bin")).unwrap();
    }

    const CRASH_DIR: &str = "NEARLINE_STAGING_CRASH_DIR";
    const CRASH_FALLBACK: &str = "NEARLINE_STAGING_CRASH_FALLBACK";

    /// The child of `kill_at_random_points_leaves_old_or_new_index`:
    /// rebuilds `$NEARLINE_STAGING_CRASH_DIR/idx` with ever newer versions
    /// until it is killed.
    #[test]
    #[ignore = "run as a child process by kill_at_random_points_leaves_old_or_new_index"]
    fn crash_child() {
        let Some(dir) = std::env::var_os(CRASH_DIR) else {
            return;
        };
        if std::env::var_os(CRASH_FALLBACK).is_some() {
            FORCE_FALLBACK.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let target = PathBuf::from(dir).join("idx");
        let first = intact_version(&target);
        for v in first + 1.. {
            let s = Staging::begin(&target, true, &has_manifest, &[]).unwrap();
            stage_index(&s, v);
            s.commit().unwrap();
        }
    }

    #[test]
    fn kill_at_random_points_leaves_old_or_new_index() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("idx");
        write_index(&target, 1);
        let mut last = 1;
        for trial in 0..24 {
            let fallback = trial % 2 == 1;
            let delay = Duration::from_micros(rng.random_range(1_000..40_000));
            let fb = Path::new("1");
            let mut envs = vec![(CRASH_DIR, tmp.path())];
            if fallback {
                envs.push((CRASH_FALLBACK, fb));
            }
            crash::run_and_kill("io::staging::tests::crash_child", &envs, delay);
            // Right after the kill: the previous or a newer complete index;
            // only the fallback swap has a window with no index at all.
            if target.exists() {
                let v = intact_version(&target);
                assert!(v >= last, "trial {trial}: version went back {last} -> {v}");
            } else {
                assert!(
                    fallback,
                    "trial {trial}: index vanished without the fallback swap"
                );
            }
            // The next build cleans (or restores) what the kill left.
            let s = Staging::begin(&target, true, &has_manifest, &[]).unwrap();
            let v = intact_version(&target);
            assert!(v >= last, "trial {trial}: version went back {last} -> {v}");
            last = v;
            drop(s);
            assert_eq!(names(tmp.path()), vec!["idx"], "trial {trial}");
        }
    }
}
