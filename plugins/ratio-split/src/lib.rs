//! `builtin:ratio-split`: Sedna's `trainProb` split, made independent of batch boundaries.
//!
//! Config: `{"trainProb": 0.8, "mode": "ratio"}`.
//!
//! - `mode: "ratio"` (the default): Sedna's rule, counted over the job's whole stream instead of
//!   per batch. Sample k of the job (its 0-based sequence number) goes to train when
//!   floor(trainProb × (k+1)) > floor(trainProb × k), otherwise to eval. After n samples exactly
//!   floor(trainProb × n) have gone to train — what Sedna's rule gives when the whole stream so
//!   far is one batch — however the stream was cut into batches, one line at a time included.
//!   The rule needs only the batch's first sequence number, so it keeps no state.
//! - `mode: "batch"`: Sedna's rule as Sedna applies it: of each batch of n new samples, the
//!   first floor(trainProb × n) go to train and the rest to eval. The result depends on where the
//!   batches begin and end; a batch of one sample never trains when trainProb < 1.
//! - `mode: "hash"`: each sample goes to train when a stable hash of its line (FNV-1a, 64 bit),
//!   read as a fraction of 2^64, is below trainProb; otherwise to eval. The same line always
//!   lands on the same side, whatever the batches, so a split can be reproduced.

use perennial_guest::{Assignment, Batch, Splitter};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    train_prob: f64,
    #[serde(default)]
    mode: Mode,
}

#[derive(Deserialize, Default, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Ratio,
    Batch,
    Hash,
}

pub struct RatioSplit {
    train_prob: f64,
    mode: Mode,
}

/// Sedna's count of train samples in a batch of `n`: floor(trainProb × n), computed in f64 as
/// Sedna computes it.
pub fn train_count(train_prob: f64, n: u64) -> u64 {
    ((train_prob * n as f64).floor().max(0.0) as u64).min(n)
}

/// The cumulative rule for the samples `first_seq ..first_seq + n` of a job: sample k trains
/// when `train_count(k + 1) > train_count(k)`. The train samples among the first n of the job
/// number `train_count(n)`, whatever the batches.
pub fn cumulative(train_prob: f64, first_seq: u64, n: usize) -> Vec<Assignment> {
    let mut before = train_count(train_prob, first_seq);
    (first_seq..first_seq + n as u64)
        .map(|seq| {
            let after = train_count(train_prob, seq + 1);
            let trains = after > before;
            before = after;
            if trains { Assignment::Train } else { Assignment::Eval }
        })
        .collect()
}

/// FNV-1a, 64 bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    // Eight bytes per iteration: the same hash, with fewer loop back-edges (each one costs an
    // interruption check in WebAssembly).
    let (words, rest) = bytes.as_chunks::<8>();
    for chunk in words {
        let mut word = u64::from_le_bytes(*chunk);
        for _ in 0..8 {
            hash ^= word & 0xff;
            hash = hash.wrapping_mul(PRIME);
            word >>= 8;
        }
    }
    for &byte in rest {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

/// The hash rule for one line.
pub fn hash_assignment(train_prob: f64, line: &[u8]) -> Assignment {
    // The top 53 bits as a fraction in [0, 1).
    let fraction = (fnv1a(line) >> 11) as f64 / (1u64 << 53) as f64;
    if fraction < train_prob { Assignment::Train } else { Assignment::Eval }
}

impl RatioSplit {
    pub fn new(train_prob: f64, mode: Mode) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&train_prob) {
            return Err(format!("trainProb: {train_prob} is outside [0, 1]"));
        }
        Ok(RatioSplit { train_prob, mode })
    }
}

impl Splitter for RatioSplit {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        RatioSplit::new(config.train_prob, config.mode)
    }

    fn split(&mut self, batch: &Batch) -> Vec<Assignment> {
        match self.mode {
            Mode::Ratio => cumulative(self.train_prob, batch.first_seq(), batch.len()),
            Mode::Batch => {
                let n = batch.len();
                let train = train_count(self.train_prob, n as u64) as usize;
                let mut out = vec![Assignment::Train; n];
                out[train..].fill(Assignment::Eval);
                out
            }
            Mode::Hash => (0..batch.len()).map(|i| hash_assignment(self.train_prob, batch.bytes(i))).collect(),
        }
    }
}

perennial_guest::export_splitter!(RatioSplit);

#[cfg(test)]
mod tests {
    use super::*;
    use Assignment::{Eval, Train};

    fn split(config: &str, lines: &[&str]) -> Vec<Assignment> {
        RatioSplit::configure(config).unwrap().split(&Batch::from_lines(0, lines))
    }

