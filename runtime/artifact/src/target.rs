//! What a precompiled policy is made for: a platform (a target triple, or Pulley, wasmtime's
//! interpreter, where Cranelift has no backend: 32-bit ARM) and the fingerprint of its engine's
//! settings. Without the Wasm runtime: the operator, which compiles for its nodes in a child
//! process, names and checks what they run with it.

use sha2::{Digest as _, Sha256};

/// The pinned wasmtime version (Cargo.toml pins `=48.0.8`): its compiled code runs only on itself.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// The engine settings that shape compiled code, as the policy host's `platform::config` sets
/// them. Change it whenever that changes what it compiles: every node then asks for artifacts
/// anew.
const ENGINE_SETTINGS: &str = "epoch-interruption;cranelift-opt=speed";

/// The platforms `plugin compile --target` knows, besides a target triple: Pulley, by its
/// pointer width.
pub const PULLEY: [&str; 2] = ["pulley32", "pulley64"];

/// The fingerprint of `platform`'s engine: the wasmtime version, the platform and the engine
/// settings, as a SHA-256 (hex, 128 bits). wasmtime checks its own full compatibility again
/// when it deserializes.
pub fn fingerprint(platform: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [WASMTIME_VERSION, platform, ENGINE_SETTINGS] {
        hasher.update((part.len() as u32).to_le_bytes());
        hasher.update(part);
    }
    hex::encode(&hasher.finalize()[..16])
}

/// Whether `platform` is one a compile can target: Pulley, or a triple of an x86_64 or aarch64
/// Linux.
pub fn check_target(platform: &str) -> Result<(), String> {
    // A platform names files and is handed to a compile: a triple's characters only (a node's
    // hello carries it, and `x86_64-linux/../..` must name nothing).
    let plain = platform.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let triple = ["x86_64-", "aarch64-"].iter().any(|arch| platform.starts_with(arch)) && platform.contains("-linux");
    let known = plain && (PULLEY.contains(&platform) || triple);
    if known {
        Ok(())
    } else {
        Err(format!(
            "{platform:?} is not a platform policies compile for: a target triple (x86_64-unknown-linux-gnu, \
             aarch64-unknown-linux-gnu, …) or pulley32 / pulley64 (32-bit ARM and other boards without a \
             native backend: run `perennial plugin platform` on the node to see its own)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_platform_has_its_own_fingerprint_and_it_is_stable() {
        assert_ne!(fingerprint("pulley32"), fingerprint("pulley64"));
        assert_eq!(fingerprint("pulley32"), fingerprint("pulley32"));
        // A digest whose value no Rust release may change: this release's pulley64 engine has
        // had this fingerprint since it was first written, and nodes compare it byte for byte.
        assert_eq!(fingerprint("pulley64"), "130f2047c968ace343866c7a8f859fd5");
    }

    #[test]
    fn unknown_targets_are_refused_with_the_ones_that_work() {
        assert!(check_target("aarch64-unknown-linux-gnu").is_ok());
        assert!(check_target("pulley32").is_ok());
        let err = check_target("armv7-unknown-linux-gnueabihf").expect_err("refused");
        assert!(err.contains("pulley32"), "{err}");
        for odd in ["x86_64-linux/../../etc", "aarch64-unknown-linux-gnu ", "x86_64-unknown-linux-gnu.pcwasm", ""] {
            assert!(check_target(odd).is_err(), "{odd:?} is no platform");
        }
    }
}
