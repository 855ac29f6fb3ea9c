//! `perennial plugin new KIND NAME --lang rust|python|js`: a policy project of its own, outside
//! any checkout of Perennial, with the WIT contract (and for Rust the SDK) vendored in, native
//! tests, one build command and a README that says the rest.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::ValueEnum;

/// The WIT contract every project vendors.
const WIT: &str = include_str!("../../../../wit/policy.wit");

/// The Rust SDK, vendored as `vendor/perennial-guest` (its own manifest: no workspace).
const RUST_SDK: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("../../../../guest-sdk/Cargo.toml")),
    ("README.md", include_str!("../../../../guest-sdk/README.md")),
    ("wit/policy.wit", WIT),
    ("src/lib.rs", include_str!("../../../../guest-sdk/src/lib.rs")),
    ("src/config.rs", include_str!("../../../../guest-sdk/src/config.rs")),
    ("src/log.rs", include_str!("../../../../guest-sdk/src/log.rs")),
    ("src/metrics.rs", include_str!("../../../../guest-sdk/src/metrics.rs")),
    ("src/selector.rs", include_str!("../../../../guest-sdk/src/selector.rs")),
    ("src/splitter.rs", include_str!("../../../../guest-sdk/src/splitter.rs")),
    ("src/state.rs", include_str!("../../../../guest-sdk/src/state.rs")),
    ("src/trigger.rs", include_str!("../../../../guest-sdk/src/trigger.rs")),
];

/// The kind of decision a policy makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyKind {
    Trigger,
    Splitter,
    Selector,
}

/// The language a policy is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

impl PolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Trigger => "trigger",
            PolicyKind::Splitter => "splitter",
            PolicyKind::Selector => "selector",
        }
    }

    /// The job's field that names a policy of this kind.
    fn job_field(self) -> &'static str {
        match self {
            PolicyKind::Trigger => "trainSpec.trigger.policy",
            PolicyKind::Splitter => "dataset.splitPolicy",
            PolicyKind::Selector => "deploySpec.selectPolicy",
        }
    }

    /// A config the example policy accepts.
    fn example_config(self) -> &'static str {
        match self {
            PolicyKind::Trigger => r#"{"samples": 3}"#,
            PolicyKind::Splitter => r#"{"evalEvery": 2}"#,
            PolicyKind::Selector => r#"{"metric": "accuracy"}"#,
        }
    }

    /// `perennial plugin call` of the example policy, for the README.
    fn example_call(self, wasm: &str) -> String {
        let config = self.example_config();
        match self {
            PolicyKind::Trigger => {
                format!("perennial plugin call {wasm} --config '{config}' --trigger '{{\"pendingTrain\": 5}}'")
            }
            PolicyKind::Splitter => {
                format!("printf 'a\\nb\\n\\nd\\n' | perennial plugin call {wasm} --config '{config}' --split -")
            }
            PolicyKind::Selector => format!(
                "perennial plugin call {wasm} --config '{config}' \\\n  --select '{{\"deployed\": null, \"candidates\": \
                 [{{\"url\": \"/models/1\", \"format\": \"pkl\", \"metrics\": {{\"accuracy\": 0.9}}}}]}}'"
            ),
        }
    }
}

/// What `plugin new` made.
#[derive(Debug)]
pub struct Made {
    pub dir: PathBuf,
    /// The commands that test and build it, for the message.
    pub next_steps: Vec<String>,
}

