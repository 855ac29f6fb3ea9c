//! What a node runs: its platform (the target triple it was built for, or Pulley, wasmtime's
//! interpreter, where Cranelift has no backend: 32-bit ARM) and the fingerprint of its engine's
//! settings. A precompiled policy is made for one (platform, fingerprint), and a node loads only
//! its own.

use wasmtime::Config;

pub use perennial_artifact::target::{PULLEY, WASMTIME_VERSION, check_target, fingerprint};

/// Set when the process's engine should run Pulley on a 64-bit host (to try what a 32-bit node
/// runs); read once, before the first policy loads.
pub const PLATFORM_ENV: &str = "PERENNIAL_POLICY_PLATFORM";

/// The platform this process runs policies on: `$PERENNIAL_POLICY_PLATFORM` if it names Pulley,
/// else Pulley where Cranelift has no backend, else the triple this binary was built for.
pub fn this_node() -> &'static str {
    static PLATFORM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PLATFORM.get_or_init(|| {
        let chosen = std::env::var(PLATFORM_ENV)
            .ok()
            .filter(|name| name == "pulley64" && cfg!(target_pointer_width = "64") && cfg!(feature = "compiler"));
        chosen.unwrap_or_else(|| native().to_owned())
    })
}

/// The platform of this binary's own build, without a choice of Pulley.
fn native() -> &'static str {
    let triple = env!("PERENNIAL_TARGET_TRIPLE");
    let has_backend = ["x86_64-", "aarch64-", "riscv64", "s390x-"].iter().any(|arch| triple.starts_with(arch));
    match (has_backend, cfg!(target_pointer_width = "64")) {
        (true, _) => triple,
        (false, true) => "pulley64",
        (false, false) => "pulley32",
    }
}

/// The engine settings for `platform` (`None`: this process's own).
pub fn config(platform: Option<&str>) -> Result<Config, String> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    #[cfg(feature = "compiler")]
    {
        config.parallel_compilation(crate::engine::compiles_in_foreground());
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
    }
    let target = platform.unwrap_or(this_node());
    // The native platform without a target: wasmtime then tunes the code to this machine's CPU;
    // any other is named, and compiled for that platform's baseline.
    if platform.is_some() || target != native() {
        config.target(target).map_err(|err| format!("platform {target}: {err}"))?;
    }
    Ok(config)
}
