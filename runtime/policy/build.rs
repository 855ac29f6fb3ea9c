//! Builds the policy plugins in `plugins/` as WebAssembly components (`wasm32-wasip2`), in the
//! manner of wasmtime's test-programs artifacts crate: a nested `cargo build` with its own
//! target directory, whose outputs are embedded (built-ins) or exposed by path (test plugins).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

/// (crate, embedded in the binary as `builtin:<crate>`)
const PLUGINS: &[(&str, bool)] = &[
    ("threshold-trigger", true),
    ("ratio-split", true),
    ("first-select", true),
    ("metric-select", true),
    ("count-or-age-trigger", false),
    ("hostile-trigger", false),
    ("hostile-splitter", false),
    ("hostile-selector", false),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir.ancestors().nth(2).expect("runtime/policy/ is inside the workspace");
    for watched in ["guest-sdk", "plugins", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    // The platform a node names when it asks for precompiled policies (src/platform.rs).
    println!("cargo:rustc-env=PERENNIAL_TARGET_TRIPLE={}", env::var("TARGET").expect("set by cargo"));

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    ensure_target(&rustc);

    let target_dir =
        env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target")).join("plugins");
    build_plugins(workspace, &target_dir);

    let release = target_dir.join(TARGET).join("release");
    let mut generated = String::from("/// Built-in policies: (name, component bytes).\n");
    generated.push_str("pub const BUILTINS: &[(&str, &[u8])] = &[\n");
    // A build without the compiler could not compile them: it runs built-ins precompiled, like
    // any policy, and keeps only their names (its binary is smaller by their ~640 KB).
    let compiler = env::var_os("CARGO_FEATURE_COMPILER").is_some();
    for (name, _) in PLUGINS.iter().filter(|(_, embedded)| *embedded) {
        let path = artifact(&release, name);
        if compiler {
            writeln!(generated, "    ({name:?}, include_bytes!({:?})),", path.display().to_string()).unwrap();
        } else {
            writeln!(generated, "    ({name:?}, &[]),").unwrap();
        }
    }
    generated.push_str("];\n\n/// Every plugin built from `plugins/`: (crate name, path of the component).\n");
    generated.push_str("pub const ALL_PLUGINS: &[(&str, &str)] = &[\n");
    for (name, _) in PLUGINS {
        let path = artifact(&release, name);
        writeln!(generated, "    ({name:?}, {:?}),", path.display().to_string()).unwrap();
    }
    generated.push_str("];\n");
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo")).join("plugins.rs");
    std::fs::write(&out, generated).expect("write plugins.rs");
}

fn artifact(release: &Path, name: &str) -> PathBuf {
    let path = release.join(format!("{}.wasm", name.replace('-', "_")));
    assert!(path.exists(), "plugin {name} was built but {} is missing", path.display());
    path
}

/// Installs the wasm32-wasip2 standard library through rustup if it is missing, or stops with
/// one line that says how.
fn ensure_target(rustc: &str) {
    let installed = || {
        Command::new(rustc)
            .args(["--print", "sysroot"])
            .output()
            .ok()
            .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
            .is_some_and(|sysroot| sysroot.join("lib/rustlib").join(TARGET).exists())
    };
    if installed() {
        return;
    }
    println!("cargo:warning=installing the {TARGET} target with rustup (plugins are built for it)");
    let added = Command::new("rustup").args(["target", "add", TARGET]).status();
    if !(matches!(added, Ok(status) if status.success()) && installed()) {
        panic!("the {TARGET} target is missing: run `rustup target add {TARGET}` and build again");
    }
}

fn build_plugins(workspace: &Path, target_dir: &Path) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .args(["build", "--release", "--locked", "--target", TARGET, "--target-dir"])
        .arg(target_dir);
    for (name, _) in PLUGINS {
        command.args(["-p", name]);
    }
    // Small, self-contained components; none of the host's flags or wrappers (clippy, coverage).
    command
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env_remove("CARGO_TARGET_DIR");
    let status = command.status().expect("run cargo to build the plugins");
    assert!(status.success(), "building the plugins in plugins/ for {TARGET} failed (see above)");
}