/// Makes the project `name` in `dir` (which must not exist, or be empty).
pub fn make(kind: PolicyKind, name: &str, lang: Lang, dir: &Path) -> anyhow::Result<Made> {
    check_name(name)?;
    if dir.exists() && dir.read_dir().with_context(|| format!("{}", dir.display()))?.next().is_some() {
        bail!("{}: already exists and is not empty; choose another NAME or --dir", dir.display());
    }
    let file = name.replace('-', "_");
    let world = format!("{}-policy", kind.name());
    let wasm = match lang {
        Lang::Rust => format!("target/wasm32-wasip2/release/{file}.wasm"),
        Lang::Python | Lang::Js => format!("{file}.wasm"),
    };
    // The example config inside a JSON string (package.json's scripts).
    let quoted = serde_json::to_string(kind.example_config()).expect("a string is JSON");
    let config_in_json = &quoted[1..quoted.len() - 1];
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{file}}", &file)
            .replace("{{kind}}", kind.name())
            .replace("{{world}}", &world)
            .replace("{{field}}", kind.job_field())
            .replace("{{config}}", kind.example_config())
            .replace("{{call}}", &kind.example_call(&wasm))
            .replace("{{componentize_js}}", COMPONENTIZE_JS)
            .replace("{{config_in_json}}", config_in_json)
    };
    // Every project: its metadata (written into the component by the build) and fixtures (run
    // by its test command).
    let (metadata, fixtures) = match kind {
        PolicyKind::Trigger => (
            include_str!("../../templates/common/metadata_trigger.yaml.in"),
            include_str!("../../templates/common/fixtures_trigger.json"),
        ),
        PolicyKind::Splitter => (
            include_str!("../../templates/common/metadata_splitter.yaml.in"),
            include_str!("../../templates/common/fixtures_splitter.json"),
        ),
        PolicyKind::Selector => (
            include_str!("../../templates/common/metadata_selector.yaml.in"),
            include_str!("../../templates/common/fixtures_selector.json"),
        ),
    };
    let mut files: Vec<(String, String)> =
        vec![("metadata.yaml".into(), fill(metadata)), ("fixtures/decisions.json".into(), fixtures.into())];
    let next_steps = match lang {
        Lang::Rust => {
            files.push(("Cargo.toml".into(), fill(include_str!("../../templates/rust/Cargo.toml.in"))));
            files.push(("Makefile".into(), fill(include_str!("../../templates/common/Makefile_rust.in"))));
            files.push(("README.md".into(), fill(include_str!("../../templates/rust/README.md.in"))));
            files.push((".gitignore".into(), include_str!("../../templates/rust/gitignore").into()));
            let policy = match kind {
                PolicyKind::Trigger => include_str!("../../templates/rust/trigger.rs"),
                PolicyKind::Splitter => include_str!("../../templates/rust/splitter.rs"),
                PolicyKind::Selector => include_str!("../../templates/rust/selector.rs"),
            };
            files.push(("src/lib.rs".into(), policy.into()));
            for (path, text) in RUST_SDK {
                files.push((format!("vendor/perennial-guest/{path}"), (*text).into()));
            }
            vec!["make test".into(), "make".into()]
        }
        Lang::Python => {
            let (policy, app, test) = match kind {
                PolicyKind::Trigger => (
                    include_str!("../../templates/python/policy_trigger.py"),
                    include_str!("../../templates/python/app_trigger.py"),
                    include_str!("../../templates/python/test_trigger.py"),
                ),
                PolicyKind::Splitter => (
                    include_str!("../../templates/python/policy_splitter.py"),
                    include_str!("../../templates/python/app_splitter.py"),
                    include_str!("../../templates/python/test_splitter.py"),
                ),
                PolicyKind::Selector => (
                    include_str!("../../templates/python/policy_selector.py"),
                    include_str!("../../templates/python/app_selector.py"),
                    include_str!("../../templates/python/test_selector.py"),
                ),
            };
            files.push(("policy.py".into(), policy.into()));
            files.push(("app.py".into(), app.into()));
            files.push(("test_policy.py".into(), test.into()));
            files.push((
                "perennial_policy.py".into(),
                include_str!("../../templates/python/perennial_policy.py").into(),
            ));
            files.push(("README.md".into(), fill(include_str!("../../templates/python/README.md.in"))));
            files.push(("Makefile".into(), fill(include_str!("../../templates/common/Makefile_python.in"))));
            files.push((".gitignore".into(), include_str!("../../templates/python/gitignore").into()));
            files.push(("wit/policy.wit".into(), WIT.into()));
            vec!["make test".into(), "make".into()]
        }
        Lang::Js => {
            let (policy, app, test) = match kind {
                PolicyKind::Trigger => (
                    include_str!("../../templates/js/policy_trigger.js"),
                    include_str!("../../templates/js/app_trigger.js"),
                    include_str!("../../templates/js/policy_trigger.test.js"),
                ),
                PolicyKind::Splitter => (
                    include_str!("../../templates/js/policy_splitter.js"),
                    include_str!("../../templates/js/app_splitter.js"),
                    include_str!("../../templates/js/policy_splitter.test.js"),
                ),
                PolicyKind::Selector => (
                    include_str!("../../templates/js/policy_selector.js"),
                    include_str!("../../templates/js/app_selector.js"),
                    include_str!("../../templates/js/policy_selector.test.js"),
                ),
            };
            files.push(("policy.js".into(), policy.into()));
            files.push(("app.js".into(), app.into()));
            files.push(("policy.test.js".into(), test.into()));
            files.push(("perennial-policy.js".into(), include_str!("../../templates/js/perennial-policy.js").into()));
            files.push(("package.json".into(), fill(include_str!("../../templates/js/package.json.in"))));
            files.push(("README.md".into(), fill(include_str!("../../templates/js/README.md.in"))));
            files.push((".gitignore".into(), include_str!("../../templates/js/gitignore").into()));
            files.push(("wit/policy.wit".into(), WIT.into()));
            vec!["npm install".into(), "npm test".into(), "npm run build".into()]
        }
    };
    for (path, text) in &files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("{}: cannot create it", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("{}: cannot write it", path.display()))?;
    }
    Ok(Made { dir: dir.to_owned(), next_steps })
}