    #[test]
    fn batch_mode_is_sednas_floor_rule_per_batch() {
        // (trainProb, n, train count)
        let cases: &[(f64, usize, usize)] = &[
            (0.8, 10, 8),
            (0.8, 600, 480),
            (0.8, 1, 0),
            (0.8, 4, 3),
            (0.5, 3, 1),
            (0.0, 5, 0),
            (1.0, 5, 5),
            (0.75, 0, 0),
            (0.29, 100, 28), // floating point, exactly as Sedna computes it
        ];
        for &(p, n, train) in cases {
            let lines: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
            let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
            let out = split(&format!(r#"{{"trainProb": {p}, "mode": "batch"}}"#), &refs);
            assert_eq!(out.len(), n);
            assert!(out[..train].iter().all(|a| *a == Train), "{p} x {n}");
            assert!(out[train..].iter().all(|a| *a == Eval), "{p} x {n}");
        }
    }

    /// The ratio rule's assignments for the lines `first_seq..first_seq + n` of a stream.
    fn ratio(p: f64, first_seq: u64, n: usize) -> Vec<Assignment> {
        let lines: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
        let mut splitter = RatioSplit::configure(&format!(r#"{{"trainProb": {p}}}"#)).unwrap();
        splitter.split(&Batch::from_lines(first_seq, &lines))
    }

    #[test]
    fn ratio_mode_trains_sednas_count_over_the_whole_stream() {
        // 0.8: every run of five samples has four train, the first of the five goes to eval.
        assert_eq!(ratio(0.8, 0, 10), [Eval, Train, Train, Train, Train, Eval, Train, Train, Train, Train]);
        // One line at a time trains too (Sedna's per-batch rule never trains a batch of one).
        let one_by_one: Vec<Assignment> = (0..10).flat_map(|k| ratio(0.8, k, 1)).collect();
        assert_eq!(one_by_one, ratio(0.8, 0, 10));
        // (trainProb, n, train count): floor(trainProb × n), as Sedna's rule on one batch of n.
        let cases: &[(f64, usize, usize)] = &[
            (0.8, 1, 0),
            (0.8, 2, 1),
            (0.8, 63, 50),
            (0.8, 64, 51),
            (0.8, 600, 480),
            (0.5, 3, 1),
            (0.0, 5, 0),
            (1.0, 5, 5),
            (0.75, 0, 0),
            (0.29, 100, 28), // floating point, exactly as Sedna computes it
        ];
        for &(p, n, train) in cases {
            let out = ratio(p, 0, n);
            assert_eq!(out.len(), n);
            assert_eq!(out.iter().filter(|a| **a == Train).count(), train, "{p} x {n}");
        }
        // A batch that starts mid-stream continues the count.
        assert_eq!(ratio(0.8, 5, 5), ratio(0.8, 0, 10)[5..]);
    }

    mod property {
        use super::*;
        use proptest::prelude::*;

        /// The ratio rule over `total` lines cut into batches at `cuts` (positions, any order).
        fn cut(p: f64, total: usize, cuts: &[usize]) -> Vec<Assignment> {
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (total + 1)).collect();
            bounds.extend([0, total]);
            bounds.sort_unstable();
            bounds.dedup();
            bounds.windows(2).flat_map(|w| ratio(p, w[0] as u64, w[1] - w[0])).collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn the_same_samples_train_however_the_stream_is_cut(
                p in prop_oneof![0.0..=1.0f64, Just(0.8), Just(0.5), Just(1.0), Just(0.0)],
                total in 0usize..400,
                cuts in proptest::collection::vec(any::<usize>(), 0..40),
            ) {
                let whole = ratio(p, 0, total);
                prop_assert_eq!(&cut(p, total, &cuts), &whole);
                let one_at_a_time: Vec<Assignment> = (0..total as u64).flat_map(|k| ratio(p, k, 1)).collect();
                prop_assert_eq!(&one_at_a_time, &whole);
                // Every prefix trains Sedna's count for one batch of that length: within one
                // sample of trainProb × n.
                let mut train = 0usize;
                for (n, a) in whole.iter().enumerate() {
                    train += usize::from(*a == Train);
                    prop_assert_eq!(train as u64, train_count(p, n as u64 + 1));
                    prop_assert!((train as f64 - p * (n + 1) as f64).abs() < 1.0 + 1e-9);
                }
            }
        }
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hash_mode_is_independent_of_batch_boundaries() {
        let lines: Vec<String> = (0..2000).map(|i| format!("images/{i}.jpg label{}", i % 7)).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let config = r#"{"trainProb": 0.8, "mode": "hash"}"#;
        let whole = split(config, &refs);
        let mut pieces = split(config, &refs[..333]);
        pieces.extend(split(config, &refs[333..1500]));
        pieces.extend(split(config, &refs[1500..]));
        assert_eq!(whole, pieces);
        let train = whole.iter().filter(|a| **a == Train).count();
        assert!((1500..1700).contains(&train), "about 80% train, got {train} of 2000");
        assert_eq!(split(r#"{"trainProb": 1, "mode": "hash"}"#, &refs[..50]), vec![Train; 50]);
        assert_eq!(split(r#"{"trainProb": 0, "mode": "hash"}"#, &refs[..50]), vec![Eval; 50]);
    }

    #[test]
    fn configure_rejects_bad_configs() {
        let cases: &[(&str, &str)] = &[
            (r#"{"trainProb": 1.5}"#, "trainProb: 1.5 is outside [0, 1]"),
            (r#"{"trainProb": -0.1}"#, "trainProb: -0.1 is outside [0, 1]"),
            (r#"{}"#, "trainProb: missing"),
            (r#"{"trainProb": 0.5, "mode": "random"}"#, r#"mode: "random" is not one of"#),
            (r#"{"trainProb": 0.5, "batch": true}"#, "batch: unknown field"),
        ];
        for (config, expected) in cases {
            let err = RatioSplit::configure(config).err().unwrap_or_else(|| panic!("{config} accepted"));
            assert!(err.contains(expected), "{config}: {err}");
        }
    }
}
