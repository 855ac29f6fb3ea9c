//! Plugin authors, as the README walks them through: `perennial plugin new` in an empty folder
//! outside the repository, for Rust, Python (componentize-py from PyPI) and JavaScript
//! (componentize-js from npm); the project's own test command (its native tests, then the
//! component built, annotated with the project's metadata.yaml and run on its fixtures); `plugin
//! inspect` showing the metadata, `plugin check` and `plugin call` of the component; then the
//! component deciding a job's rounds.
//!
//! The Python and JavaScript toolchains must be installed (`scripts/test` installs them); a missing
//! one fails these tests, never skips them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::embedded::{Example, wait_exit};
use crate::support::plugin_projects::{component, new_project, project_tests};

const CONFIG: &str = r#"{"samples": 3}"#;

fn perennial_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_perennial"))
}

fn perennial(args: &[&str], cache: &Path) -> Output {
    Command::new(perennial_bin())
        .args(args)
        .env("PERENNIAL_CACHE_DIR", cache)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run perennial")
}

/// One target folder across runs for the Rust projects, so that a second run is quick.
fn cargo_target() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-authors")
}

/// A trigger made, tested and built in `lang` from an empty folder: (its folder's keeper, the
/// component). Made once per test process: the swap test uses the Python one too.
pub fn trigger_component(lang: &'static str) -> &'static Path {
    static MADE: [OnceLock<(tempfile::TempDir, PathBuf)>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match lang {
        "rust" => &MADE[0],
        "python" => &MADE[1],
        _ => &MADE[2],
    };
    let (_, wasm) = slot.get_or_init(|| {
        let root = tempfile::tempdir().unwrap();
        let name = format!("{lang}-trigger");
        let dir = new_project(perennial_bin(), root.path(), "trigger", lang, &name);
        let tests = project_tests(lang, &dir, &cargo_target());
        let passed = match lang {
            "rust" => tests.contains("test result: ok. 3 passed"),
            "python" => tests.contains("Ran 3 tests") && tests.contains("\nOK"),
            _ => tests.contains("# pass 3") && tests.contains("# fail 0"),
        };
        assert!(passed, "{lang}: the project's own tests did not pass:\n{tests}");
        // ... then its build, annotating the component, and its fixtures, all answered as expected.
        assert!(tests.contains(&format!(": {name} 0.1.0 (trigger); sha256 ")), "{lang}: the build annotates:\n{tests}");
        assert!(tests.contains("2 decisions: 2 agree, 0 disagree, 0 not comparable"), "{lang}: plugin test:\n{tests}");
        let wasm = component(lang, &dir, &name, &cargo_target());
        assert!(wasm.is_file(), "{lang}: the build made no {}", wasm.display());
        (root, wasm)
    });
    wasm
}

/// `plugin inspect`, `plugin check` and `plugin call` of the built component, as its README says.
fn check_and_call(lang: &str, wasm: &Path, cache: &Path) {
    let wasm = wasm.to_str().unwrap();
    // The metadata the build wrote in: shown, and as JSON.
    let inspect = perennial(&["plugin", "inspect", wasm], cache);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success(), "inspect: {}", String::from_utf8_lossy(&inspect.stderr));
    assert!(text.contains("world:       trigger-policy (perennial:policy@"), "{text}");
    assert!(
        text.contains(&format!("name:        {lang}-trigger\n")) && text.contains("kind:        trigger\n"),
        "{text}"
    );
    assert!(text.contains("  samples (integer; default 100; at least 1)\n      New train samples"), "{text}");
    let json = perennial(&["plugin", "inspect", wasm, "--output", "json"], cache);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["metadata"]["name"], format!("{lang}-trigger"), "{json}");
    assert_eq!(json["metadata"]["configSchema"]["properties"]["maxAgeHours"]["default"], 24, "{json}");
    // A config with a misspelt field: refused by the schema, naming it, before the policy runs.
    let refused = perennial(&["plugin", "check", wasm, "--config", r#"{"sample": 3}"#], cache);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sample: unknown field (this policy reads: maxAgeHours, samples)"), "{stderr}");
    let check = perennial(&["plugin", "check", wasm, "--config", CONFIG], cache);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "check: {}", String::from_utf8_lossy(&check.stderr));
    assert!(text.contains("trigger-policy"), "{text}");
    let call = perennial(&["plugin", "call", wasm, "--config", CONFIG, "--trigger", r#"{"pendingTrain": 5}"#], cache);
    assert!(call.status.success(), "call: {}", String::from_utf8_lossy(&call.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&call.stdout).unwrap();
    assert_eq!(answer["train"], true, "{answer}");
    assert_eq!(answer["reason"], "5 new samples (at least 3)", "{answer}");
    // A wait: the policy's own debug line, shown to its author without RUST_LOG, apart from the
    // host's lines.
    let wait = perennial(&["plugin", "call", wasm, "--config", CONFIG, "--trigger", r#"{"pendingTrain": 1}"#], cache);
    let stderr = String::from_utf8_lossy(&wait.stderr);
    assert!(wait.status.success(), "call: {stderr}");
    assert!(stderr.contains("policy debug: 1 of 3 samples"), "the policy's log line: {stderr}");
    // A config the policy refuses: one line naming the field.
    let refused = perennial(&["plugin", "check", wasm, "--config", r#"{"samples": 0}"#], cache);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("samples: "), "{stderr}");
}

/// The component as the thermal-comfort job's trigger, through two rounds: the rounds start when
/// it says so, and its reason is on the job.
fn two_rounds_with(wasm: &Path, cache: &Path) {
    let reference = format!("file://{}", wasm.display());
    let policy = format!(
        "        metric: num_of_samples\n      policy: {{plugin: {reference:?}, config: {{samples: 150}}, limits: {{memoryMiB: 128, timeoutMs: 1000}}}}\n"
    );
    let mut example = Example::new(|_, text| text.replace("        metric: num_of_samples\n", &policy));
    example.cache = Some(cache.to_owned());
    let mut run = example.start(&["--rounds", "2"]);
    let out = wait_exit(&mut run, Duration::from_secs(180));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "perennial run: {stderr}");
    let status = &example.status()[0]["status"];
    assert_eq!(status["roundsCompleted"], 2, "{status}");
    let trigger = &status["policies"]["trigger"];
    assert_eq!(trigger["plugin"], reference.as_str(), "{trigger}");
    assert_eq!(trigger["health"], "Serving", "{trigger}");
    assert_eq!(trigger["lastDecision"]["answer"], "train", "{trigger}");
    let reason = trigger["lastDecision"]["reason"].as_str().unwrap_or_default();
    assert!(reason.ends_with("new samples (at least 150)"), "the plugin's own reason is on the job: {trigger}");
    fixtures_from_the_job(wasm, cache, &example);
}

/// The job's real decisions as the author's fixtures (`plugin test`): the component answers them
/// all as recorded; an expected answer changed in them fails the test, naming the decision.
fn fixtures_from_the_job(wasm: &Path, cache: &Path, example: &Example) {
    let decisions = example.decisions("thermal-comfort");
    let triggers = decisions.iter().filter(|d| d["kind"] == "trigger").count();
    assert!(triggers >= 2, "the job's trigger decisions: {decisions:?}");
    let fixtures = cache.join("fixtures.json");
    std::fs::write(&fixtures, serde_json::to_string_pretty(&decisions).unwrap()).unwrap();
    let wasm = wasm.to_str().unwrap();
    let args = ["plugin", "test", wasm, "--config", r#"{"samples": 150}"#, fixtures.to_str().unwrap()];
    let passed = perennial(&args, cache);
    let said = String::from_utf8_lossy(&passed.stdout);
    assert_eq!(passed.status.code(), Some(0), "{said}{}", String::from_utf8_lossy(&passed.stderr));
    assert!(said.contains(" disagree, 0 not comparable") && said.contains(" agree, 0 disagree"), "{said}");
    // The first round's start, expected as a wait: the policy trains there, so the test fails.
    let mut changed = decisions.clone();
    let start = changed.iter_mut().find(|d| d["kind"] == "trigger" && d["answer"]["train"] == true).unwrap();
    start["answer"]["train"] = false.into();
    std::fs::write(&fixtures, serde_json::to_string_pretty(&changed).unwrap()).unwrap();
    let failed = perennial(&args, cache);
    let said = String::from_utf8_lossy(&failed.stdout);
    assert_eq!(failed.status.code(), Some(1), "{said}{}", String::from_utf8_lossy(&failed.stderr));
    assert!(said.contains(" agree, 1 disagree") && said.contains("candidate: train"), "{said}");
}

fn walk_through(lang: &'static str) {
    let cache = tempfile::tempdir().unwrap();
    let wasm = trigger_component(lang);
    check_and_call(lang, wasm, cache.path());
    two_rounds_with(wasm, cache.path());
}

#[test]
fn a_rust_policy_from_an_empty_folder_decides_a_jobs_rounds() {
    walk_through("rust");
}

#[test]
fn a_python_policy_from_an_empty_folder_decides_a_jobs_rounds() {
    walk_through("python");
}

#[test]
fn a_javascript_policy_from_an_empty_folder_decides_a_jobs_rounds() {
    walk_through("js");
}
