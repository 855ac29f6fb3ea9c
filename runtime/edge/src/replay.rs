//! Replay: what a candidate policy would have decided on a job's recorded inputs, against what
//! was decided, and what that would have changed. Pure: the caller reads the records and the
//! batches and calls the candidate; this compares.
//!
//! Each decision is replayed on the inputs the job really saw. Once the candidate would have
//! decided otherwise, the job's later inputs would have differed too (a round started earlier
//! holds fewer samples): the effects say what the first difference in each round would have been.

use serde::Serialize;

use crate::decisions::{BatchInput, DecidedBy, DecisionKind, Record, SelectAnswer, SelectInput, TriggerAnswer};
use perennial_policy::{Assignment, Assignments, Choice, Decision, TriggerStats};

/// One decision where the candidate did not agree.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Disagreement {
    pub id: i64,
    pub at_ms: u64,
    pub round: i64,
    /// The input, in a few words.
    pub input: String,
    pub recorded: String,
    pub recorded_reason: String,
    /// The policy that made the recorded decision: plugin, component digest, config digest.
    pub recorded_by: DecidedBy,
    pub candidate: String,
    pub candidate_reason: String,
}

/// A kind's replay. Its decisions add up: `agreed + disagreed + notComparable == decisions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindReport {
    /// Recorded decisions (a run of identical waits counts as its number of decisions).
    pub decisions: u64,
    /// Those the candidate answered as recorded.
    pub agreed: u64,
    /// Those it answered otherwise (or failed on).
    pub disagreed: u64,
    /// Those that could not be replayed: see `skipped` for why.
    pub not_comparable: u64,
    /// Why records could not be replayed (a batch whose bytes changed since).
    pub skipped: Vec<String>,
    /// The first disagreements, oldest first (at most the number asked for).
    pub disagreements: Vec<Disagreement>,
    /// What the candidate's answers would have changed.
    pub effects: Vec<Effect>,
}

impl KindReport {
    pub fn agrees(&self) -> bool {
        self.disagreed == 0
    }

    /// `decisions` recorded decisions (a run's) on which the candidate answered otherwise.
    fn disagree(&mut self, keep: usize, decisions: u64, disagreement: Disagreement) {
        self.disagreed += decisions;
        if self.disagreements.len() < keep {
            self.disagreements.push(disagreement);
        }
    }

    /// `decisions` recorded decisions that could not be replayed, and why.
    fn not_replayed(&mut self, decisions: u64, why: String) {
        self.decisions += decisions;
        self.not_comparable += decisions;
        self.skipped.push(why);
    }
}

/// What a candidate's answers would have changed, as data; [`Effect::describe`] says it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "effect", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Effect {
    /// `round` would have started earlier than it did.
    RoundEarlier { round: i64, at_ms: u64, train_samples: u64, recorded_at_ms: u64, recorded_train_samples: u64 },
    /// `round` started, and the candidate would still have been waiting at the end of the round
    /// before it (its last recorded decision).
    RoundNotStarted { round: i64, recorded_at_ms: u64, recorded_train_samples: u64 },
    /// `round` has not started, and the candidate would have started it.
    RoundWouldStart { round: i64, at_ms: u64, train_samples: u64, reason: String },
    /// Samples the candidate would have put in another set.
    SamplesMoved { samples: u64, from: String, to: String },
    /// A selection made otherwise: the model each would have deployed (`None`: kept the
    /// deployed one), or the candidate failed.
    SelectedOtherwise {
        round: i64,
        recorded: Option<SelectedModel>,
        candidate: Option<SelectedModel>,
        candidate_failed: bool,
    },
}

/// A model a selection would deploy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectedModel {
    pub url: String,
    pub metrics: perennial_policy::Metrics,
}

