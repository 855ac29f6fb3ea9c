//! The on-disk compile cache: compiled components keyed by the component's digest, the
//! wasmtime version and the engine's settings.
//!
//! An entry is `MAGIC`, the component's SHA-256 (so an entry copied under another name is
//! caught), the XXH3-128 checksum of the payload, then the payload (`Component::serialize`). The checksum catches a torn or corrupted file; it is fast enough
//! that a load from the cache stays well under a millisecond.
//! An entry whose checksum does not match, that wasmtime refuses, or that cannot be read is
//! ignored and replaced: it is never trusted and never a crash.

use std::hash::{Hash, Hasher};

use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

const MAGIC: &[u8; 8] = b"PRNLCWM3";
use crate::platform::WASMTIME_VERSION;

pub struct DiskCache {
    dir: PathBuf,
    /// wasmtime version + engine settings, as a short hex string.
    engine_key: String,
}

impl DiskCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(DiskCache { dir, engine_key: engine_key(engine) })
    }

    #[cfg(feature = "compiler")]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The cached compilation of `digest`, if there is a sound one.
    pub fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(digest);
        let bytes = std::fs::read(&path).ok()?;
        let payload = verified_payload(&bytes, digest);
        let component = payload.and_then(|payload| {
            // SAFETY: the checksum shows the payload is intact as `store` wrote it from
            // `Component::serialize`, and wasmtime checks its version and settings again. The
            // checksum is no signature: whoever can write the cache directory can plant code, so
            // the directory must belong to the agent alone.
            unsafe { Component::deserialize(engine, payload) }.ok()
        });
        if component.is_none() {
            tracing::warn!(path = %path.display(), "ignoring a corrupt or foreign compile cache entry");
            let _ = std::fs::remove_file(&path);
        }
        component
    }

    #[cfg(feature = "compiler")]
    /// Stores a compilation; failures only cost a recompile later, so they are logged.
    pub fn store(&self, digest: &str, component: &Component) {
        if let Err(err) = self.try_store(digest, component) {
            tracing::warn!(dir = %self.dir.display(), "cannot write the compile cache: {err}");
        }
    }

    #[cfg(feature = "compiler")]
    fn try_store(&self, digest: &str, component: &Component) -> std::io::Result<()> {
        use std::io::Write as _;
        let payload = component.serialize().map_err(std::io::Error::other)?;
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(MAGIC)?;
        file.write_all(&digest_bytes(digest))?;
        file.write_all(&checksum(&payload))?;
        file.write_all(&payload)?;
        file.as_file().sync_all()?;
        file.persist(self.path(digest)).map_err(|err| err.error)?;
        Ok(())
    }
}

/// The wasmtime version and the engine's settings as a SHA-256 (hex, 128 bits): a digest whose
/// value Rust does not change between releases (its `DefaultHasher` may), so a cache outlives an
/// upgrade of the toolchain that built the agent.
pub fn engine_key(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    WASMTIME_VERSION.hash(&mut hasher);
    // Only a compiling build writes this cache (a compiler-free one reads signed artifacts).
    #[cfg(feature = "compiler")]
    engine.precompile_compatibility_hash().hash(&mut hasher);
    #[cfg(not(feature = "compiler"))]
    let _ = engine;
    hex::encode(&hasher.0.finalize()[..16])
}

/// Feeds what a `Hash` implementation writes into SHA-256.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    }
}

fn verified_payload<'a>(bytes: &'a [u8], digest: &str) -> Option<&'a [u8]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let rest = rest.strip_prefix(digest_bytes(digest).as_slice())?;
    if rest.len() < 16 {
        return None;
    }
    let (stored, payload) = rest.split_at(16);
    (checksum(payload) == stored).then_some(payload)
}

fn digest_bytes(digest: &str) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    // The digest is our own lower-case hex; anything else compares unequal.
    let _ = hex::decode_to_slice(digest, &mut bytes);
    bytes
}

fn checksum(payload: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(payload).to_le_bytes()
}

/// The compile cache every subcommand shares (`plugin check` compiles what `run` and `edge`
/// then load): `$PERENNIAL_CACHE_DIR`, else `$XDG_CACHE_HOME/perennial/policies`, or
/// `~/.cache/perennial/policies`, or a folder in the system's temporary directory.
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PERENNIAL_CACHE_DIR").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("perennial").join("policies")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_key_is_a_digest_of_the_engine_settings() {
        let key = engine_key(crate::engine::engine());
        assert_eq!(key.len(), 32, "{key}");
        assert_eq!(key, engine_key(crate::engine::engine()), "the same settings, the same key");
        let mut config = wasmtime::Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::None);
        let other = Engine::new(&config).expect("an engine");
        assert_ne!(key, engine_key(&other), "other settings, another key");
    }
}
