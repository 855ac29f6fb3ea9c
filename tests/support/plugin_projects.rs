#![allow(dead_code)] // each test or bench uses part of it
//! Policy projects as a plugin author makes them: `perennial plugin new` in a folder outside
//! the repository, then each language's own tools, exactly as the project's README says.
//! A missing tool fails with how to install it (`scripts/test` installs them all).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The folder of the `perennial` that made the projects: first on the PATH of the projects'
/// own commands (their build annotates the component, their tests run `plugin test`).
static PERENNIAL_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Runs `program args` in `dir`; fails with its output when it fails. Returns stdout + stderr.
pub fn run_in(dir: &Path, program: &str, args: &[&str], env: &[(&str, &Path)]) -> String {
    let mut command = Command::new(program);
    command.args(args).current_dir(dir);
    if let Some(perennial) = PERENNIAL_DIR.get() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let paths = std::iter::once(perennial.clone()).chain(std::env::split_paths(&path));
        command.env("PATH", std::env::join_paths(paths).expect("PATH"));
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap_or_else(|err| {
        panic!("{program}: {err} (plugin authors' tools must be on PATH: run scripts/test, which installs them)")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{program} {args:?} in {} failed:\n{text}", dir.display());
    text
}

/// `perennial plugin new KIND NAME --lang LANG` run in `root`; returns the project's folder.
pub fn new_project(perennial: &Path, root: &Path, kind: &str, lang: &str, name: &str) -> PathBuf {
    if let Some(folder) = perennial.parent() {
        PERENNIAL_DIR.get_or_init(|| std::path::absolute(folder).unwrap_or_else(|_| folder.to_owned()));
    }
    run_in(root, perennial.to_str().unwrap(), &["plugin", "new", kind, name, "--lang", lang], &[]);
    let dir = root.join(name);
    assert!(dir.join("README.md").is_file(), "plugin new made no README in {}", dir.display());
    dir
}

/// Runs the project's test command (as its README says): its native tests, then its component
/// built (and annotated with its metadata) and run on its fixtures (`perennial plugin test`).
/// Returns their output; the component is where [`component`] says.
pub fn project_tests(lang: &str, dir: &Path, cargo_target: &Path) -> String {
    match lang {
        "rust" => run_in(dir, "make", &["test"], &[("CARGO_TARGET_DIR", cargo_target)]),
        "python" => run_in(dir, "make", &["test"], &[]),
        "js" => {
            run_in(dir, "npm", &["install", "--no-audit", "--no-fund"], &[]);
            run_in(dir, "npm", &["test"], &[])
        }
        other => panic!("no language {other}"),
    }
}

/// Where the project's build puts its component.
pub fn component(lang: &str, dir: &Path, name: &str, cargo_target: &Path) -> PathBuf {
    let file = format!("{}.wasm", name.replace('-', "_"));
    match lang {
        "rust" => cargo_target.join("wasm32-wasip2/release").join(file),
        _ => dir.join(file),
    }
}

/// Builds the component with the README's command; returns its path.
pub fn build(lang: &str, kind: &str, dir: &Path, name: &str, cargo_target: &Path) -> PathBuf {
    let file = format!("{}.wasm", name.replace('-', "_"));
    match lang {
        "rust" => {
            let env = [("CARGO_TARGET_DIR", cargo_target)];
            run_in(dir, "cargo", &["build", "--release", "--target", "wasm32-wasip2"], &env);
            cargo_target.join("wasm32-wasip2/release").join(file)
        }
        "python" => {
            let world = format!("{kind}-policy");
            run_in(dir, "componentize-py", &["-d", "wit", "-w", &world, "componentize", "app", "-o", &file], &[]);
            dir.join(file)
        }
        "js" => {
            if !dir.join("node_modules").exists() {
                run_in(dir, "npm", &["install", "--no-audit", "--no-fund"], &[]);
            }
            run_in(dir, "npm", &["run", "build"], &[]);
            dir.join(file)
        }
        other => panic!("no language {other}"),
    }
}

/// A job whose trigger (`policy`, a YAML flow mapping, or none) never fires: only ingestion decides.
pub fn never_training_job(name: &str, policy: Option<&str>) -> String {
    let container = |role: &str| {
        format!(
            "      spec:\n        containers:\n          - name: {role}\n            image: none\n            command: [\"true\"]\n"
        )
    };
    let policy = policy.map(|p| format!("\n      policy: {p}")).unwrap_or_default();
    format!(
        "apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata: {{name: {name}, namespace: default}}
spec: {{url: data/{name}/index.txt, format: txt, nodeName: local}}
---
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {{name: {name}, namespace: default}}
spec:
  dataset: {{name: {name}, trainProb: 0.8}}
  outputDir: output/{name}
  trainSpec:
    trigger:
      condition: {{operator: '>=', threshold: 100000000, metric: num_of_samples}}{policy}
    template:
{}  evalSpec:
    template:
{}  deploySpec:
    template:
{}",
        container("train"),
        container("eval"),
        container("inference")
    )
}
