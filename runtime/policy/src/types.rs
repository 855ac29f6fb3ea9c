//! The host's view of what crosses the policy boundary: plain Rust types with JSON forms
//! (camelCase field names, as the WIT fields), converted to and from the WIT types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bindings::{selector, trigger, types};

/// Named metrics, e.g. `{"accuracy": 0.93}`.
pub type Metrics = BTreeMap<String, f64>;

fn to_wit_metrics(metrics: &Metrics) -> Vec<types::Metric> {
    metrics.iter().map(|(name, value)| types::Metric { name: name.clone(), value: *value }).collect()
}

/// What a trigger sees. A field left out of the JSON form is zero or none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TriggerStats {
    /// Train samples since the last round started: Sedna's `num_of_samples`.
    pub pending_train: u64,
    pub pending_eval: u64,
    pub total_samples: u64,
    pub rounds_completed: u32,
    pub seconds_since_last_round: Option<u64>,
    /// Unix seconds, UTC.
    pub wall_clock_secs: u64,
    pub utc_offset_secs: i32,
    pub deployed_metrics: Metrics,
}

impl TriggerStats {
    pub(super) fn to_wit(&self) -> trigger::Stats {
        trigger::Stats {
            pending_train: self.pending_train,
            pending_eval: self.pending_eval,
            total_samples: self.total_samples,
            rounds_completed: self.rounds_completed,
            seconds_since_last_round: self.seconds_since_last_round,
            wall_clock_secs: self.wall_clock_secs,
            utc_offset_secs: self.utc_offset_secs,
            deployed_metrics: to_wit_metrics(&self.deployed_metrics),
        }
    }
}

/// A trigger's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub train: bool,
    pub reason: String,
    pub recheck_after_secs: Option<u64>,
}

/// A model handed to a selector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ModelInfo {
    pub url: String,
    pub format: String,
    pub metrics: Metrics,
}

impl ModelInfo {
    pub(super) fn to_wit(&self) -> types::Model {
        types::Model { url: self.url.clone(), format: self.format.clone(), metrics: to_wit_metrics(&self.metrics) }
    }
}

/// A selector's answer: the index of the candidate to deploy, or none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Choice {
    pub deploy: Option<u32>,
    pub reason: String,
}

impl From<selector::Choice> for Choice {
    fn from(choice: selector::Choice) -> Self {
        Choice { deploy: choice.deploy, reason: choice.reason }
    }
}

/// Where a sample goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Assignment {
    Train = 0,
    Eval = 1,
    Skip = 2,
}

/// A batch of samples (lines without their line ends), packed the way it crosses into the
/// plugin: one buffer and the end offset of each line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleBatch {
    pub(super) first_seq: u64,
    pub(super) data: Vec<u8>,
    pub(super) ends: Vec<u32>,
}

/// The batch would pass 4 GiB of text.
#[derive(Debug, thiserror::Error)]
#[error("a batch holds at most 4 GiB of sample text")]
pub struct BatchFull;

impl SampleBatch {
    /// An empty batch whose first sample has sequence number `first_seq`.
    pub fn new(first_seq: u64) -> Self {
        SampleBatch { first_seq, ..Self::default() }
    }

    pub fn with_capacity(first_seq: u64, samples: usize, bytes: usize) -> Self {
        SampleBatch { first_seq, data: Vec::with_capacity(bytes), ends: Vec::with_capacity(samples) }
    }

    pub fn push(&mut self, line: &str) -> Result<(), BatchFull> {
        let end = u32::try_from(self.data.len() + line.len()).map_err(|_| BatchFull)?;
        self.data.extend_from_slice(line.as_bytes());
        self.ends.push(end);
        Ok(())
    }

