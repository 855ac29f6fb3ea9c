//! `perennial run` end to end: the thermal-comfort example (a smaller threshold) through two
//! rounds with real processes (the Python workers and data generator), real SQLite, the real
//! Wasm policies and real files; then `perennial status`.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::embedded::{Example, cpu_seconds, wait_exit};
use crate::support::many_jobs;

#[test]
fn two_rounds_of_the_example_train_evaluate_and_deploy() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let mut run = example.start(&["--rounds", "2"]);
    let out = wait_exit(&mut run, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);

    // A line per round, saying what was deployed and its metric.
    for round in 1..=2 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("default/thermal-comfort round {round}: deployed ")))
            .unwrap_or_else(|| panic!("no deploy line for round {round} in:\n{stdout}"));
        assert!(line.contains("accuracy="), "{line}");
    }

    // Round files: each round's train samples once, no sample in two rounds, eval sets apart.
    let mut seen = HashSet::new();
    for round in 1..=2 {
        let train = example.rows(&format!("data/train/{round}/data.csv"));
        assert!(train.len() >= 150, "round {round} has {} train samples, under the threshold", train.len());
        for row in &train {
            assert!(seen.insert(row.clone()), "sample {row} is in two train rounds");
        }
        let eval = example.rows(&format!("data/eval/{round}/data.csv"));
        assert!(!eval.is_empty(), "round {round} has an empty eval set");
        assert!(eval.iter().all(|row| !train.contains(row)), "round {round}: an eval sample is also a train sample");
    }
    // Every train sample came from the dataset.
    let index = std::fs::read_to_string(example.state.join("data/thermal-comfort/index.csv")).unwrap();
    let dataset: HashSet<&str> = index.lines().skip(1).collect();
    assert!(seen.iter().all(|row| dataset.contains(row.as_str())));

    // The workers' outputs: round 2 continued round 1's model (HAS_COMPLETED_INITIAL_TRAINING,
    // CLOUD_KB_INDEX), and the deployed model is round 2's evaluated one (first-select).
    let model: serde_json::Value =
        serde_json::from_slice(&std::fs::read(example.output().join("train/2/model.json")).unwrap()).unwrap();
    assert_eq!(model["history"].as_array().map(Vec::len), Some(2), "round 2 trained on from round 1: {model}");
    let deployed = std::fs::read(example.output().join("deploy/index.pkl")).unwrap();
    assert_eq!(deployed, std::fs::read(example.output().join("eval/2/model.json")).unwrap());

    // Every report was applied and acknowledged: the edge outbox is empty.
    let edge = rusqlite::Connection::open(example.state.join("edge.db")).unwrap();
    let left: i64 = edge.query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0)).unwrap();
    assert_eq!(left, 0, "reports left unacknowledged");

    // `perennial status` says it too.
    let status = example.status();
    let job = &status[0];
    assert_eq!(job["job"], "default/thermal-comfort");
    let s = &job["status"];
    assert_eq!(s["roundsCompleted"], 2, "{s}");
    assert_eq!(s["deployed"]["round"], 2, "{s}");
    assert!(s["deployed"]["metrics"]["accuracy"].as_f64().is_some_and(|a| a > 0.34), "{s}");
    assert_eq!(s["stage"], "Train");
    assert_eq!(s["phase"], "Waiting");
    assert!(job["samples"].as_u64().is_some_and(|n| n >= 2 * 150), "{job}");
    for kind in ["trigger", "selector"] {
        let policy = &s["policies"][kind];
        assert_eq!(policy["health"], "Serving", "{kind}: {policy}");
        assert_eq!(policy["digest"].as_str().map(str::len), Some(64), "{kind}: {policy}");
    }
    // Conditions in Sedna's shape, with the round's data.
    let conditions = s["conditions"].as_array().unwrap();
    let ready = conditions.iter().find(|c| c["stage"] == "Train" && c["type"] == "Ready").unwrap();
    let data: serde_json::Value = serde_json::from_str(ready["data"].as_str().unwrap()).unwrap();
    assert!(data["input"]["dataURL"].as_str().unwrap().ends_with("/data.csv"), "{data}");

    let table = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["status", "--state-dir"])
        .arg(&example.state)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("default/thermal-comfort") && table.contains("accuracy="), "{table}");
    // Each policy: what serves, and its last decision with its own reason.
    let trigger = table.lines().find(|l| l.trim_start().starts_with("trigger ")).unwrap_or_default();
    assert!(trigger.contains("builtin:threshold-trigger sha256:") && trigger.contains(" config:"), "{table}");
    assert!(table.contains("last decision: train, num_of_samples "), "{table}");
    assert!(table.contains("last decision: deploy 0, first evaluated model "), "{table}");

    // Each worker's output has its own log.
    let logs: Vec<String> = std::fs::read_dir(example.state.join("logs/default/thermal-comfort"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for prefix in ["0001-train-", "0001-eval-", "0002-train-", "0002-eval-", "0002-inference-"] {
        assert!(logs.iter().any(|l| l.starts_with(prefix)), "no {prefix} log in {logs:?}");
    }
}

#[test]
fn bad_manifests_are_refused_naming_the_file_and_field_and_nothing_is_stored() {
    let example = Example::new(|name, text| {
        if name == "job.yaml" {
            text.replace("trainProb: 0.8", "trainProb: 1.5").replace("\">=\"", "\"~=\"")
        } else {
            text
        }
    });
    let out = example.start(&["--rounds", "1"]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("job.yaml (document 1)"), "{stderr}");
    assert!(stderr.contains("spec.dataset.trainProb: 1.5 is outside [0, 1]"), "{stderr}");
    assert!(stderr.contains("spec.trainSpec.trigger.condition.operator: \"~=\""), "{stderr}");
    // Nothing stored: the state dir this refused run made is gone with it.
    assert!(!example.state.exists(), "a refused set of manifests left {}", example.state.display());
}

#[test]
fn failing_policies_fall_back_to_sednas_rules_and_the_status_says_so() {
    let trigger = perennial_policy::builtin::built_plugin_path("hostile-trigger").unwrap();
    let selector = perennial_policy::builtin::built_plugin_path("hostile-selector").unwrap();
    let example = Example::new(|name, text| {
        if name != "job.yaml" {
            return text;
        }
        text.replace("threshold: 200", "threshold: 150")
            .replace(
                "        metric: num_of_samples\n",
                &format!("        metric: num_of_samples\n      policy: {{plugin: {trigger:?}, config: {{behaviour: panic}}}}\n"),
            )
            .replace("  deploySpec:\n", &format!("  deploySpec:\n    selectPolicy: {{plugin: {selector:?}}}\n"))
    });
    let mut run = example.start(&["--rounds", "1"]);
    let out = wait_exit(&mut run, Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = &example.status()[0]["status"];
    // Sedna's condition started the round and Sedna's selector deployed its model.
    assert_eq!(s["deployed"]["round"], 1, "{s}");
    let policies = &s["policies"];
    assert_eq!(policies["trigger"]["health"], "Failing", "{policies}");
    assert!(policies["trigger"]["message"].as_str().unwrap().contains("panic"), "{policies}");
    assert!(policies["trigger"]["message"].as_str().unwrap().ends_with("Sedna's rule decided"), "{policies}");
    assert_eq!(policies["selector"]["health"], "Failing", "{policies}");
    assert!(policies["selector"]["plugin"].as_str().unwrap().ends_with("hostile_selector.wasm"), "{policies}");
}

/// A selector swapped in while the job runs (the job started on Sedna's own) falls back to
/// Sedna's when it fails, as one there from the start does.
#[test]
fn a_selector_swapped_in_while_the_job_runs_falls_back_to_sednas_too() {
    let selector = perennial_policy::builtin::built_plugin_path("hostile-selector").unwrap();
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 100000"));
    let mut run = example.start(&["--rounds", "1"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while example.live_status().is_none_or(|s| s["policies"]["selector"]["health"] != "Serving") {
        assert!(std::time::Instant::now() < deadline, "the job never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    // One edit: the failing selector, and a threshold the generator reaches (applied together).
    let job = example.manifests.join("job.yaml");
    let edited = std::fs::read_to_string(&job)
        .unwrap()
        .replace("threshold: 100000", "threshold: 150")
        .replace("  deploySpec:\n", &format!("  deploySpec:\n    selectPolicy: {{plugin: {selector:?}}}\n"));
    std::fs::write(&job, edited).unwrap();
    let out = wait_exit(&mut run, Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = &example.status()[0]["status"];
    assert_eq!(s["deployed"]["round"], 1, "Sedna's selector deployed round 1: {s}");
    let policies = &s["policies"];
    assert!(policies["selector"]["plugin"].as_str().unwrap().ends_with("hostile_selector.wasm"), "{policies}");
    assert_eq!(policies["selector"]["health"], "Failing", "{policies}");
    assert!(policies["selector"]["message"].as_str().unwrap().ends_with("Sedna's rule decided"), "{policies}");
}

#[test]
fn deleting_a_job_stops_its_workers_and_the_others_go_on() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let variant = example.add_variant(|text| text.replace("threshold: 200", "threshold: 150"));
    let mut run = example.start_with(&[variant], &[]);
    let rounds = |job: &str| example.live_status_of(job).and_then(|s| s["roundsCompleted"].as_u64()).unwrap_or(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while rounds("default/thermal-comfort-metric-select") < 1 || rounds("default/thermal-comfort") < 1 {
        assert!(std::time::Instant::now() < deadline, "round 1 never completed for both jobs");
        assert!(run.try_wait().unwrap().is_none(), "perennial run exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let delete = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["delete", "thermal-comfort-metric-select", "--state-dir"])
        .arg(&example.state)
        .output()
        .unwrap();
    assert!(delete.status.success(), "{}", String::from_utf8_lossy(&delete.stderr));
    // Its inference worker (which appends predictions every second) is stopped.
    let predictions = example.state.join("output/thermal-comfort-metric-select/inference/predictions.csv");
    std::thread::sleep(Duration::from_millis(1000));
    let size = std::fs::metadata(&predictions).map(|m| m.len()).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(std::fs::metadata(&predictions).map(|m| m.len()).unwrap_or(0), size, "the deleted job's worker runs on");
    // The other job goes on.
    let before = rounds("default/thermal-comfort");
    while rounds("default/thermal-comfort") <= before {
        assert!(std::time::Instant::now() < deadline + Duration::from_secs(60), "the other job stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(15));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let jobs: Vec<String> =
        example.status().as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap().to_owned()).collect();
    assert_eq!(jobs, ["default/thermal-comfort"]);
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["delete", "thermal-comfort-metric-select", "--state-dir"])
        .arg(&example.state)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no LifelongLearningJob default/thermal-comfort-metric-select")
    );
}

#[test]
fn editing_a_jobs_policies_swaps_them_while_it_runs() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let job_yaml = example.manifests.join("job.yaml");
    let original = std::fs::read_to_string(&job_yaml).unwrap();
    let trigger = perennial_policy::builtin::built_plugin_path("count-or-age-trigger").unwrap();
    let edited = |samples: u32| {
        original
            .replace(
                "        metric: num_of_samples\n",
                &format!(
                    "        metric: num_of_samples\n      policy: {{plugin: {trigger:?}, config: {{samples: {samples}, maxAgeHours: 1}}}}\n"
                ),
            )
            .replace(
                "    trainProb: 0.8",
                "    trainProb: 0.8\n    splitPolicy: {plugin: builtin:ratio-split, config: {trainProb: 0.8, mode: hash}}",
            )
    };
    let mut run = example.start(&[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let wait_for = |what: &str, done: &dyn Fn(&serde_json::Value) -> bool| loop {
        assert!(std::time::Instant::now() < deadline, "never: {what}; status: {:?}", example.live_status());
        if example.live_status().is_some_and(|s| done(&s)) {
            return example.live_status().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let rounds = |s: &serde_json::Value| s["roundsCompleted"].as_u64().unwrap_or(0);
    let before = wait_for("round 1", &|s| rounds(s) >= 1);
    let sedna_digest = before["policies"]["trigger"]["digest"].as_str().unwrap().to_owned();

    // A new trigger (a plugin file) and a splitter, swapped in while the job runs.
    std::fs::write(&job_yaml, edited(150)).unwrap();
    let swapped = wait_for("the new trigger serving", &|s| {
        s["policies"]["trigger"]["plugin"] == trigger && s["policies"]["splitter"]["plugin"] == "builtin:ratio-split"
    });
    let digest = swapped["policies"]["trigger"]["digest"].as_str().unwrap().to_owned();
    assert_ne!(digest, sedna_digest);
    assert_eq!(swapped["policies"]["trigger"]["health"], "Serving", "{swapped}");

    // A config its plugin rejects: never serves; the previous one serves on and the job goes on.
    std::fs::write(&job_yaml, edited(0)).unwrap();
    let rejected = wait_for("the rejection", &|s| s["policies"]["trigger"]["health"] == "LoadFailed");
    let message = rejected["policies"]["trigger"]["message"].as_str().unwrap();
    assert!(message.contains("samples: must be at least 1"), "{message}");
    assert_eq!(rejected["policies"]["trigger"]["digest"], digest.as_str(), "the previous trigger serves on");
    let after_rejection = rounds(&rejected);
    wait_for("a round after the rejection", &|s| rounds(s) > after_rejection);

    // Back to Sedna's rules.
    std::fs::write(&job_yaml, &original).unwrap();
    let back = wait_for("Sedna's trigger again", &|s| s["policies"]["trigger"]["digest"] == sedna_digest.as_str());
    assert_eq!(back["policies"]["trigger"]["health"], "Serving", "{back}");
    assert!(back["policies"].get("splitter").is_none(), "Sedna's split is computed natively: {back}");
    let now = rounds(&back);
    wait_for("a round with Sedna's rules again", &|s| rounds(s) > now);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(15));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Every sample decided exactly once across the swaps: the batches follow each other.
    let edge = rusqlite::Connection::open(example.state.join("edge.db")).unwrap();
    let mut statement = edge.prepare("SELECT first_seq, length(assignments) FROM batches ORDER BY batch").unwrap();
    let batches: Vec<(i64, i64)> =
        statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect();
    for pair in batches.windows(2) {
        assert_eq!(pair[1].0, pair[0].0 + pair[0].1, "samples skipped or decided twice between batches {pair:?}");
    }
    let mut seen = HashSet::new();
    for round in 1..=rounds(&example.status()[0]["status"]) {
        for row in example.rows(&format!("data/train/{round}/data.csv")) {
            assert!(seen.insert(row.clone()), "sample {row} trained on twice");
        }
    }
}

/// A second `perennial run` on a state folder in use stops at once, naming the first; the first
/// goes on undisturbed (no sample ingested twice, no round file written by two).
#[test]
fn a_second_run_on_the_same_state_dir_is_refused_naming_the_first() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    let mut first = example.start(&[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while example.live_status().is_none() {
        assert!(std::time::Instant::now() < deadline, "the first run never started its job");
        assert!(first.try_wait().unwrap().is_none(), "the first run exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut second = example.start(&[]);
    let out = wait_exit(&mut second, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let holder = format!("in use by another perennial (perennial run, pid {})", first.id());
    assert!(stderr.contains(&holder), "{stderr}");
    assert!(first.try_wait().unwrap().is_none(), "the first run goes on");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut first, Duration::from_secs(15));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A hundred jobs waiting for samples: the control plane sweeps when something changes, not on a
/// clock, so an idle run costs almost nothing (and a sweep that changed something never loops).
#[test]
fn a_hundred_idle_jobs_cost_almost_no_cpu() {
    let root = tempfile::tempdir().unwrap();
    let (manifests, state) = (root.path().join("manifests"), root.path().join("state"));
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("jobs.yaml"), many_jobs::manifests(100, "[sleep, '600']")).unwrap();
    let log = root.path().join("run.log");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
        .arg("run")
        .arg(&manifests)
        .arg("--state-dir")
        .arg(&state)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    // Every job waiting on the edge for its first samples.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let waiting = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(["status", "--output", "json", "--state-dir"])
            .arg(&state)
            .output()
            .unwrap();
        let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        jobs.as_array()
            .is_some_and(|jobs| jobs.len() == 100 && jobs.iter().all(|job| job["status"]["phase"] == "Waiting"))
    };
    while !waiting() {
        assert!(std::time::Instant::now() < deadline, "the jobs did not all come to Waiting:\n{}", logged());
        assert!(run.try_wait().unwrap().is_none(), "perennial run exited:\n{}", logged());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let before = cpu_seconds(run.id());
    std::thread::sleep(Duration::from_secs(4));
    let cpu = cpu_seconds(run.id()) - before;
    assert!(run.try_wait().unwrap().is_none(), "perennial run exited:\n{}", logged());
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(30));
    assert!(out.status.success(), "{}", logged());
    assert!(cpu < 0.4, "{cpu} s of CPU in 4 s for 100 idle jobs");
}
