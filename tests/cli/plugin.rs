//! `perennial plugin` as a user runs it: the real binary, real components.

use std::process::{Command, Output};

use perennial_policy::builtin;

const SEDNA_TRIGGER: &str = r#"{"condition":{"operator":">","threshold":500,"metric":"num_of_samples"}}"#;

/// `perennial ARGS` with a compile cache of this test process's own.
pub(crate) fn perennial(args: &[&str]) -> Output {
    let cache = std::env::temp_dir().join(format!("perennial-cli-test-cache-{}", std::process::id()));
    Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(args)
        .env("PERENNIAL_CACHE_DIR", cache)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run perennial")
}

fn stdout_json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("one JSON answer on stdout")
}

/// A user error: exit code 2 and one line on stderr that contains `expected`.
pub(crate) fn assert_user_error(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(expected), "{stderr:?} should contain {expected:?}");
}

#[test]
fn the_readme_example_trains_at_501_and_waits_at_500() {
    let train = perennial(&[
        "plugin",
        "call",
        "builtin:threshold-trigger",
        "--config",
        SEDNA_TRIGGER,
        "--trigger",
        r#"{"pendingTrain":501}"#,
    ]);
    assert_eq!(
        stdout_json(&train),
        serde_json::json!({"train": true, "reason": "num_of_samples 501 > 500", "recheckAfterSecs": 60})
    );
    let wait = perennial(&[
        "plugin",
        "call",
        "builtin:threshold-trigger",
        "--config",
        SEDNA_TRIGGER,
        "--trigger",
        r#"{"pendingTrain":500}"#,
    ]);
    assert_eq!(stdout_json(&wait)["train"], false);
}

#[test]
fn check_prints_world_version_size_and_compile_time() {
    let output = perennial(&["plugin", "check", "builtin:ratio-split", "--config", r#"{"trainProb":0.8}"#]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("world:    splitter-policy (perennial:policy@0.1.0)"), "{text}");
    assert!(text.contains("size:     "), "{text}");
    assert!(text.contains("compile:  "), "{text}");
    assert!(text.contains("config:   accepted"), "{text}");
}

#[test]
fn split_and_select_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let samples = dir.path().join("samples.txt");
    std::fs::write(&samples, "a.jpg 1\nb.jpg 0\nc.jpg 1\nd.jpg 1\ne.jpg 0\n").unwrap();
    let split = perennial(&[
        "plugin",
        "call",
        "builtin:ratio-split",
        "--config",
        r#"{"trainProb":0.6}"#,
        "--split",
        samples.to_str().unwrap(),
    ]);
    assert_eq!(
        stdout_json(&split),
        // Counted over the stream from sample 0: floor(0.6 (k+1)) > floor(0.6 k) trains.
        serde_json::json!({"assignments": ["eval", "train", "eval", "train", "train"], "train": 3, "eval": 2, "skip": 0})
    );

    let select = perennial(&[
        "plugin",
        "call",
        "builtin:metric-select",
        "--config",
        r#"{"metric":"accuracy","minDelta":0.01}"#,
        "--select",
        r#"{"deployed":{"url":"/out/deploy/index.pkl","metrics":{"accuracy":0.80}},
            "candidates":[{"url":"/out/eval/2/a.pkl","metrics":{"accuracy":0.79}},
                          {"url":"/out/eval/2/b.pkl","metrics":{"accuracy":0.86}}]}"#,
    ]);
    let choice = stdout_json(&select);
    assert_eq!(choice["deploy"], 1);
    assert!(choice["reason"].as_str().unwrap().starts_with("accuracy 0.86 beats deployed 0.8"), "{choice}");
}

