//! Writing a job's output: round sample files through OpenDAL, so that a reader never sees a
//! half-written file (a temporary name then a rename on the node's filesystem; a single put on
//! S3). The deployed model is copied the same way, streamed (`model_copy`).

use opendal::{Operator, services};

use perennial_storage::{S3Credentials, StorageError};

/// Name of the folder, inside the output directory, where files are written before their rename.
pub(crate) const TMP_DIR: &str = ".perennial-tmp";

/// Whether a job may write in `output_dir`, without touching it (nothing is created): an S3
/// prefix it has credentials for, or a local folder that [`check_local_dir`] accepts. Admission
/// checks this once, so that a job whose round files or reports could never be taken is refused
/// before anything of it is stored.
pub fn check(output_dir: &str, s3: Option<&S3Credentials>) -> Result<(), StorageError> {
    if remote_operator(output_dir, s3)?.is_some() {
        return Ok(());
    }
    check_local_dir(std::path::Path::new(output_dir))
        .map_err(|message| StorageError::Invalid { url: output_dir.to_owned(), message })
}

/// Folders of the system that no job writes in (nor anything under them): `/` itself, the
/// kernel's and the packages' own.
const SYSTEM_FOLDERS: &[&str] =
    &["/proc", "/sys", "/dev", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr"];

/// Folders that everything on the machine shares: a job's output folder (or a dataset's folder,
/// under which the worker API takes model URLs) may be inside one, never one itself.
const SHARED_FOLDERS: &[&str] =
    &["/root", "/run", "/tmp", "/var", "/var/tmp", "/var/lib", "/home", "/srv", "/mnt", "/opt", "/media"];

/// Whether `path` is `/`, a system folder or in one, or a shared folder itself.
pub fn system_folder(path: &std::path::Path) -> bool {
    let path: std::path::PathBuf = path.components().collect(); // `/tmp/` as `/tmp`
    path.parent().is_none()
        || SYSTEM_FOLDERS.iter().any(|folder| path.starts_with(folder))
        || SHARED_FOLDERS.iter().any(|folder| path == std::path::Path::new(folder))
}

/// A local output folder's rules, the ones the worker API holds reports to: an absolute path
/// without `..` (a report of a model under it would be refused as climbing out), not `/` nor a
/// system folder (a model URL anywhere under it would be accepted), and, as far as it exists, a
/// folder this process can write in (checked through symlinks).
pub fn check_local_dir(dir: &std::path::Path) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err("not an absolute path".into());
    }
    if dir.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(
            "has a `..` (the worker API refuses model URLs that climb with `..`); give the folder plainly".into()
        );
    }
    let system = system_folder;
    if system(dir) {
        return Err(
            "is the filesystem's root, a system folder or one all share; give the job a folder of its own".into()
        );
    }
    // The folder, or the nearest of its parents that exists: what would hold it.
    let mut existing = dir;
    while !existing.exists() {
        if std::fs::symlink_metadata(existing).is_ok() {
            return Err(format!("{} is a symlink to nothing (its target does not exist)", existing.display()));
        }
        match existing.parent() {
            Some(parent) => existing = parent,
            None => return Err("no part of it exists".into()),
        }
    }
    let real = existing.canonicalize().map_err(|err| format!("{}: {err}", existing.display()))?;
    if system(&real) {
        return Err(format!(
            "{} is {}, the filesystem's root, a system folder or one all share",
            existing.display(),
            real.display()
        ));
    }
    if !real.is_dir() {
        return Err(format!("{} is not a folder", existing.display()));
    }
    if !writable(&real) {
        return Err(format!("{} is not writable by this process", existing.display()));
    }
    Ok(())
}

/// Whether this process may create files in `dir` (its permissions, a read-only mount).
fn writable(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: a valid NUL-terminated path; access() only reads it.
    unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The operator of an S3 `outputDir`; `None` for a local one; an error for any other scheme.
pub(crate) fn remote_operator(output_dir: &str, s3: Option<&S3Credentials>) -> Result<Option<Operator>, StorageError> {
    if let Some(rest) = output_dir.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        return perennial_storage::s3_operator(output_dir, bucket, &format!("/{prefix}"), s3).map(Some);
    }
    if output_dir.contains("://") {
        return Err(StorageError::Invalid {
            url: output_dir.to_owned(),
            message: "an outputDir is a path or s3://bucket/prefix".into(),
        });
    }
    Ok(None)
}

/// Removes what interrupted writes left in a local `outputDir`'s temporary folder (a kill, a
/// full disk). Only when the job starts: then no write of it is under way.
pub fn clear_temporary(output_dir: &str) {
    if output_dir.contains("://") {
        return;
    }
    let tmp = std::path::Path::new(output_dir).join(TMP_DIR);
    for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// An operator rooted at a job's `outputDir`.
pub fn output_operator(output_dir: &str, s3: Option<&S3Credentials>) -> Result<Operator, StorageError> {
    let io = |source| StorageError::Io { url: output_dir.to_owned(), source };
    if let Some(remote) = remote_operator(output_dir, s3)? {
        return Ok(remote);
    }
    let tmp = std::path::Path::new(output_dir).join(TMP_DIR);
    std::fs::create_dir_all(&tmp).map_err(|err| StorageError::Invalid {
        url: output_dir.to_owned(),
        message: format!("cannot create {}: {err}", tmp.display()),
    })?;
    let tmp = tmp.to_str().unwrap_or_default().to_owned();
    Operator::new(services::Fs::default().root(output_dir).atomic_write_dir(&tmp)).map_err(io)
}

/// The URL of `path` inside `output_dir`, as reported to the control plane and workers.
pub fn url_in(output_dir: &str, path: &str) -> String {
    format!("{}/{}", output_dir.trim_end_matches('/'), path.trim_start_matches('/'))
}
