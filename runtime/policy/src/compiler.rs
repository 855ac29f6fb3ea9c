//! Compiling a component in a child process (`perennial plugin compile-into-cache`): the child
//! compiles into the disk cache and exits; the host loads the entry. A compile's working set
//! (hundreds of MB for a Python component) then never stays in a long-running host, a compiler
//! that crashes or runs out of memory ends only the child, and the whole child runs at a low
//! priority, beside the decisions of running jobs.

use std::path::Path;
use std::process::Command;

pub use perennial_artifact::child::{FETCHED, Priority, run_low_priority};

/// The hidden subcommand a child compiles with.
pub const SUBCOMMAND: [&str; 2] = ["plugin", "compile-into-cache"];

/// Compiles `bytes` with `exe` into the cache folder `cache_dir`. The error is the child's
/// own message, or how it ended.
pub fn compile_in_child(exe: &Path, cache_dir: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut command = Command::new(exe);
    command.args(SUBCOMMAND).arg("--cache-dir").arg(cache_dir);
    run_low_priority(command, bytes, Priority::Low)
}

/// Compiles `bytes` with `exe` into a scratch folder, removed after the compile is read back:
/// for a cache folder that keeps nothing (read-only, or full).
pub fn compile_in_scratch(
    exe: &Path,
    engine: &wasmtime::Engine,
    digest: &str,
    bytes: &[u8],
) -> Result<wasmtime::component::Component, String> {
    let scratch = tempfile::tempdir().map_err(|err| format!("no scratch folder to compile into: {err}"))?;
    compile_in_child(exe, scratch.path(), bytes)?;
    let cache = super::cache::DiskCache::new(scratch.path().to_owned(), engine).map_err(|err| err.to_string())?;
    cache.load(engine, digest).ok_or_else(|| {
        format!(
            "neither the compile cache nor a scratch folder ({}) keeps a compile (a full disk?)",
            scratch.path().display()
        )
    })
}