#[test]
fn the_example_plugin_runs_from_a_file() {
    let path = builtin::built_plugin_path("count-or-age-trigger").unwrap();
    let call = |stats: &str| {
        perennial(&[
            "plugin",
            "call",
            &format!("file://{path}"),
            "--config",
            r#"{"samples":100,"maxAgeHours":1}"#,
            "--trigger",
            stats,
        ])
    };
    assert_eq!(stdout_json(&call(r#"{"pendingTrain":100}"#))["train"], true);
    assert_eq!(stdout_json(&call(r#"{"pendingTrain":5,"secondsSinceLastRound":3600}"#))["train"], true);
    let young = stdout_json(&call(r#"{"pendingTrain":5,"secondsSinceLastRound":600}"#));
    assert_eq!(young["train"], false);
    assert_eq!(young["recheckAfterSecs"], 3000);
}

#[test]
fn bad_input_is_one_clear_line_and_exit_code_2() {
    let trigger = |args: &[&str]| {
        let mut all = vec!["plugin", "call"];
        all.extend_from_slice(args);
        perennial(&all)
    };
    assert_user_error(&trigger(&["builtin:nope", "--trigger", "{}"]), "plugin: unknown built-in \"nope\"");
    assert_user_error(&trigger(&["ftp://x/y.wasm", "--trigger", "{}"]), "unsupported scheme `ftp`");
    assert_user_error(
        &trigger(&["https://example.org/p.wasm", "--trigger", "{}"]),
        "sha256: required for a remote plugin",
    );
    assert_user_error(&trigger(&["/nonexistent/p.wasm", "--trigger", "{}"]), "failed at step `fetch`");
    let digest = "0".repeat(64);
    assert_user_error(
        &trigger(&["builtin:threshold-trigger", "--sha256", &digest, "--config", SEDNA_TRIGGER, "--trigger", "{}"]),
        "failed at step `verify`",
    );
    assert_user_error(
        &trigger(&[
            "builtin:threshold-trigger",
            "--config",
            r#"{"condition":{"operator":"~","threshold":1}}"#,
            "--trigger",
            "{}",
        ]),
        // The built-in's config schema says it first, with what is allowed.
        "condition.operator: \"~\" is not one of >, >=, <, <=",
    );
    assert_user_error(
        &trigger(&["builtin:threshold-trigger", "--config", "{oops", "--trigger", "{}"]),
        "--config is not valid JSON",
    );
    assert_user_error(
        &trigger(&["builtin:threshold-trigger", "--config", SEDNA_TRIGGER, "--trigger", r#"{"pendingTrian":1}"#]),
        "unknown field `pendingTrian`",
    );
    assert_user_error(
        &trigger(&["builtin:ratio-split", "--config", r#"{"trainProb":0.5}"#, "--trigger", "{}"]),
        "is not a trigger policy",
    );
    let not_wasm = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_wasm.path(), b"definitely not wasm").unwrap();
    assert_user_error(
        &trigger(&[not_wasm.path().to_str().unwrap(), "--trigger", "{}"]),
        "is not a valid WebAssembly component",
    );
}

/// A plugin that panics or prints is handled by `plugin call` and `plugin bench` as `perennial
/// run` handles it: the panic is one clear line and exit code 2 (no Rust panic of the CLI), the
/// printing plugin answers, and nothing of the host breaks.
#[test]
fn a_panicking_or_printing_plugin_is_handled_by_call_and_bench() {
    let path = format!("file://{}", builtin::built_plugin_path("hostile-trigger").unwrap());
    let call = |behaviour: &str| {
        perennial(&[
            "plugin",
            "call",
            &path,
            "--config",
            &format!(r#"{{"behaviour":"{behaviour}"}}"#),
            "--trigger",
            r#"{"pendingTrain":1}"#,
        ])
    };
    // The plugin's own stderr is shown as its log lines; the error is the last line.
    let refused = |output: &Output| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
        assert!(!stderr.contains("Cannot start a runtime") && !stderr.contains("runtime/src"), "{stderr}");
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        assert!(last.starts_with("perennial: panicked: hostile plugin panics on purpose"), "{stderr}");
    };
    refused(&call("panic"));
    let printed = call("print");
    assert_eq!(stdout_json(&printed)["reason"], "printed", "{}", String::from_utf8_lossy(&printed.stdout));
    let bench = perennial(&["plugin", "bench", &path, "--config", r#"{"behaviour":"panic"}"#, "--iterations", "5"]);
    refused(&bench);
}

/// A plugin path that never ends (a link to /dev/zero) or is too big is refused at once, by
/// `plugin check` as by every load: no unbounded read.
#[test]
fn a_plugin_that_is_not_a_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("policy.wasm");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let started = std::time::Instant::now();
    let output = perennial(&["plugin", "check", &format!("file://{}", zero.display())]);
    assert_user_error(&output, "not a regular file");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "refused at once");
    let big = dir.path().join("big.wasm");
    std::fs::File::create(&big).unwrap().set_len(65 << 20).unwrap();
    let output = perennial(&["plugin", "check", &format!("file://{}", big.display())]);
    assert_user_error(&output, "over the 67108864-byte limit");
}
