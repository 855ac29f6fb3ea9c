//! Compiling a component for a node rather than on it: for any platform a node runs (its
//! triple, or Pulley), signed so that the node can tell it is ours ([`crate::artifact`]).

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;

use crate::artifact;
use crate::error::one_line;
use crate::platform;
use crate::signing::SigningKey;

/// Compiles `component` for `platform` and signs the result with `key`: the bytes of a
/// `.pcwasm` file.
pub fn compile_signed(component: &[u8], platform: &str, key: &SigningKey) -> Result<Vec<u8>, String> {
    let payload = compile_for(component, platform)?;
    let digest = hex::encode(Sha256::digest(component));
    let fingerprint = platform::fingerprint(platform);
    Ok(artifact::seal(&payload, &digest, component.len() as u64, platform, &fingerprint, key))
}

/// Compiles `component` for `platform` (wasmtime's serialized form, unsigned).
pub fn compile_for(component: &[u8], platform: &str) -> Result<Vec<u8>, String> {
    platform::check_target(platform)?;
    let config = platform::config(Some(platform))?;
    let engine = Engine::new(&config).map_err(|err| format!("an engine for {platform}: {err:#}"))?;
    engine.precompile_component(component).map_err(|err| one_line(&format!("{err:#}")))
}
