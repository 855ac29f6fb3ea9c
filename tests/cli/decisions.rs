//! Decision records and replay, as an author uses them: `perennial run` a job for a few rounds,
//! read its decisions with `perennial decisions`, and replay candidates of each kind on them
//! with `perennial plugin replay` (exit 0 when it agrees, 1 when it does not, with its report).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::support::embedded::{Example, wait_exit};

fn perennial(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("run perennial")
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn records(state: &Path, job: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["decisions", job, "--output", "json", "--limit", "0"];
    args.extend_from_slice(extra);
    let out = perennial(state, &args);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn replay(state: &Path, plugin: &str, config: &str, extra: &[&str]) -> Output {
    let mut args = vec!["plugin", "replay", plugin, "--config", config, "--job", "thermal-comfort"];
    args.extend_from_slice(extra);
    perennial(state, &args)
}

const SEDNA_TRIGGER: &str = r#"{"condition": {"operator": ">=", "threshold": 150, "metric": "num_of_samples"}}"#;

#[test]
fn every_decision_is_recorded_and_candidates_are_replayed_on_them() {
    let example = Example::new(|_, text| text.replace("threshold: 200", "threshold: 150"));
    // A second job keeps its last 6 records only.
    example.add_variant(|text| text.replace("  outputDir:", "  decisionRecords: {maxCount: 6}\n  outputDir:"));
    let variant = example.manifests.join("metric-select");
    let mut run = example.start_with(&[variant], &["--rounds", "3"]);
    let out = wait_exit(&mut run, Duration::from_secs(180));
    assert!(out.status.success(), "{}", text(&out));
    let state = &example.state;

    // Every trigger decision: one that started each round (the run may have started the next
    // one before it ended), each with what the trigger saw.
    let started = example.status()[0]["status"]["round"].as_i64().unwrap();
    assert!(started >= 3);
    let all = records(state, "thermal-comfort", &[]);
    let of = |kind: &str| all.iter().filter(|r| r["kind"] == kind).cloned().collect::<Vec<_>>();
    let triggers = of("trigger");
    let trains: Vec<&Value> = triggers.iter().filter(|r| r["answer"]["train"] == true).collect();
    let rounds: Vec<i64> = trains.iter().map(|r| r["round"].as_i64().unwrap()).collect();
    assert_eq!(rounds, (0..started).collect::<Vec<_>>(), "{trains:?}");
    for record in &triggers {
        let pending = record["input"]["pendingTrain"].as_u64().unwrap();
        let train = record["answer"]["train"] == true;
        assert_eq!(train, pending >= 150, "the recorded input explains the answer: {record}");
        assert_eq!(record["policy"]["plugin"], "builtin:threshold-trigger");
        assert!(record["reason"].as_str().unwrap().contains("num_of_samples"), "{record}");
        assert!(record["repeats"].as_u64().unwrap() >= 1);
    }
    // Every batch split, one record each, in order, covering every sample once.
    let splits = of("splitter");
    let mut next_seq = 0;
    for record in &splits {
        assert_eq!(record["input"]["firstSeq"].as_u64().unwrap(), next_seq, "{record}");
        next_seq += record["input"]["count"].as_u64().unwrap();
        assert_eq!(record["policy"]["plugin"], "sedna:trainProb");
    }
    let samples = example.status()[0]["samples"].as_u64().unwrap();
    assert!(next_seq > 0 && next_seq <= samples, "records cover {next_seq} of {samples} samples");
    // Every selection, one per round deployed, each with its candidates.
    let selections = of("selector");
    let deployed = selections.len();
    let rounds: Vec<i64> = selections.iter().map(|r| r["round"].as_i64().unwrap()).collect();
    assert_eq!(rounds, (1..=deployed as i64).collect::<Vec<_>>(), "{selections:?}");
    assert!(deployed >= 3);
    for record in &selections {
        assert_eq!(record["answer"]["deploy"], 0);
        assert_eq!(record["input"]["candidates"].as_array().unwrap().len(), 1);
    }

    // Filters: a kind; a time to come has nothing; the table names the policies.
    let only = records(state, "thermal-comfort", &["--kind", "selector"]);
    assert_eq!(only.len(), deployed);
    assert_eq!(records(state, "thermal-comfort", &["--since", "2099-01-01T00:00:00Z"]), Vec::<Value>::new());
    assert_eq!(records(state, "thermal-comfort", &["--since", "1h"]).len(), all.len());
    let table = perennial(state, &["decisions", "default/thermal-comfort"]);
    let shown = String::from_utf8_lossy(&table.stdout);
    assert!(shown.starts_with("ID ") && shown.contains("builtin:threshold-trigger sha256:"), "{shown}");
    let unknown = perennial(state, &["decisions", "no-such-job"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown).contains("default/thermal-comfort"), "names the jobs that have records: {}", text(&unknown));
    let bad = perennial(state, &["decisions", "thermal-comfort", "--since", "yesterday-ish"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("--since"), "{}", text(&bad));

    // The retention bound of the second job.
    let kept = records(state, "thermal-comfort-metric-select", &[]);
    assert!(!kept.is_empty() && kept.len() <= 6, "maxCount 6 kept {}", kept.len());
    assert_eq!(kept.last().unwrap()["round"], 3, "the newest are kept: {kept:?}");

    // The serving trigger replayed on its own inputs agrees with every decision.
    let same = replay(state, "builtin:threshold-trigger", SEDNA_TRIGGER, &[]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    let decisions: u64 = triggers.iter().map(|r| r["repeats"].as_u64().unwrap()).sum();
    assert!(
        String::from_utf8_lossy(&same.stdout)
            .contains(&format!("{decisions} decisions: {decisions} agree, 0 disagree, 0 not comparable")),
        "{}",
        text(&same)
    );
    // A lower threshold would have started every round earlier, with fewer samples.
    let eager = replay(state, "builtin:threshold-trigger", &SEDNA_TRIGGER.replace("150", "40"), &["--json"]);
    assert_eq!(eager.status.code(), Some(1), "{}", text(&eager));
    let report: Value = serde_json::from_slice(&eager.stdout).unwrap();
    let first = &report["report"]["disagreements"][0];
    assert_eq!((first["recorded"].as_str(), first["candidate"].as_str()), (Some("wait"), Some("train")), "{report}");
    assert!(first["candidateReason"].as_str().unwrap().contains(">= 40"), "{report}");
    // Each disagreement names the policy that made the recorded decision.
    assert_eq!(first["recordedBy"]["plugin"], "builtin:threshold-trigger", "{report}");
    assert_eq!(first["recordedBy"]["digest"].as_str().map(str::len), Some(64), "{report}");
    // The numbers add up, and a run of waits counts as its decisions on both sides.
    let numbers = &report["report"];
    let count = |field: &str| numbers[field].as_u64().unwrap();
    assert_eq!(count("agreed") + count("disagreed") + count("notComparable"), count("decisions"), "{report}");
    assert_eq!(count("decisions"), decisions, "{report}");
    // The effects are data: round 2 starting earlier, with when and how many samples.
    let effects = report["report"]["effects"].as_array().unwrap();
    let earlier = effects
        .iter()
        .find(|e| e["effect"] == "roundEarlier" && e["round"] == 2)
        .unwrap_or_else(|| panic!("effects: {effects:?}"));
    assert!(earlier["trainSamples"].as_u64().unwrap() < earlier["recordedTrainSamples"].as_u64().unwrap(), "{earlier}");
    assert!(earlier["atMs"].as_u64().unwrap() < earlier["recordedAtMs"].as_u64().unwrap(), "{earlier}");

    // Sedna's trainProb rule as a plugin agrees with the native split, batch by batch (each
    // batch read back from the dataset by its byte range); another ratio moves samples.
    let same = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.8}"#, &[]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    let agree = format!("{n} decisions: {n} agree, 0 disagree, 0 not comparable", n = splits.len());
    assert!(String::from_utf8_lossy(&same.stdout).contains(&agree), "{}", text(&same));
    // On a node whose agent sees the host's files under ROOTFS_MOUNT_DIR (a DaemonSet), replay
    // reads the dataset there too.
    let index = state.join("data/thermal-comfort/index.csv");
    let host_root = example.root.path().join("host");
    let under_root = host_root.join(index.strip_prefix("/").unwrap());
    std::fs::create_dir_all(under_root.parent().unwrap()).unwrap();
    std::fs::rename(&index, &under_root).unwrap();
    let elsewhere = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.8}"#, &[]);
    // Not found there: every batch not comparable, and said so.
    let unread = format!("{n} decisions: 0 agree, 0 disagree, {n} not comparable", n = splits.len());
    assert!(String::from_utf8_lossy(&elsewhere.stdout).contains(&unread), "{}", text(&elsewhere));
    let rooted = replay(
        state,
        "builtin:ratio-split",
        r#"{"trainProb": 0.8}"#,
        &["--rootfs-mount-dir", host_root.to_str().unwrap()],
    );
    assert_eq!(rooted.status.code(), Some(0), "{}", text(&rooted));
    assert!(String::from_utf8_lossy(&rooted.stdout).contains(&agree), "{}", text(&rooted));
    std::fs::rename(&under_root, &index).unwrap();
    let half = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.5}"#, &[]);
    assert_eq!(half.status.code(), Some(1), "{}", text(&half));
    assert!(String::from_utf8_lossy(&half.stdout).contains("samples would move from train to eval"), "{}", text(&half));

    // A selector that never beats the deployed model would have kept it in rounds 2 and 3.
    let strict = r#"{"metric": "accuracy", "minDelta": 1.0}"#;
    let kept = replay(state, "builtin:metric-select", strict, &[]);
    assert_eq!(kept.status.code(), Some(1), "{}", text(&kept));
    let said = String::from_utf8_lossy(&kept.stdout);
    assert!(said.contains(&format!("{deployed} decisions: 1 agree, {} disagree", deployed - 1)), "{said}");
    assert!(said.contains("(by builtin:"), "the recorded decision's policy: {said}");
    assert!(said.contains("round 2: keeping the deployed model instead of deploying"), "{said}");

    // A splitter cannot replay trigger decisions.
    let wrong = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.8}"#, &["--kind", "trigger"]);
    assert_eq!(wrong.status.code(), Some(2), "{}", text(&wrong));

    // A batch whose bytes changed since is not replayed, and says why.
    let index = state.join("data/thermal-comfort/index.csv");
    let mut bytes = std::fs::read(&index).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] = if bytes[middle] == b'7' { b'8' } else { b'7' };
    std::fs::write(&index, bytes).unwrap();
    let changed = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.8}"#, &[]);
    assert!(String::from_utf8_lossy(&changed.stdout).contains("changed since it was split"), "{}", text(&changed));
}

