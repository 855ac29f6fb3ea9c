//! `perennial plugin test PLUGIN FIXTURE...`: a built policy against an author's fixture files,
//! each a list of decisions (inputs and the answers expected) in the format `perennial decisions
//! --output json` writes, so that a job's real decisions become fixtures. Exit 0 when the policy
//! answers every one as expected, 1 when it does not (with the report `plugin replay` gives).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use perennial_edge::decisions::{BatchInput, DecidedBy, DecisionKind, Record};
use perennial_edge::replay;
use perennial_policy::{SampleBatch, SelectorKind, SplitterKind, TriggerKind};
use serde::Deserialize;

use super::plugin::{PluginArgs, PolicyLog, load, off_runtime, print_replay, world_of};

/// The largest fixture file read (a job's 10,000 records take a few MB).
const MAX_FIXTURE_BYTES: u64 = 64 << 20;

/// One decision of a fixture: what `perennial decisions --output json` writes, of which only
/// `kind`, `input` and `answer` are needed (a split's `input` holds its `samples`, and its
/// expected `assignments` are a letter each: `t`rain, `e`val, `s`kip).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fixture {
    kind: DecisionKind,
    input: serde_json::Value,
    #[serde(default)]
    answer: serde_json::Value,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    id: i64,
    #[serde(default)]
    round: i64,
    #[serde(default)]
    at_ms: u64,
    #[serde(default)]
    last_ms: u64,
    #[serde(default = "one")]
    repeats: u32,
    #[serde(default)]
    policy: DecidedBy,
    #[serde(default)]
    assignments: Option<String>,
}

fn one() -> u32 {
    1
}

/// A split fixture's input: the batch's samples themselves (a recorded split names a byte range
/// of its job's dataset instead, which `plugin replay` reads).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SplitInput {
    samples: Vec<String>,
    #[serde(default)]
    first_seq: u64,
}

/// The decisions of `kind` in the fixtures of `files` (numbered in order where they have no id),
/// each split's samples (`None`: a recorded split, which names its dataset's bytes instead), and
/// how many decisions of other kinds there were.
type Fixtures = (Vec<Record>, Vec<Option<Vec<String>>>, usize);

