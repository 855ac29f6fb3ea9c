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
        String::from_utf8_lossy(&same.stdout).contains(&format!("{decisions} of {decisions} agree, 0 disagree")),
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
    let effects = report["report"]["effects"].as_array().unwrap();
    assert!(
        effects.iter().any(|e| e.as_str().unwrap().starts_with("round 2 would have started")),
        "effects: {effects:?}"
    );

    // Sedna's trainProb rule as a plugin agrees with the native split, batch by batch (each
    // batch read back from the dataset by its byte range); another ratio moves samples.
    let same = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.8}"#, &[]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    assert!(String::from_utf8_lossy(&same.stdout).contains(&format!("{n} of {n} agree", n = splits.len())));
    let half = replay(state, "builtin:ratio-split", r#"{"trainProb": 0.5}"#, &[]);
    assert_eq!(half.status.code(), Some(1), "{}", text(&half));
    assert!(String::from_utf8_lossy(&half.stdout).contains("samples would move from train to eval"), "{}", text(&half));

    // A selector that never beats the deployed model would have kept it in rounds 2 and 3.
    let strict = r#"{"metric": "accuracy", "minDelta": 1.0}"#;
    let kept = replay(state, "builtin:metric-select", strict, &[]);
    assert_eq!(kept.status.code(), Some(1), "{}", text(&kept));
    let said = String::from_utf8_lossy(&kept.stdout);
    assert!(said.contains(&format!("1 of {deployed} agree, {} disagree", deployed - 1)), "{said}");
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