    pub fn from_lines<S: AsRef<str>>(first_seq: u64, lines: &[S]) -> Result<Self, BatchFull> {
        let mut batch = SampleBatch::new(first_seq);
        for line in lines {
            batch.push(line.as_ref())?;
        }
        Ok(batch)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// The memory it holds: its text and its line ends.
    pub fn byte_len(&self) -> usize {
        self.data.len() + self.ends.len() * size_of::<u32>()
    }

    /// Sample `index` (valid UTF-8: only `&str` goes in).
    pub fn line(&self, index: usize) -> &str {
        let start = if index == 0 { 0 } else { self.ends[index - 1] as usize };
        std::str::from_utf8(&self.data[start..self.ends[index] as usize]).unwrap_or_default()
    }
}

/// A splitter's answer, one assignment per sample, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignments(Vec<u8>);

impl Assignments {
    /// Checks the plugin's bytes: one per sample, each a valid assignment.
    pub(super) fn check(bytes: Vec<u8>, expected_len: usize) -> Result<Self, String> {
        if bytes.len() != expected_len {
            return Err(format!("split returned {} assignments for {expected_len} samples", bytes.len()));
        }
        // A max over the bytes vectorizes; find the culprit only when there is one.
        if bytes.iter().fold(0u8, |max, b| max.max(*b)) > Assignment::Skip as u8
            && let Some(position) = bytes.iter().position(|b| *b > Assignment::Skip as u8)
        {
            return Err(format!(
                "split returned {} for sample {position}, which is no assignment (0, 1 or 2)",
                bytes[position]
            ));
        }
        Ok(Assignments(bytes))
    }

    /// Sedna's `trainProb` rule counted over the job's whole stream, computed on the host (the
    /// built-in `ratio-split` rule): sample k trains when floor(trainProb × (k+1)) >
    /// floor(trainProb × k), so the first n samples of a job train floor(trainProb × n),
    /// however they were cut into batches. `first_seq` is the sequence number of the batch's
    /// first sample. The rule of a job without a splitter, and the fallback when its splitter
    /// fails.
    pub fn sedna_ratio(train_prob: f64, first_seq: u64, n: usize) -> Self {
        let train_count = |n: u64| ((train_prob * n as f64).floor().max(0.0) as u64).min(n);
        let mut before = train_count(first_seq);
        let bytes = (first_seq..first_seq + n as u64)
            .map(|seq| {
                let after = train_count(seq + 1);
                let trains = after > before;
                before = after;
                if trains { Assignment::Train as u8 } else { Assignment::Eval as u8 }
            })
            .collect();
        Assignments(bytes)
    }

    /// The bytes, one per sample (0 train, 1 eval, 2 skip), as stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, index: usize) -> Assignment {
        decode(self.0[index])
    }

    pub fn iter(&self) -> impl Iterator<Item = Assignment> + '_ {
        self.0.iter().map(|b| decode(*b))
    }

    /// (train, eval, skip) counts.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = [0usize; 3];
        for b in &self.0 {
            counts[*b as usize] += 1;
        }
        (counts[0], counts[1], counts[2])
    }

    pub fn to_vec(&self) -> Vec<Assignment> {
        self.iter().collect()
    }
}

fn decode(byte: u8) -> Assignment {
    match byte {
        0 => Assignment::Train,
        1 => Assignment::Eval,
        _ => Assignment::Skip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_ratio_rule_is_the_built_in_splitters() {
        for p in [0.0, 0.29, 0.5, 0.8, 0.93, 1.0] {
            for (first_seq, n) in [(0, 0), (0, 1), (0, 64), (7, 1), (63, 1), (1000, 333), (123_456_789, 50)] {
                let host: Vec<bool> =
                    Assignments::sedna_ratio(p, first_seq, n).iter().map(|a| a == Assignment::Train).collect();
                let plugin: Vec<bool> = ratio_split::cumulative(p, first_seq, n)
                    .iter()
                    .map(|a| *a == perennial_guest::Assignment::Train)
                    .collect();
                assert_eq!(host, plugin, "trainProb {p}, samples {first_seq}..+{n}");
            }
        }
        // One line at a time: 0.8 trains 4 of every 5.
        let trained = (0..100u64).filter(|k| Assignments::sedna_ratio(0.8, *k, 1).get(0) == Assignment::Train).count();
        assert_eq!(trained, 80);
    }
}
