//! One process per state folder: `perennial run` and `perennial edge` hold an exclusive lock on
//! `<state-dir>/lock` while they run, so that a second one on the same folder stops at once
//! (saying who holds it) instead of ingesting, training and writing files beside the first.
//! The kernel drops the lock when the process ends, however it ends (kill -9 included).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Held for the life of the process; dropping it releases the folder.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("--state-dir {dir}: in use by another perennial ({holder}); stop it first, or use another --state-dir")]
    Held { dir: String, holder: String },
    #[error("--state-dir {dir}: cannot lock it: {source}")]
    Io { dir: String, source: std::io::Error },
}

/// Locks `dir` (which exists) for this process, recording `what` (e.g. `perennial run`) and
/// the pid for whoever finds it taken.
pub fn lock(dir: &Path, what: &str) -> Result<StateLock, LockError> {
    let io = |source| LockError::Io { dir: dir.display().to_string(), source };
    let mut file =
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("lock")).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.take(256).read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() { "a process that is starting".to_owned() } else { holder.to_owned() };
            return Err(LockError::Held { dir: dir.display().to_string(), holder });
        }
        Err(TryLockError::Error(source)) => return Err(io(source)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    write!(file, "{what}, pid {}", std::process::id()).map_err(io)?;
    Ok(StateLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_and_the_lock_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock(dir.path(), "perennial run").unwrap();
        let refused = lock(dir.path(), "perennial run").unwrap_err().to_string();
        assert!(
            refused.contains(&format!("in use by another perennial (perennial run, pid {})", std::process::id())),
            "{refused}"
        );
        drop(first);
        lock(dir.path(), "perennial edge").expect("free again once the holder is gone");
    }
}
