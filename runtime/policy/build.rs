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
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    let mut generated = String::from("/// Built-in policies: (name, component bytes).\n");
    generated.push_str("pub const BUILTINS: &[(&str, &[u8])] = &[\n");
    // A build without the compiler could not compile them: it runs built-ins precompiled, like
    // any policy, and keeps only their names (its binary is smaller by their ~640 KB).
    let compiler = env::var_os("CARGO_FEATURE_COMPILER").is_some();
    for (name, _) in PLUGINS.iter().filter(|(_, embedded)| *embedded) {
        let path = annotated(workspace, &release, &out_dir, name);
        if compiler {
            writeln!(generated, "    ({name:?}, include_bytes!({:?})),", path.display().to_string()).unwrap();
        } else {
            writeln!(generated, "    ({name:?}, &[]),").unwrap();
        }
    }
    generated.push_str("];\n\n/// Every plugin built from `plugins/`: (crate name, path of the component).\n");
    generated.push_str("pub const ALL_PLUGINS: &[(&str, &str)] = &[\n");
    for (name, _) in PLUGINS {
        let path = annotated(workspace, &release, &out_dir, name);
        writeln!(generated, "    ({name:?}, {:?}),", path.display().to_string()).unwrap();
    }
    generated.push_str("];\n");
    std::fs::write(out_dir.join("plugins.rs"), generated).expect("write plugins.rs");
}

/// The component of plugin `name`, carrying its `metadata.json` (beside its Cargo.toml) in a
/// `perennial:metadata` custom section when it has one, as `perennial plugin annotate` would
/// write it: a copy in OUT_DIR, the nested build's output left as it is. The metadata's
/// validity (its kind, its schema) is checked by the tests (`plugin inspect builtin:...`).
fn annotated(workspace: &Path, release: &Path, out_dir: &Path, name: &str) -> PathBuf {
    let path = artifact(release, name);
    let metadata = ["plugins", "plugins/examples", "plugins/testing"]
        .iter()
        .map(|dir| workspace.join(dir).join(name).join("metadata.json"))
        .find(|file| file.exists());
    let Some(metadata) = metadata else { return path };
    let payload = std::fs::read(&metadata).expect("read a plugin's metadata.json");
    let mut bytes = std::fs::read(&path).expect("read a built plugin");
    custom_section(&mut bytes, "perennial:metadata", &payload);
    let out = out_dir.join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::write(&out, bytes).expect("write an annotated plugin");
    out
}

/// Appends a custom section (id 0, its size, its name, its payload) to a component: the
/// binary format allows one anywhere among the top-level sections.
fn custom_section(bytes: &mut Vec<u8>, name: &str, payload: &[u8]) {
    fn leb128(out: &mut Vec<u8>, mut value: usize) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            out.push(if value == 0 { byte } else { byte | 0x80 });
            if value == 0 {
                break;
            }
        }
    }
    let mut body = Vec::new();
    leb128(&mut body, name.len());
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    bytes.push(0);
    leb128(bytes, body.len());
    bytes.extend_from_slice(&body);
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
