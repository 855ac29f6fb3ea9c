//! Careless and hostile manifests given to `perennial run`, as a user would give them: each is
//! refused at once with one line naming the file, the document and the field; nothing of it is
//! stored; and the job already accepted runs on, from the next `perennial run` as from a live
//! edit.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::embedded::{Example, cpu_seconds, wait_exit};

/// Every stored object, as the job store holds it.
fn stored_objects(state: &Path) -> Vec<(String, String, String)> {
    let db = rusqlite::Connection::open(state.join("control.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let mut statement = db.prepare("SELECT kind, key, body FROM objects ORDER BY kind, key").unwrap();
    statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
}

/// `perennial run <copy> --state-dir <state>`, its log in a file (read while it runs).
fn start_logged(example: &Example) -> (std::process::Child, PathBuf) {
    let log = example.root.path().join("run.log");
    let run = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .arg("run")
        .arg(&example.manifests)
        .arg("--state-dir")
        .arg(&example.state)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (run, log)
}

/// The example's job, as a second job of its own (name and output folder), then `edit`ed.
fn second_job(example: &Example, edit: impl Fn(String) -> String) -> String {
    let text = std::fs::read_to_string(example.manifests.join("job.yaml")).unwrap();
    edit(
        text.replace("name: thermal-comfort\n  namespace", "name: second\n  namespace")
            .replace("outputDir: output/thermal-comfort", "outputDir: output/second"),
    )
}

#[test]
fn refused_manifests_store_nothing_and_the_accepted_job_runs_on() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let out = wait_exit(&mut example.start(&["--rounds", "1"]), Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let accepted = stored_objects(&example.state);
    assert_eq!(accepted.len(), 3, "{accepted:?}");

    let trigger = perennial_policy::builtin::built_plugin_path("count-or-age-trigger").unwrap();
    let with_policy = move |text: String| {
        text.replace(
            "        metric: num_of_samples\n",
            &format!("        metric: num_of_samples\n      policy: {{plugin: {trigger:?}, config: {{samples: 0, maxAgeHours: 1}}}}\n"),
        )
    };
    let bad = example.root.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    // (what the file holds, what the one line says)
    let cases: Vec<(String, &str)> = vec![
        (
            second_job(&example, |t| t.replace("            command: [\"python3\", \"eval.py\"]\n", "")),
            "LifelongLearningJob default/second: spec.evalSpec.template.spec.containers[0].command: empty",
        ),
        (
            second_job(&example, |t| t.replace("value: \"55\"", "valueFrom: {fieldRef: {fieldPath: metadata.name}}")),
            "spec.deploySpec.template.spec.containers[0].env[0] (SEED): valueFrom is not available in embedded mode",
        ),
        (
            second_job(&example, with_policy),
            "LifelongLearningJob default/second: spec.trainSpec.trigger.policy: loading the policy failed at step `configure`: the plugin rejected its config: ",
        ),
        (
            second_job(&example, |t| t.replace("namespace: default", "namespace: \"a/../b\"")),
            "metadata.namespace: \"a/../b\" is not a DNS-1123 label",
        ),
        (
            second_job(&example, |t| t.replace("outputDir: output/second", "outputDir: \"output/se\\0cond\"")),
            "spec.outputDir: \"output/se\\0cond\" contains the control character '\\0'",
        ),
        (
            second_job(&example, |t| t.replace("outputDir: output/second", "outputDir: output/thermal-comfort/x")),
            "/output/thermal-comfort/x is also where job default/thermal-comfort writes",
        ),
        (
            second_job(&example, |t| t.replace("checkPeriodSeconds: 5", "checkPeriodSecond: 5")),
            "spec.trainSpec.trigger.checkPeriodSecond: unknown field; did you mean \"checkPeriodSeconds\"?",
        ),
        (
            second_job(&example, |t| t.replace("trainProb: 0.8", "trainProb: 0.8\n    trainProb: 0.5")),
            "duplicate entry with key \"trainProb\"",
        ),
        (second_job(&example, |t| t.replace("trainProb: 0.8", "trainProb: .nan")), "NaN and infinities are refused"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n".into(),
            "Pod default/empty: spec.containers: a Pod needs at least one container",
        ),
        (
            std::fs::read_to_string(example.manifests.join("job.yaml")).unwrap(),
            "LifelongLearningJob default/thermal-comfort is also in ",
        ),
        (format!("x: {}{}\n", "[".repeat(100_000), "]".repeat(100_000)), "brackets nested deeper than 64 levels"),
    ];
    let file = bad.join("bad.yaml");
    for (text, says) in &cases {
        std::fs::write(&file, text).unwrap();
        let started = Instant::now();
        let mut run = example.start_with(std::slice::from_ref(&file), &["--rounds", "2"]);
        let out = wait_exit(&mut run, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{says}: {stderr}");
        let line = stderr.lines().find(|l| l.contains(says)).unwrap_or_else(|| panic!("no {says:?} in {stderr}"));
        assert!(line.contains(&format!("{} (document 1)", file.display())), "{line}");
        assert_eq!(stored_objects(&example.state), accepted, "{says}: something was stored");
        assert!(started.elapsed() < Duration::from_secs(30), "{says}: {:?}", started.elapsed());
    }
    // The policy its plugin refuses is named with the plugin's reason.
    std::fs::write(&file, second_job(&example, with_policy)).unwrap();
    let out = wait_exit(&mut example.start_with(std::slice::from_ref(&file), &[]), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("samples: must be at least 1"), "{stderr}");

    // The accepted job was never touched: the next run resumes it.
    let mut resumed = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["run", "--rounds", "2", "--state-dir"])
        .arg(&example.state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_exit(&mut resumed, Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(example.status()[0]["status"]["roundsCompleted"], 2);
}

/// A live edit that would not run (a template without its command) is refused and said; the
/// stored job stays as it was and goes on with its rounds.
#[test]
fn a_refused_live_edit_stores_nothing_and_the_job_goes_on() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let (mut run, log) = start_logged(&example);
    let deadline = Instant::now() + Duration::from_secs(120);
    let rounds = || example.live_status().and_then(|s| s["roundsCompleted"].as_u64()).unwrap_or(0);
    while rounds() < 1 {
        assert!(Instant::now() < deadline, "no round");
        std::thread::sleep(Duration::from_millis(50));
    }
    let accepted = stored_objects(&example.state);
    let job_yaml: PathBuf = example.manifests.join("job.yaml");
    let text = std::fs::read_to_string(&job_yaml).unwrap();
    std::fs::write(&job_yaml, text.replace("            command: [\"python3\", \"train.py\"]\n", "")).unwrap();
    let said = "the edited manifests were not applied";
    while !std::fs::read_to_string(&log).unwrap().contains(said) {
        assert!(Instant::now() < deadline, "never said: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let line = logged.lines().find(|l| l.contains(said)).unwrap().to_owned();
    assert!(line.contains("job.yaml (document 1)") && line.contains("spec.trainSpec.template"), "{line}");
    assert_eq!(stored_objects(&example.state), accepted, "the refused edit was stored");
    let now = rounds();
    while rounds() <= now {
        assert!(Instant::now() < deadline, "no round after the refused edit");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(15));
    assert!(out.status.success());
}

/// An index replaced by a folder: the error is logged once (not at every turn), the run spends
/// almost no CPU on it, and the job's status says it with when it began; when the index is back
/// the log says so and the job goes on.
#[test]
fn a_broken_index_is_said_once_and_shown_in_the_status_without_a_hot_loop() {
    let example = Example::new(|name, text| {
        let text = text.replace("threshold: 200", "threshold: 150");
        if name == "generator.yaml" { text.replace("value: \"0\"", "value: \"400\"") } else { text }
    });
    let (mut run, log) = start_logged(&example);
    let deadline = Instant::now() + Duration::from_secs(120);
    let waiting =
        || example.live_status().is_some_and(|s| s["roundsCompleted"].as_u64() >= Some(1) && s["phase"] == "Waiting");
    while !waiting() {
        assert!(Instant::now() < deadline, "no round; status {:?}", example.live_status());
        std::thread::sleep(Duration::from_millis(50));
    }
    let index = example.state.join("data/thermal-comfort/index.csv");
    let kept = example.root.path().join("index.csv");
    std::fs::rename(&index, &kept).unwrap();
    std::fs::create_dir(&index).unwrap();
    let cpu_before = cpu_seconds(run.id());
    std::thread::sleep(Duration::from_secs(5));
    let cpu = cpu_seconds(run.id()) - cpu_before;
    assert!(cpu < 1.0, "{cpu} s of CPU in 5 s with a broken index");
    let logged = std::fs::read_to_string(&log).unwrap();
    let errors: Vec<&str> = logged.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("ingest: "), "{}", errors[0]);
    let status = example.live_status().unwrap();
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("ingest: ") && message.contains("not a regular file (a folder) (since "), "{message}");
    let fault = status["fault"].as_str().unwrap_or_default();
    assert!(fault.starts_with("ingest: ") && fault.contains("not a regular file (a folder) (since "), "{status}");

    // Back: said once, and the status no longer shows it.
    std::fs::remove_dir(&index).unwrap();
    std::fs::rename(&kept, &index).unwrap();
    while !std::fs::read_to_string(&log).unwrap().contains("ingest works again after failing") {
        assert!(Instant::now() < deadline, "the recovery was never said");
        std::thread::sleep(Duration::from_millis(50));
    }
    while example.live_status().unwrap()["message"].as_str().is_some_and(|m| m.starts_with("ingest: "))
        || example.live_status().unwrap().get("fault").is_some()
    {
        assert!(Instant::now() < deadline, "the status still shows the fault");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(15));
    assert!(out.status.success());
}