/// The componentize-js the JavaScript projects build with (a version known to work).
const COMPONENTIZE_JS: &str = "0.23.0";

/// A name that is a crate, a file and a folder name at once.
fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!("NAME {name:?}: use lower-case letters, digits, '-' and '_', starting with a letter (at most 64)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_and_language_makes_a_project() {
        let root = tempfile::tempdir().unwrap();
        for kind in [PolicyKind::Trigger, PolicyKind::Splitter, PolicyKind::Selector] {
            for lang in [Lang::Rust, Lang::Python, Lang::Js] {
                let dir = root.path().join(format!("{kind:?}-{lang:?}").to_lowercase());
                make(kind, "my-policy", lang, &dir).unwrap();
                let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
                assert!(!readme.contains("{{"), "{kind:?} {lang:?}: a placeholder is left in the README");
                for made in ["metadata.yaml", "Makefile", "package.json"] {
                    if let Ok(text) = std::fs::read_to_string(dir.join(made)) {
                        assert!(!text.contains("{{"), "{kind:?} {lang:?}: a placeholder is left in {made}");
                    }
                }
                // The metadata is what `plugin annotate` accepts, of the project's kind.
                #[cfg(feature = "authoring")]
                let metadata = crate::cli::plugin_meta::read_file(&dir.join("metadata.yaml")).unwrap();
                #[cfg(feature = "authoring")]
                assert_eq!((metadata.name.as_str(), metadata.kind.as_str()), ("my-policy", kind.name()));
                let fixtures: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(dir.join("fixtures/decisions.json")).unwrap())
                        .unwrap();
                assert!(fixtures.as_array().unwrap().iter().all(|d| d["kind"] == kind.name()), "{fixtures}");
                let wit = if lang == Lang::Rust { "vendor/perennial-guest/wit/policy.wit" } else { "wit/policy.wit" };
                assert_eq!(std::fs::read_to_string(dir.join(wit)).unwrap(), WIT);
            }
        }
    }

    #[test]
    fn a_bad_name_or_a_used_folder_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let err = make(PolicyKind::Trigger, "My Policy", Lang::Rust, &root.path().join("x")).unwrap_err();
        assert!(err.to_string().starts_with("NAME \"My Policy\""), "{err}");
        std::fs::write(root.path().join("keep.txt"), "mine").unwrap();
        let err = make(PolicyKind::Trigger, "ok", Lang::Rust, root.path()).unwrap_err();
        assert!(err.to_string().contains("already exists and is not empty"), "{err}");
        assert_eq!(std::fs::read_to_string(root.path().join("keep.txt")).unwrap(), "mine");
    }
}
