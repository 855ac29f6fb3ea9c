//! The on-disk compile cache: compiled components keyed by the component's digest, the
//! wasmtime version and the engine's settings.
//!
//! An entry is `MAGIC`, the SHA-256 of the payload, then the payload (`Component::serialize`).
//! An entry whose checksum does not match, that wasmtime refuses, or that cannot be read is
//! ignored and replaced: it is never trusted and never a crash.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

const MAGIC: &[u8; 8] = b"PRNLCWM1";
/// The pinned wasmtime version (Cargo.toml pins `=48.0.8`).
const WASMTIME_VERSION: &str = "48.0.8";

pub struct DiskCache {
    dir: PathBuf,
    /// wasmtime version + engine settings, as a short hex string.
    engine_key: String,
}

impl DiskCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        WASMTIME_VERSION.hash(&mut hasher);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(DiskCache { dir, engine_key: format!("{:016x}", hasher.finish()) })
    }

    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The cached compilation of `digest`, if there is a sound one.
    pub fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(digest);
        let bytes = std::fs::read(&path).ok()?;
        let payload = verified_payload(&bytes);
        let component = payload.and_then(|payload| {
            // SAFETY: the payload is byte for byte what `store` wrote from
            // `Component::serialize` with this engine's settings (checksum verified above), and
            // wasmtime checks its version and settings again before using it.
            unsafe { Component::deserialize(engine, payload) }.ok()
        });
        if component.is_none() {
            tracing::warn!(path = %path.display(), "ignoring a corrupt or foreign compile cache entry");
            let _ = std::fs::remove_file(&path);
        }
        component
    }

    /// Stores a compilation; failures only cost a recompile later, so they are logged.
    pub fn store(&self, digest: &str, component: &Component) {
        if let Err(err) = self.try_store(digest, component) {
            tracing::warn!(dir = %self.dir.display(), "cannot write the compile cache: {err}");
        }
    }

    fn try_store(&self, digest: &str, component: &Component) -> std::io::Result<()> {
        let payload = component.serialize().map_err(std::io::Error::other)?;
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(MAGIC)?;
        file.write_all(&Sha256::digest(&payload))?;
        file.write_all(&payload)?;
        file.as_file().sync_all()?;
        file.persist(self.path(digest)).map_err(|err| err.error)?;
        Ok(())
    }
}

fn verified_payload(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    if rest.len() < 32 {
        return None;
    }
    let (checksum, payload) = rest.split_at(32);
    (Sha256::digest(payload).as_slice() == checksum).then_some(payload)
}

/// The default cache directory: `$XDG_CACHE_HOME/perennial/policies`, or
/// `~/.cache/perennial/policies`, or a folder in the system's temporary directory.
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("perennial").join("policies")
}