/// The job's trigger and selector policy lines, each with a shadow.
fn with_shadows(trigger_shadow: &str, selector_shadow: &str) -> impl Fn(&str, String) -> String + use<> {
    let (trigger_shadow, selector_shadow) = (trigger_shadow.to_owned(), selector_shadow.to_owned());
    move |name, text| {
        if name != "job.yaml" {
            return text;
        }
        let policy = format!(
            "        metric: num_of_samples\n      policy:\n        plugin: builtin:threshold-trigger\n        config: {SEDNA_TRIGGER}\n        shadow: {trigger_shadow}\n"
        );
        text.replace("threshold: 200", "threshold: 150").replace("        metric: num_of_samples\n", &policy).replace(
            "  deploySpec:\n",
            &format!("  deploySpec:\n    selectPolicy:\n      plugin: builtin:first-select\n      shadow: {selector_shadow}\n"),
        )
    }
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_shadow_is_counted_beside_the_serving_policy_and_a_hostile_one_changes_nothing() {
    // An eager trigger and a selector that never replaces the deployed model, as shadows.
    let eager = r#"{plugin: "builtin:threshold-trigger", config: {condition: {operator: ">=", threshold: 60, metric: num_of_samples}}}"#;
    let strict = r#"{plugin: "builtin:metric-select", config: {metric: accuracy, minDelta: 1.0}}"#;
    let example = Example::new(with_shadows(eager, strict));
    let mut run = example.start(&[]);
    let state = example.state.clone();
    let policies = || example.status()[0]["status"]["policies"].clone();
    let rounds = || example.live_status().and_then(|s| s["roundsCompleted"].as_u64()).unwrap_or(0);
    wait_for("two rounds with shadows", Duration::from_secs(120), || rounds() >= 2);
    let seen = policies();
    let trigger = &seen["trigger"]["shadow"];
    assert_eq!(trigger["plugin"], "builtin:threshold-trigger", "{seen}");
    assert!(trigger["calls"].as_u64().unwrap() >= 2 && trigger["agreed"].as_u64().unwrap() >= 1, "{seen}");
    let last = &trigger["lastDisagreement"];
    assert_eq!((last["answer"].as_str(), last["shadowAnswer"].as_str()), (Some("wait"), Some("train")), "{seen}");
    assert!(last["reason"].as_str().unwrap().contains(">= 60"), "{seen}");
    let selector = &seen["selector"]["shadow"];
    assert_eq!(selector["plugin"], "builtin:metric-select", "{seen}");
    assert!(selector["disagreed"].as_u64().unwrap() >= 1, "round 2 on: it keeps what is deployed: {seen}");
    assert_eq!(selector["lastDisagreement"]["shadowAnswer"], "keep", "{seen}");
    // A shadow never acts: the serving policies decided every round.
    let trains = |state: &Path| {
        records(state, "thermal-comfort", &["--kind", "trigger"])
            .into_iter()
            .filter(|r| r["answer"]["train"] == true)
            .map(|r| r["input"]["pendingTrain"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert!(trains(&state).iter().all(|pending| *pending >= 150), "{:?}", trains(&state));

    // Swapped live for shadows that loop and answer out of range: the job goes on as before.
    let trigger_plugin = perennial_policy::builtin::built_plugin_path("hostile-trigger").unwrap();
    let selector_plugin = perennial_policy::builtin::built_plugin_path("hostile-selector").unwrap();
    let hostile = with_shadows(
        &format!("{{plugin: {trigger_plugin:?}, config: {{behaviour: loop}}}}"),
        &format!("{{plugin: {selector_plugin:?}}}"),
    );
    let original =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/thermal-comfort/job.yaml"))
            .unwrap();
    std::fs::write(example.manifests.join("job.yaml"), hostile("job.yaml", original.clone())).unwrap();
    // The swap compiles beside the serving policies (slowly on a loaded machine): counted from
    // when the hostile shadows serve.
    wait_for("the hostile shadows swapped in", Duration::from_secs(120), || {
        let seen = policies();
        let shadow = |kind: &str| seen[kind]["shadow"]["plugin"].as_str().unwrap_or_default().to_owned();
        shadow("trigger").ends_with("hostile_trigger.wasm") && shadow("selector").ends_with("hostile_selector.wasm")
    });
    let before = rounds();
    wait_for("two more rounds beside hostile shadows", Duration::from_secs(120), || rounds() >= before + 2);
    let seen = policies();
    let trigger = &seen["trigger"]["shadow"];
    assert!(trigger["plugin"].as_str().unwrap().ends_with("hostile_trigger.wasm"), "{seen}");
    assert!(trigger["failed"].as_u64().unwrap() >= 1, "{seen}");
    assert!(trigger["message"].as_str().unwrap().contains("100 ms"), "its fault, its own: {seen}");
    assert_eq!(seen["trigger"]["health"], "Serving", "the serving trigger is untouched: {seen}");
    let selector = &seen["selector"]["shadow"];
    let fault = selector["message"].as_str().unwrap_or_default();
    assert!(selector["failed"].as_u64().unwrap() >= 1 && fault.contains("chose candidate 1 of 1"), "{seen}");
    assert_eq!(seen["selector"]["health"], "Serving", "{seen}");
    assert!(trains(&state).iter().all(|pending| *pending >= 150), "{:?}", trains(&state));
    // The table says it too.
    let table = perennial(&state, &["status"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("hostile_trigger.wasm sha256:"), "{}", text(&table));

    // The shadows taken out: they leave the status at once (nothing to compile), and the log says so.
    let without: String = hostile("job.yaml", original.clone())
        .lines()
        .filter(|line| !line.trim_start().starts_with("shadow:"))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(example.manifests.join("job.yaml"), without).unwrap();
    wait_for("the shadows gone from the status", Duration::from_secs(30), || {
        let seen = policies();
        seen["trigger"].get("shadow").is_none() && seen["selector"].get("shadow").is_none()
    });
    let table = perennial(&state, &["status"]);
    assert!(!String::from_utf8_lossy(&table.stdout).contains("hostile_trigger.wasm"), "{}", text(&table));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut run, Duration::from_secs(20));
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    for kind in ["trigger", "selector"] {
        assert!(
            said.contains(&format!("the {kind} shadow")) && said.contains("now runs beside the serving policy"),
            "{said}"
        );
        assert!(said.contains(&format!("hostile_{kind}.wasm was removed")), "the {kind} shadow's end said: {said}");
    }
}