impl Effect {
    /// The effect in a sentence.
    pub fn describe(&self) -> String {
        match self {
            Effect::RoundEarlier { round, at_ms, train_samples, recorded_at_ms, recorded_train_samples } => format!(
                "round {round} would have started earlier ({} before): at {} with {train_samples} train samples, \
                 not at {} with {recorded_train_samples}",
                seconds((recorded_at_ms - at_ms.min(recorded_at_ms)) / 1000),
                time(*at_ms),
                time(*recorded_at_ms),
            ),
            Effect::RoundNotStarted { round, recorded_at_ms, recorded_train_samples } => format!(
                "round {round} would not have started when it did ({}, {recorded_train_samples} train samples): the \
                 candidate was still waiting at the round's last recorded decision",
                time(*recorded_at_ms),
            ),
            Effect::RoundWouldStart { round, at_ms, train_samples, reason } => format!(
                "round {round} would have started at {} with {train_samples} train samples ({reason}); it has not \
                 started",
                time(*at_ms),
            ),
            Effect::SamplesMoved { samples, from, to } => format!("{samples} samples would move from {from} to {to}"),
            Effect::SelectedOtherwise { round, recorded, candidate, candidate_failed } => {
                let acting = |model: &Option<SelectedModel>| match model {
                    Some(model) => format!("deploying {} {}", model.url, metrics(&model.metrics)),
                    None => "keeping the deployed model".to_owned(),
                };
                match candidate_failed {
                    true => format!("round {round}: the candidate failed instead of {}", acting(recorded)),
                    false => format!("round {round}: {} instead of {}", acting(candidate), acting(recorded)),
                }
            }
        }
    }
}

/// Replays trigger records with `decide`; keeps the first `keep` disagreements.
pub fn triggers(
    records: &[Record],
    keep: usize,
    decide: &mut dyn FnMut(&TriggerStats) -> Result<Decision, String>,
) -> KindReport {
    let mut report = KindReport::default();
    // Per round (the round last started when deciding): when it started, and when the
    // candidate would have started it, each with the train samples pending then.
    let mut rounds: std::collections::BTreeMap<i64, (Option<Moment>, Option<Moment>)> = Default::default();
    for record in records.iter().filter(|r| r.kind == DecisionKind::Trigger) {
        let Ok(stats) = serde_json::from_value::<TriggerStats>(record.input.clone()) else {
            report.not_replayed(
                u64::from(record.repeats.max(1)),
                format!("#{}: its input is not a trigger's", record.id),
            );
            continue;
        };
        let recorded = serde_json::from_value::<TriggerAnswer>(record.answer.clone()).map(|a| a.train).unwrap_or(false);
        report.decisions += u64::from(record.repeats.max(1));
        let entry = rounds.entry(record.round).or_default();
        if recorded && entry.0.is_none() {
            entry.0 = Some(Moment {
                id: record.id,
                at_ms: record.at_ms,
                pending: stats.pending_train,
                reason: String::new(),
            });
        }
        // A run of identical waits: asked at its first and its last moment.
        let mut moments = vec![(record.at_ms, stats.clone())];
        if record.repeats > 1 && record.last_ms > record.at_ms {
            let later = (record.last_ms - record.at_ms) / 1000;
            let mut last = stats.clone();
            last.wall_clock_secs += later;
            last.seconds_since_last_round = last.seconds_since_last_round.map(|s| s + later);
            moments.push((record.last_ms, last));
        }
        let mut first_difference = None;
        for (at_ms, stats) in &moments {
            let answer = decide(stats);
            let (train, reason) = match &answer {
                Ok(decision) => (Some(decision.train), decision.reason.clone()),
                Err(err) => (None, format!("failed: {err}")),
            };
            if train == Some(true) && entry.1.is_none() {
                entry.1 =
                    Some(Moment { id: record.id, at_ms: *at_ms, pending: stats.pending_train, reason: reason.clone() });
            }
            if train != Some(recorded) && first_difference.is_none() {
                let said = match train {
                    Some(true) => "train",
                    Some(false) => "wait",
                    None => "error",
                };
                first_difference = Some((*at_ms, stats.clone(), said, reason));
            }
        }
        match first_difference {
            None => report.agreed += u64::from(record.repeats.max(1)),
            // A run of waits disagrees as a whole: asked at its ends, not in between.
            Some((at_ms, stats, said, reason)) => report.disagree(
                keep,
                u64::from(record.repeats.max(1)),
                Disagreement {
                    id: record.id,
                    at_ms,
                    round: record.round,
                    input: trigger_input(&stats),
                    recorded: if recorded { "train" } else { "wait" }.into(),
                    recorded_reason: record.reason.clone(),
                    recorded_by: record.policy.clone(),
                    candidate: said.into(),
                    candidate_reason: reason,
                },
            ),
        }
    }
    for (round, (started, would)) in rounds {
        let next = round + 1;
        match (started, would) {
            (Some(started), Some(would)) if would.id < started.id => report.effects.push(Effect::RoundEarlier {
                round: next,
                at_ms: would.at_ms,
                train_samples: would.pending,
                recorded_at_ms: started.at_ms,
                recorded_train_samples: started.pending,
            }),
            (Some(started), None) => report.effects.push(Effect::RoundNotStarted {
                round: next,
                recorded_at_ms: started.at_ms,
                recorded_train_samples: started.pending,
            }),
            (None, Some(would)) => report.effects.push(Effect::RoundWouldStart {
                round: next,
                at_ms: would.at_ms,
                train_samples: would.pending,
                reason: would.reason,
            }),
            _ => {}
        }
    }
    report
}

