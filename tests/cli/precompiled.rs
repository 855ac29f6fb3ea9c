//! Precompiled policies, as a user makes and runs them: `plugin keygen`, `plugin compile
//! --target … --sign-key`, and what a node loads with `--trust-key` — and each thing it refuses,
//! on real files. Then a whole round of `perennial edge` on precompiled trigger, splitter and
//! selector: native, on Pulley (wasmtime's interpreter, what 32-bit ARM runs), and, given the
//! binary, the compiler-free armv7 agent under `qemu-arm`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::support::embedded::dies_with_its_test;

const JOB: &str = "default/precompiled";
/// The compiler-free agent for armv7 (`.ci/arm` builds it), run under qemu-arm.
const ARMV7_BINARY: &str = "PERENNIAL_TEST_ARMV7_BINARY";

fn perennial(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(args)
        .current_dir(dir)
        .env("PERENNIAL_CACHE_DIR", dir.join("cache"))
        .env("RUST_LOG", "warn")
        .env_remove("PERENNIAL_POLICY_PLATFORM")
        .output()
        .expect("run perennial")
}

fn ok(output: Output) -> String {
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A refusal: a non-zero exit and one line on stderr that contains `expected`.
fn refused(output: Output, expected: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "accepted, expected a refusal with {expected:?}");
    assert!(stderr.contains(expected), "{stderr:?} should contain {expected:?}");
    stderr
}

fn this_platform(dir: &Path) -> String {
    let out = ok(perennial(&["plugin", "platform"], dir));
    out.lines().find_map(|line| line.strip_prefix("platform:")).expect("a platform line").trim().to_owned()
}

/// Compiles `builtin` for `platform` into `dir`; returns the file and the component's sha256.
fn compile(dir: &Path, builtin: &str, platform: &str) -> (PathBuf, String) {
    let out = ok(perennial(
        &["plugin", "compile", &format!("builtin:{builtin}"), "--target", platform, "--sign-key", "k.key"],
        dir,
    ));
    let sha = out.lines().find_map(|line| line.rsplit_once("pin): ")).expect("the pin line").1.to_owned();
    (dir.join(format!("{builtin}.{platform}.pcwasm")), sha)
}