/// The fixture files: each file given, and a folder's `.json` files (in name order).
fn fixture_files(given: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in given {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("{}", path.display()))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|file| file.extension().is_some_and(|ext| ext == "json") && file.is_file())
            .collect();
        if found.is_empty() {
            bail!("{}: a folder with no .json fixture files", path.display());
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

fn read_fixtures(files: &[PathBuf], kind: DecisionKind) -> anyhow::Result<Fixtures> {
    let files = fixture_files(files)?;
    let mut records = Vec::new();
    let mut samples = Vec::new();
    let mut others = 0;
    for file in &files {
        let text = read_bounded(file)?;
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
        // A list of decisions, or one.
        let list = match value {
            serde_json::Value::Array(list) => list,
            one => vec![one],
        };
        for (i, value) in list.into_iter().enumerate() {
            let at = || format!("{}: decision {} (of the list, from 0)", file.display(), i);
            let fixture: Fixture = serde_json::from_value(value).with_context(at)?;
            if fixture.kind != kind {
                others += 1;
                continue;
            }
            let (record, lines) = as_record(fixture, records.len() + others).with_context(at)?;
            records.push(record);
            samples.push(lines);
        }
    }
    match (records.is_empty(), others) {
        (true, 0) => bail!("the fixtures hold no decisions"),
        (true, _) => bail!("the fixtures hold no {kind} decision (only {others} of other kinds)"),
        _ => Ok((records, samples, others)),
    }
}

fn read_bounded(file: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let opened = std::fs::File::open(file).with_context(|| format!("{}", file.display()))?;
    let mut text = String::new();
    opened
        .take(MAX_FIXTURE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("{}: reading it", file.display()))?;
    if text.len() as u64 > MAX_FIXTURE_BYTES {
        bail!("{}: over {} MiB", file.display(), MAX_FIXTURE_BYTES >> 20);
    }
    Ok(text)
}

/// The fixture as a record to replay, and a split's samples.
fn as_record(fixture: Fixture, index: usize) -> anyhow::Result<(Record, Option<Vec<String>>)> {
    let id = if fixture.id == 0 { index as i64 + 1 } else { fixture.id };
    let mut record = Record::of(fixture.kind, "fixture", fixture.at_ms, fixture.policy, fixture.round);
    record.id = id;
    record.last_ms = fixture.last_ms.max(fixture.at_ms);
    record.repeats = fixture.repeats.max(1);
    record.reason = fixture.reason;
    record.answer = fixture.answer;
    let mut lines = None;
    if fixture.kind == DecisionKind::Splitter {
        // A recorded split names a byte range of its job's dataset: not comparable here.
        if fixture.input.get("samples").is_none()
            && let Ok(recorded) = serde_json::from_value::<BatchInput>(fixture.input.clone())
        {
            record.input = serde_json::to_value(BatchInput { batch: id, ..recorded })?;
            record.assignments = Some(Vec::new());
            return Ok((record, None));
        }
        let input: SplitInput = serde_json::from_value(fixture.input)
            .context("input.samples: a split's fixture holds the batch's samples (a list of lines)")?;
        let letters = fixture.assignments.context("assignments: the expected split, a letter a sample (t, e, s)")?;
        let assignments: Vec<u8> = letters
            .chars()
            .map(|c| match c {
                't' => Ok(0),
                'e' => Ok(1),
                's' => Ok(2),
                other => bail!("assignments: {other:?} is not t (train), e (eval) or s (skip)"),
            })
            .collect::<anyhow::Result<_>>()?;
        if assignments.len() != input.samples.len() {
            bail!("assignments: {} letters for {} samples", assignments.len(), input.samples.len());
        }
        let count = input.samples.len() as u64;
        let batch = BatchInput {
            batch: id,
            first_seq: input.first_seq,
            count,
            start: 0,
            end: 0,
            checksum: String::new(),
            train_prob: None,
        };
        record.input = serde_json::to_value(batch)?;
        record.assignments = Some(assignments);
        lines = Some(input.samples);
    } else {
        record.input = fixture.input;
    }
    Ok((record, lines))
}

pub async fn test(args: &PluginArgs, fixtures: &[PathBuf], show: usize, json: bool) -> anyhow::Result<()> {
    let valid = args.validate()?;
    let host = args.host()?;
    let bytes = host.fetch_ref(&valid).await?;
    super::plugin::config_fits_embedded_schema(args, &valid, &bytes)?;
    let inspection = host.inspect(&valid, &bytes)?;
    let Some((world, _)) = world_of(&inspection.exports) else {
        bail!("{}: not a Perennial policy; it exports {}", args.plugin, inspection.exports.join(", "));
    };
    let kind = match world {
        "trigger-policy" => DecisionKind::Trigger,
        "splitter-policy" => DecisionKind::Splitter,
        _ => DecisionKind::Selector,
    };
    let (records, samples, others) = read_fixtures(fixtures, kind)?;
    let report = off_runtime(move || -> anyhow::Result<replay::KindReport> {
        Ok(match kind {
            DecisionKind::Trigger => {
                let policy = load::<TriggerKind>(&host, &valid, &bytes, PolicyLog::Quiet)?;
                replay::triggers(&records, show, &mut |stats| policy.decide(stats).map_err(|err| err.to_string()))
            }
            DecisionKind::Selector => {
                let policy = load::<SelectorKind>(&host, &valid, &bytes, PolicyLog::Quiet)?;
                replay::selections(&records, show, &mut |input| {
                    policy.select(input.deployed.as_ref(), &input.candidates).map_err(|err| err.to_string())
                })
            }
            DecisionKind::Splitter => {
                let policy = load::<SplitterKind>(&host, &valid, &bytes, PolicyLog::Quiet)?;
                let by_id: std::collections::HashMap<i64, &Option<Vec<String>>> =
                    records.iter().zip(&samples).map(|(record, lines)| (record.id, lines)).collect();
                replay::splits(
                    &records,
                    show,
                    &mut |input| {
                        let Some(Some(lines)) = by_id.get(&input.batch) else {
                            return Err(format!(
                                "a recorded split: its samples are bytes {}..{} of its job's dataset \
                                 (`perennial plugin replay --job` reads them; a fixture holds them as input.samples)",
                                input.start, input.end
                            ));
                        };
                        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
                        SampleBatch::from_lines(input.first_seq, &lines).map_err(|err| err.to_string())
                    },
                    &mut |batch| policy.split(batch).map_err(|err| err.to_string()),
                )
            }
        })
    })
    .await?;
    if json {
        let json = serde_json::json!({
            "plugin": inspection.source, "sha256": inspection.digest, "kind": kind, "report": report,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_replay(&inspection.source, &inspection.digest, kind, &report);
        if others > 0 {
            println!("  ({others} decisions of other kinds in the fixtures, not this policy's)");
        }
    }
    if report.agrees() && report.not_comparable == 0 { Ok(()) } else { Err(super::Exit::quiet(1).into()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.json");
        std::fs::write(&file, text).unwrap();
        let kind = if text.contains("splitter") { DecisionKind::Splitter } else { DecisionKind::Trigger };
        format!("{:#}", read_fixtures(&[file], kind).expect_err("refused"))
    }

    #[test]
    fn a_bad_fixture_is_refused_naming_the_file_the_decision_and_the_field() {
        assert!(error_of("[]").contains("no decisions"));
        assert!(error_of("{").contains("f.json: not JSON"));
        assert!(error_of(r#"[{"kind": "selector", "input": {}}]"#).contains("no trigger decision (only 1 of other"));
        let missing = error_of(r#"[{"kind": "trigger", "input": {}}, {"input": {}}]"#);
        assert!(missing.contains("f.json: decision 1") && missing.contains("kind"), "{missing}");
        let letters = error_of(r#"{"kind": "splitter", "input": {"samples": ["a", "b"]}, "assignments": "t"}"#);
        assert!(letters.contains("assignments: 1 letters for 2 samples"), "{letters}");
        let letter = error_of(r#"{"kind": "splitter", "input": {"samples": ["a"]}, "assignments": "x"}"#);
        assert!(letter.contains(r#"assignments: 'x' is not t (train)"#), "{letter}");
        let samples = error_of(r#"{"kind": "splitter", "input": {"start": 0}, "assignments": ""}"#);
        assert!(samples.contains("input.samples"), "{samples}");
    }

    #[test]
    fn decisions_as_perennial_decisions_writes_them_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.json");
        let written = serde_json::json!([{
            "id": 7, "job": "default/a", "kind": "trigger", "atMs": 1000, "lastMs": 5000, "repeats": 3,
            "policy": {"plugin": "builtin:threshold-trigger", "digest": "ab", "config": "cd"}, "round": 2,
            "input": {"pendingTrain": 4}, "answer": {"train": false}, "reason": "4 < 5", "micros": 3,
            "time": "1970-01-01T00:00:01Z", "lastTime": "1970-01-01T00:00:05Z",
        }]);
        std::fs::write(&file, written.to_string()).unwrap();
        let (records, _, others) = read_fixtures(&[file], DecisionKind::Trigger).unwrap();
        assert_eq!(others, 0);
        assert_eq!((records[0].id, records[0].repeats, records[0].round), (7, 3, 2));
        assert_eq!(records[0].policy.plugin, "builtin:threshold-trigger");
    }
}
