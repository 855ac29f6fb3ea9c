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

/// Reads the fixtures of `files`: every decision, numbered in order where they have no id.
fn read_fixtures(files: &[PathBuf]) -> anyhow::Result<(Vec<Record>, Vec<Vec<String>>)> {
    let mut records = Vec::new();
    let mut samples = Vec::new();
    for file in files {
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
            let (record, lines) = as_record(fixture, records.len()).with_context(at)?;
            records.push(record);
            samples.push(lines);
        }
    }
    if records.is_empty() {
        bail!("the fixtures hold no decisions");
    }
    Ok((records, samples))
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
fn as_record(fixture: Fixture, index: usize) -> anyhow::Result<(Record, Vec<String>)> {
    let id = if fixture.id == 0 { index as i64 + 1 } else { fixture.id };
    let mut record = Record::of(fixture.kind, "fixture", fixture.at_ms, fixture.policy, fixture.round);
    record.id = id;
    record.last_ms = fixture.last_ms.max(fixture.at_ms);
    record.repeats = fixture.repeats.max(1);
    record.reason = fixture.reason;
    record.answer = fixture.answer;
    let mut lines = Vec::new();
    if fixture.kind == DecisionKind::Splitter {
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
        lines = input.samples;
    } else {
        record.input = fixture.input;
    }
    Ok((record, lines))
}

pub async fn test(args: &PluginArgs, fixtures: &[PathBuf], show: usize, json: bool) -> anyhow::Result<()> {
    let (records, samples) = read_fixtures(fixtures)?;
    let valid = args.validate()?;
    let host = args.host()?;
    let bytes = host.fetch(&valid.source).await?;
    let inspection = host.inspect(&valid, &bytes)?;
    let Some((world, _)) = world_of(&inspection.exports) else {
        bail!("{}: not a Perennial policy; it exports {}", args.plugin, inspection.exports.join(", "));
    };
    let kind = match world {
        "trigger-policy" => DecisionKind::Trigger,
        "splitter-policy" => DecisionKind::Splitter,
        _ => DecisionKind::Selector,
    };
    let others = records.iter().filter(|r| r.kind != kind).count();
    if others == records.len() {
        bail!("the fixtures hold no {kind} decision for this {world} (only decisions of other kinds)");
    }
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
                let by_id: std::collections::HashMap<i64, &Vec<String>> =
                    records.iter().zip(&samples).map(|(record, lines)| (record.id, lines)).collect();
                replay::splits(
                    &records,
                    show,
                    &mut |input| {
                        let lines = by_id.get(&input.batch).ok_or("no samples")?;
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