#[test]
fn a_signed_policy_loads_and_every_altered_or_foreign_one_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    ok(perennial(&["plugin", "keygen", "k"], dir));
    ok(perennial(&["plugin", "keygen", "other"], dir));
    let native = this_platform(dir);
    let (trigger, sha) = compile(dir, "threshold-trigger", &native);
    let trigger = trigger.to_str().unwrap();
    let config = r#"{"condition":{"operator":">","threshold":500}}"#;
    let call = |extra: &[&str]| {
        let mut args = vec!["plugin", "call", "--config", config, "--trigger", r#"{"pendingTrain":501}"#];
        args.extend_from_slice(extra);
        perennial(&args, dir)
    };

    let answer = ok(call(&[trigger, "--trust-key", "k.pub", "--sha256", &sha]));
    assert!(answer.contains(r#""train":true"#), "{answer}");
    let checked = ok(perennial(&["plugin", "check", trigger, "--trust-key", "k.pub"], dir));
    assert!(checked.contains(&format!("precompiled for {native}")) && checked.contains(&sha), "{checked}");

    // Who may sign: nobody, without a trusted key; not another key.
    refused(call(&[trigger]), "this node trusts no key (give it --trust-key)");
    refused(call(&[trigger, "--trust-key", "other.pub"]), "not by the key this node trusts");
    // The pin names the source component, compiled or not.
    refused(call(&[trigger, "--trust-key", "k.pub", "--sha256", &"0".repeat(64)]), "compiled from a component");

    // A flipped byte anywhere in the compiled code.
    let bytes = std::fs::read(trigger).unwrap();
    for at in [bytes.len() - 1, bytes.len() / 2] {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x40;
        std::fs::write(dir.join("flipped.pcwasm"), &flipped).unwrap();
        refused(call(&["flipped.pcwasm", "--trust-key", "k.pub"]), "corrupt or altered");
    }
    // Another platform's code.
    let foreign = if native.starts_with("aarch64") { "x86_64-unknown-linux-gnu" } else { "aarch64-unknown-linux-gnu" };
    let (other_platform, _) = compile(dir, "threshold-trigger", foreign);
    refused(
        call(&[other_platform.to_str().unwrap(), "--trust-key", "k.pub"]),
        &format!("it is compiled for {foreign}, and this node runs {native}"),
    );
    // Code for another engine (another Perennial release), signed by the right key.
    let key = perennial_policy::signing::SigningKey::from_file(&dir.join("k.key")).unwrap();
    let payload = perennial_policy::precompile::compile_for(
        perennial_policy::builtin::component("threshold-trigger").unwrap(),
        &native,
    )
    .unwrap();
    let stale = perennial_policy::artifact::seal(&payload, &sha, 1, &native, &"e".repeat(32), &key);
    std::fs::write(dir.join("stale.pcwasm"), stale).unwrap();
    refused(call(&["stale.pcwasm", "--trust-key", "k.pub"]), "compile it again with this version");
}

#[test]
fn compile_and_keygen_refuse_bad_input_and_write_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    ok(perennial(&["plugin", "keygen", "k"], dir));
    let key_before = std::fs::read(dir.join("k.key")).unwrap();
    refused(perennial(&["plugin", "keygen", "k"], dir), "never overwritten");
    assert_eq!(std::fs::read(dir.join("k.key")).unwrap(), key_before, "the key is as it was");

    std::fs::create_dir(dir.join("out")).unwrap();
    let compile = |extra: &[&str]| {
        let mut args = vec!["plugin", "compile", "builtin:ratio-split", "--out-dir", "out"];
        args.extend_from_slice(extra);
        perennial(&args, dir)
    };
    let stderr = refused(compile(&["--target", "armv7-unknown-linux-gnueabihf", "--sign-key", "k.key"]), "--target");
    assert!(stderr.contains("pulley32"), "the refusal names what 32-bit ARM runs: {stderr}");
    refused(compile(&["--target", "pulley32", "--sign-key", "missing.key"]), "missing.key");
    refused(compile(&["--target", "pulley32", "--sign-key", "k.pub"]), "not a PEM PRIVATE KEY");
    refused(compile(&["--target", "pulley32", "--sign-key", "k.key", "--sha256", &"0".repeat(64)]), "--sha256 says");
    refused(
        perennial(
            &[
                "plugin",
                "compile",
                "builtin:ratio-split",
                "--target",
                "pulley32",
                "--sign-key",
                "k.key",
                "--out-dir",
                "nowhere",
            ],
            dir,
        ),
        "--out-dir nowhere is not a folder",
    );
    let written: Vec<_> = std::fs::read_dir(dir.join("out")).unwrap().collect();
    assert!(written.is_empty(), "refused compiles wrote {written:?}");

    // A precompiled policy is not compiled again.
    let (artifact, _) = self::compile(dir, "ratio-split", "pulley32");
    refused(
        perennial(
            &["plugin", "compile", artifact.to_str().unwrap(), "--target", "pulley32", "--sign-key", "k.key"],
            dir,
        ),
        "already a precompiled policy",
    );
}

/// How to start an agent: the command (a binary, or qemu and a binary) and its platform.
struct Launcher {
    command: Vec<OsString>,
    platform: String,
    env: Vec<(&'static str, &'static str)>,
    /// How long a round may take (an emulated agent is slower).
    patience: Duration,
}

impl Launcher {
    fn native(dir: &Path) -> Self {
        let platform = this_platform(dir);
        let command = vec![env!("CARGO_BIN_EXE_perennial").into()];
        Launcher { command, platform, env: vec![], patience: Duration::from_secs(60) }
    }

    fn start(&self, args: &[OsString]) -> Child {
        let mut command = Command::new(&self.command[0]);
        dies_with_its_test(&mut command)
            .args(&self.command[1..])
            .args(args)
            .envs(self.env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the agent")
    }
}

/// A whole round of `perennial edge --jobs` whose trigger, splitter and selector are all
/// precompiled for `launcher`'s platform: samples are split, the trigger starts round 1, the
/// test plays the workers (a trained, then an evaluated model), and the selector deploys it.
fn a_round_on_precompiled_policies(launcher: &Launcher, dir: &Path) {
    let index = dir.join("data/index.txt");
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    let output = dir.join("output");
    let state = dir.join("state");
    let (trigger, trigger_sha) = compile(dir, "threshold-trigger", &launcher.platform);
    let (splitter, splitter_sha) = compile(dir, "ratio-split", &launcher.platform);
    let (selector, selector_sha) = compile(dir, "first-select", &launcher.platform);
    let jobs = serde_json::json!([{
        "name": JOB,
        "uid": "uid-precompiled",
        "spec": {"datasetUrl": index, "datasetFormat": "txt", "outputDir": output, "trainProb": 0.8},
        "splitter": {"plugin": splitter, "sha256": splitter_sha, "config": {"trainProb": 0.8}},
        "trigger": {"plugin": trigger, "sha256": trigger_sha,
                    "config": {"checkPeriodSeconds": 1, "condition": {"operator": ">=", "threshold": 150}}},
        "selector": {"plugin": selector, "sha256": selector_sha}
    }]);
    std::fs::write(dir.join("jobs.json"), jobs.to_string()).unwrap();
    let samples: String = (0..200).map(|i| format!("images/{i:08}.jpg {}\n", i % 5)).collect();
    std::fs::write(&index, samples).unwrap();

    let args: Vec<OsString> = ["edge", "--bind-address", "127.0.0.1", "--bind-port", "0", "--poll-ms", "50"]
        .iter()
        .map(OsString::from)
        .chain(["--state-dir".into(), state.clone().into()])
        .chain(["--jobs".into(), dir.join("jobs.json").into()])
        .chain(["--trust-key".into(), dir.join("k.pub").into()])
        .chain(["--cache-dir".into(), dir.join("cache").into()])
        .collect();
    let mut agent = launcher.start(&args);
    let deployed = output.join("deploy/index.pkl");
    let started = Instant::now();
    while !deployed.exists() {
        if started.elapsed() > launcher.patience || agent.try_wait().unwrap().is_some() {
            let _ = agent.kill();
            let log = agent.wait_with_output().map(|out| String::from_utf8_lossy(&out.stderr).into_owned());
            panic!(
                "no model deployed within {:?} on {}; the agent's log:\n{}",
                launcher.patience,
                launcher.platform,
                log.unwrap_or_default()
            );
        }
        play_workers(&state, &output);
        std::thread::sleep(Duration::from_millis(100));
    }
    // Stopped as systemd stops it (SIGTERM): the model file is written before the deploy's
    // transaction commits, and a SIGKILL between the two (a wide window under qemu) would leave
    // the selector's decision unrecorded, as the crash it is. The agent ends its turn first.
    let _ = std::process::Command::new("kill").args(["-TERM", &agent.id().to_string()]).status();
    let stopping = Instant::now();
    while agent.try_wait().unwrap().is_none() && stopping.elapsed() < launcher.patience {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(std::fs::read(&deployed).unwrap(), b"eval-model-1", "the evaluated model of round 1 is deployed");
    let train = std::fs::read_to_string(output.join("data/train/1/data.txt")).unwrap();
    let eval = std::fs::read_to_string(output.join("data/eval/1/data.txt")).unwrap();
    assert_eq!(train.lines().count() + eval.lines().count(), 200, "every sample split once: {train}{eval}");

    // Each decision was made by the precompiled policies, named by their component's digest.
    let records = ok(perennial(&["decisions", JOB, "--state-dir", state.to_str().unwrap(), "--output", "json"], dir));
    let records: Vec<serde_json::Value> = serde_json::from_str(&records).expect("the decisions as JSON");
    for (kind, sha) in [("trigger", &trigger_sha), ("splitter", &splitter_sha), ("selector", &selector_sha)] {
        assert!(
            records.iter().any(|record| record["kind"] == kind
                && record["policy"]["digest"].as_str().is_some_and(|digest| digest.contains(sha.as_str()))),
            "a {kind} decision by {sha}: {records:#?}"
        );
    }
}

/// Plays the control plane and the workers on the agent's state, one stage at a time.
fn play_workers(state: &Path, output: &Path) {
    let Ok(conn) = Connection::open(state.join("edge.db")) else { return };
    let _ = conn.busy_timeout(Duration::from_secs(5));
    let Ok((round, stage, phase)) =
        conn.query_row("SELECT round, stage, phase FROM jobs WHERE name = ?1", [JOB], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })
    else {
        return;
    };
    let model = |stage: &str| {
        let path = output.join(format!("{stage}/{round}/index.pkl"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("{stage}-model-{round}")).unwrap();
        let body = serde_json::json!([{"format": "pkl", "url": path, "metrics": {"accuracy": 0.9}}]).to_string();
        let _ = conn.execute(
            "INSERT OR REPLACE INTO results (job, round, stage, body) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![JOB, round, stage, body],
        );
    };
    let next = match (stage.as_str(), phase.as_str()) {
        ("Train", "Ready") => {
            model("train");
            "Eval"
        }
        ("Eval", "Ready") => {
            model("eval");
            "Deploy"
        }
        _ => return,
    };
    let _ = conn.execute("UPDATE jobs SET stage = ?2, phase = 'Waiting' WHERE name = ?1", rusqlite::params![JOB, next]);
}

#[test]
fn a_round_runs_on_natively_precompiled_policies() {
    let temp = tempfile::tempdir().unwrap();
    ok(perennial(&["plugin", "keygen", "k"], temp.path()));
    a_round_on_precompiled_policies(&Launcher::native(temp.path()), temp.path());
}

#[test]
fn a_round_runs_on_pulley_precompiled_policies() {
    let temp = tempfile::tempdir().unwrap();
    ok(perennial(&["plugin", "keygen", "k"], temp.path()));
    let mut launcher = Launcher::native(temp.path());
    launcher.platform = "pulley64".into();
    launcher.env = vec![("PERENNIAL_POLICY_PLATFORM", "pulley64")];
    a_round_on_precompiled_policies(&launcher, temp.path());
}

/// The compiler-free agent for 32-bit ARM, under qemu-arm: it says what it runs, refuses a
/// component it would have to compile, and runs a whole round on Pulley.
#[test]
fn the_compiler_free_armv7_agent_runs_a_round_under_qemu() {
    // .ci/arm builds the armv7 agent and runs this test with it, and checks it said it ran.
    let Some(binary) = std::env::var_os(ARMV7_BINARY) else {
        eprintln!("skipped: {ARMV7_BINARY} is not set (.ci/arm builds the armv7 agent and sets it)");
        return;
    };
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    ok(perennial(&["plugin", "keygen", "k"], dir));
    let qemu = ["qemu-arm", "-L", "/usr/arm-linux-gnueabihf"].map(OsString::from);
    let launcher = Launcher {
        command: qemu.iter().cloned().chain([binary]).collect(),
        platform: "pulley32".into(),
        env: vec![],
        patience: Duration::from_secs(180),
    };
    let run = |args: &[&str]| {
        let mut command = Command::new(&launcher.command[0]);
        command.args(&launcher.command[1..]).args(args).current_dir(dir).output().expect("run the armv7 agent")
    };
    let platform = ok(run(&["plugin", "platform"]));
    assert!(platform.contains("platform:    pulley32") && platform.contains("compiler:    no"), "{platform}");
    refused(run(&["plugin", "call", "builtin:threshold-trigger", "--trigger", "{}"]), "has no compiler");
    a_round_on_precompiled_policies(&launcher, dir);
    println!("armv7 under qemu-arm: a whole round on pulley32 policies, deployed");
}
