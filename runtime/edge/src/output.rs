//! Writing a job's output: round sample files through OpenDAL, so that a reader never sees a
//! half-written file (a temporary name then a rename on the node's filesystem; a single put on
//! S3). The deployed model is copied the same way, streamed (`model_copy`).

use opendal::{Operator, services};

use perennial_storage::{S3Credentials, StorageError};

/// Name of the folder, inside the output directory, where files are written before their rename.
pub(crate) const TMP_DIR: &str = ".perennial-tmp";

/// Whether an operator can be made for `output_dir`, without touching it (nothing is created).
pub fn check(output_dir: &str, s3: Option<&S3Credentials>) -> Result<(), StorageError> {
    remote_operator(output_dir, s3).map(drop)
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