/// A moment a round started, or would have: the record, its time, the train samples pending.
struct Moment {
    id: i64,
    at_ms: u64,
    pending: u64,
    reason: String,
}

fn trigger_input(stats: &TriggerStats) -> String {
    let since = stats.seconds_since_last_round.map_or("never".to_owned(), |s| format!("{s}s ago"));
    format!(
        "pendingTrain {}, pendingEval {}, total {}, rounds {}, last round {since}",
        stats.pending_train, stats.pending_eval, stats.total_samples, stats.rounds_completed
    )
}

/// Replays split records: `batch` reads a batch's samples back from the dataset (or says why
/// it cannot), `split` asks the candidate. The recorded assignments are the batch's; for Sedna's
/// rule they are computed again from the sequence numbers and `trainProb`.
pub fn splits(
    records: &[Record],
    keep: usize,
    batch: &mut dyn FnMut(&BatchInput) -> Result<perennial_policy::SampleBatch, String>,
    split: &mut dyn FnMut(perennial_policy::SampleBatch) -> Result<Assignments, String>,
) -> KindReport {
    let mut report = KindReport::default();
    // [recorded][candidate] sample counts over train, eval, skip.
    let mut moves = [[0u64; 3]; 3];
    for record in records.iter().filter(|r| r.kind == DecisionKind::Splitter) {
        let Ok(input) = serde_json::from_value::<BatchInput>(record.input.clone()) else {
            report.not_replayed(1, format!("#{}: its input is not a batch", record.id));
            continue;
        };
        let recorded: Vec<u8> = match (&record.assignments, input.train_prob) {
            (_, Some(train_prob)) => {
                Assignments::sedna_ratio(train_prob, input.first_seq, input.count as usize).as_bytes().to_vec()
            }
            (Some(bytes), None) => bytes.clone(),
            (None, None) => {
                let why = format!("batch {}: the job no longer has it (its index was replaced)", input.batch);
                report.not_replayed(1, why);
                continue;
            }
        };
        let samples = match batch(&input) {
            Ok(samples) => samples,
            Err(why) => {
                report.not_replayed(1, format!("batch {}: {why}", input.batch));
                continue;
            }
        };
        report.decisions += 1;
        let described = format!(
            "batch {}: samples {}..{} (bytes {}..{})",
            input.batch,
            input.first_seq,
            input.first_seq + input.count,
            input.start,
            input.end
        );
        let disagreement = |candidate: String, candidate_reason: String| Disagreement {
            id: record.id,
            at_ms: record.at_ms,
            round: record.round,
            input: described.clone(),
            recorded: counts(&recorded),
            recorded_reason: record.reason.clone(),
            recorded_by: record.policy.clone(),
            candidate,
            candidate_reason,
        };
        let candidate = match split(samples) {
            Ok(candidate) => candidate,
            Err(err) => {
                report.disagree(keep, 1, disagreement("error".into(), err));
                continue;
            }
        };
        for (was, would) in recorded.iter().zip(candidate.as_bytes()) {
            moves[usize::from(*was).min(2)][usize::from(*would).min(2)] += 1;
        }
        if candidate.as_bytes() == recorded.as_slice() {
            report.agreed += 1;
        } else {
            let changed = recorded.iter().zip(candidate.as_bytes()).filter(|(a, b)| a != b).count();
            let reason = format!("{changed} samples assigned otherwise");
            report.disagree(keep, 1, disagreement(counts(candidate.as_bytes()), reason));
        }
    }
    let names = ["train", "eval", "skip"];
    for (from, row) in moves.iter().enumerate() {
        for (to, count) in row.iter().enumerate() {
            if from != to && *count > 0 {
                let (from, to) = (names[from].to_owned(), names[to].to_owned());
                report.effects.push(Effect::SamplesMoved { samples: *count, from, to });
            }
        }
    }
    report
}

fn counts(assignments: &[u8]) -> String {
    let count = |a: Assignment| assignments.iter().filter(|b| **b == a as u8).count();
    format!("train {}, eval {}, skip {}", count(Assignment::Train), count(Assignment::Eval), count(Assignment::Skip))
}

/// Replays selection records with `select`.
pub fn selections(
    records: &[Record],
    keep: usize,
    select: &mut dyn FnMut(&SelectInput) -> Result<Choice, String>,
) -> KindReport {
    let mut report = KindReport::default();
    for record in records.iter().filter(|r| r.kind == DecisionKind::Selector) {
        let (Ok(input), Ok(recorded)) = (
            serde_json::from_value::<SelectInput>(record.input.clone()),
            serde_json::from_value::<SelectAnswer>(record.answer.clone()),
        ) else {
            report.not_replayed(1, format!("#{}: not a selection", record.id));
            continue;
        };
        report.decisions += 1;
        let (candidate, reason) = match select(&input) {
            Ok(choice) => (Some(choice.deploy), choice.reason),
            Err(err) => (None, format!("failed: {err}")),
        };
        if candidate == Some(recorded.deploy) {
            report.agreed += 1;
            continue;
        }
        let name = |deploy: Option<u32>| deploy.map_or("keep".to_owned(), |i| format!("deploy {i}"));
        // The model a selection deploys (`None`: it keeps the deployed one).
        let model = |deploy: Option<u32>| {
            let model = input.candidates.get(deploy? as usize)?;
            Some(SelectedModel { url: model.url.clone(), metrics: model.metrics.clone() })
        };
        report.effects.push(Effect::SelectedOtherwise {
            round: record.round,
            recorded: model(recorded.deploy),
            candidate: candidate.and_then(model),
            candidate_failed: candidate.is_none(),
        });
        let deployed = input.deployed.as_ref().map_or("none".to_owned(), |m| metrics(&m.metrics));
        report.disagree(
            keep,
            1,
            Disagreement {
                id: record.id,
                at_ms: record.at_ms,
                round: record.round,
                input: format!("deployed {deployed}; {} candidates", input.candidates.len()),
                recorded: name(recorded.deploy),
                recorded_reason: record.reason.clone(),
                recorded_by: record.policy.clone(),
                candidate: candidate.map_or("error".to_owned(), name),
                candidate_reason: reason,
            },
        );
    }
    report
}

fn metrics(metrics: &perennial_policy::Metrics) -> String {
    let shown: Vec<String> = metrics.iter().map(|(name, value)| format!("{name}={value}")).collect();
    format!("({})", shown.join(", "))
}

/// Unix milliseconds as RFC 3339 (UTC, seconds).
pub fn time(ms: u64) -> String {
    jiff::Timestamp::from_second((ms / 1000) as i64).map(|t| t.to_string()).unwrap_or_default()
}

fn seconds(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Reads a recorded batch's samples back from the job's dataset index: the same bytes (their
/// checksum), the same number of samples.
pub fn read_batch(
    index: &mut dyn crate::IndexFile,
    input: &BatchInput,
    csv: bool,
    max_line: usize,
) -> Result<perennial_policy::SampleBatch, String> {
    let length = input.end.checked_sub(input.start).ok_or("its byte range is empty")? as usize;
    // The range ends at the last sample's text; its line end follows (at most "\r\n").
    let bytes = index.read_at(input.start, length + 2).map_err(|err| format!("reading {}: {err}", index.name()))?;
    let range = &bytes[..length.min(bytes.len())];
    if hex::encode(crate::ingest::batch_checksum(range)) != input.checksum {
        return Err(format!("bytes {}..{} of {} changed since it was split", input.start, input.end, index.name()));
    }
    // Not line 1: a csv header is never in a batch.
    let cursor = crate::lines::Cursor { offset: input.start, lines: 1, samples: input.first_seq, skipping_from: None };
    let scan = crate::lines::scan(&bytes, cursor, max_line, csv);
    if scan.samples.len() as u64 != input.count {
        return Err(format!("bytes {}..{} no longer hold its {} samples", input.start, input.end, input.count));
    }
    let mut batch = perennial_policy::SampleBatch::with_capacity(input.first_seq, scan.samples.len(), bytes.len());
    for line in &scan.samples {
        batch.push(line.text).map_err(|_| "the batch is too large".to_owned())?;
    }
    Ok(batch)
}
