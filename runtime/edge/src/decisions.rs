//! Decision records: every decision a job's policies make, with what the policy saw, so that an
//! author can read them (`perennial decisions`) and replay a candidate on them
//! (`perennial plugin replay`).
//!
//! A decision that acts (a round started, a batch split, a model chosen) is recorded in the
//! transaction that acts on it, so that a crash never leaves one without the other. A trigger's
//! decision to wait acts on nothing: it is kept in memory and written with the next write
//! transaction (at most [`WAIT_FLUSH`] later), and a run of identical waits (same inputs but the
//! clock, same answer) is one record with a count and its first and last time, so that an idle
//! job does not write a record every poll. The differing waits of a busy trigger written together
//! share one row (each keeps a number of its own), so that they cost one insert per flush, not one
//! per decision. A crash loses at most those unwritten waits, which changed nothing.
//!
//! Each job keeps the newest `maxCount` records, none older than `maxAgeSeconds`
//! (`spec.decisionRecords`), pruned as records are written.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};

use perennial_policy::{Decision, TriggerStats};
use perennial_types::RecordRetention;

/// The decision a record is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecisionKind {
    Trigger,
    Splitter,
    Selector,
}

impl DecisionKind {
    pub const ALL: [DecisionKind; 3] = [DecisionKind::Trigger, DecisionKind::Splitter, DecisionKind::Selector];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Trigger => "trigger",
            DecisionKind::Splitter => "splitter",
            DecisionKind::Selector => "selector",
        }
    }

    pub fn parse(text: &str) -> Option<DecisionKind> {
        DecisionKind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl std::fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which policy decided: its plugin, component digest and config digest (as the status shows).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecidedBy {
    pub plugin: String,
    pub digest: String,
    pub config: String,
}

impl DecidedBy {
    pub fn of<K: perennial_policy::Kind>(policy: &perennial_policy::Policy<K>) -> DecidedBy {
        DecidedBy {
            plugin: policy.info().source.clone(),
            digest: policy.info().digest.clone(),
            config: policy.config_digest().to_owned(),
        }
    }
}

impl DecidedBy {
    /// Sedna's `trainProb` rule, computed natively (a job without a splitter, or its fallback).
    pub fn native_split(train_prob: f64) -> DecidedBy {
        let config = serde_json::json!({ "trainProb": train_prob }).to_string();
        DecidedBy {
            plugin: NATIVE_SPLIT.to_owned(),
            digest: String::new(),
            config: perennial_types::config_text_digest(&config),
        }
    }
}

/// How records name Sedna's `trainProb` rule, which has no component.
pub const NATIVE_SPLIT: &str = "sedna:trainProb";

/// A split's input: the batch's place in the dataset index (not its lines, which replay reads
/// back from there).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchInput {
    /// The batch's number in the job.
    pub batch: i64,
    pub first_seq: u64,
    pub count: u64,
    /// Byte range of its samples in the index.
    pub start: u64,
    pub end: u64,
    /// The xxh3 of those bytes, hex: replay refuses a range that changed since.
    pub checksum: String,
    /// Sedna's rule decided, with this `trainProb` (its assignments are computed again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_prob: Option<f64>,
}

/// A split's answer in short (the assignments themselves are the batch's, in `batches`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitCounts {
    pub train: u64,
    pub eval: u64,
    pub skip: u64,
}

/// A selection's input, as the selector saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectInput {
    pub deployed: Option<perennial_policy::ModelInfo>,
    pub candidates: Vec<perennial_policy::ModelInfo>,
}

/// A selection's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectAnswer {
    pub deploy: Option<u32>,
}

/// A trigger's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TriggerAnswer {
    pub train: bool,
    pub recheck_after_secs: Option<u64>,
}

/// One decision as recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Its number (the order decisions were made in); 0 before it is written.
    pub id: i64,
    pub job: String,
    pub kind: DecisionKind,
    /// When it was decided, unix milliseconds; for a run of identical waits, the first.
    pub at_ms: u64,
    /// The last of a run of identical waits (else `at_ms`), and how many decisions it holds.
    pub last_ms: u64,
    pub repeats: u32,
    pub policy: DecidedBy,
    /// The job's round when it decided (a trigger: the last round started).
    pub round: i64,
    /// What the policy saw (JSON): [`TriggerStats`], [`BatchInput`] or [`SelectInput`].
    pub input: serde_json::Value,
    /// Its answer (JSON): [`TriggerAnswer`], [`SplitCounts`] or [`SelectAnswer`].
    pub answer: serde_json::Value,
    pub reason: String,
    /// A split's assignments, one byte per sample (0 train, 1 eval, 2 skip): read from its
    /// batch's row (not written twice), while the job still has it.
    #[serde(skip)]
    pub assignments: Option<Vec<u8>>,
    /// The policy's call alone, in µs (not a fresh instance's start before it); for Sedna's rule
    /// computed natively, its own time.
    pub micros: u64,
}

impl Record {
    /// A record of a decision of `kind` by `policy` at `at_ms`, in the job's `round`; its input,
    /// answer, reason and time to be filled in.
    pub fn of(kind: DecisionKind, job: &str, at_ms: u64, policy: DecidedBy, round: i64) -> Record {
        Record {
            id: 0,
            job: job.to_owned(),
            kind,
            at_ms,
            last_ms: at_ms,
            repeats: 1,
            policy,
            round,
            input: serde_json::Value::Null,
            answer: serde_json::Value::Null,
            reason: String::new(),
            assignments: None,
            micros: 0,
        }
    }

    /// Its answer in a few words: `train`, `wait`, `deploy N`, `keep`, `train N, eval M, skip K`.
    pub fn short_answer(&self) -> String {
        match self.kind {
            DecisionKind::Trigger => match serde_json::from_value::<TriggerAnswer>(self.answer.clone()) {
                Ok(TriggerAnswer { train: true, .. }) => "train".into(),
                Ok(_) => "wait".into(),
                Err(_) => "?".into(),
            },
            DecisionKind::Selector => match serde_json::from_value::<SelectAnswer>(self.answer.clone()) {
                Ok(SelectAnswer { deploy: Some(i) }) => format!("deploy {i}"),
                Ok(_) => "keep".into(),
                Err(_) => "?".into(),
            },
            DecisionKind::Splitter => match serde_json::from_value::<SplitCounts>(self.answer.clone()) {
                Ok(SplitCounts { train, eval, skip }) => format!("train {train}, eval {eval}, skip {skip}"),
                Err(_) => "?".into(),
            },
        }
    }
}

/// The longest an unwritten wait stays in memory.
pub const WAIT_FLUSH: Duration = Duration::from_secs(5);

/// A run of a trigger's identical waits (the same inputs but the clock, the same answer), in
/// memory: kept typed, and serialized only when it is written.
struct WaitRun {
    /// Its own row, once written alone (0: none yet).
    id: i64,
    /// Its row lacks some of it (never written, or repeated since).
    unwritten: bool,
    by: Arc<DecidedBy>,
    round: i64,
    stats: TriggerStats,
    recheck_after_secs: Option<u64>,
    reason: String,
    at_ms: u64,
    last_ms: u64,
    repeats: u32,
    micros: u64,
}

impl WaitRun {
    /// Whether a wait with these inputs and answer goes on with this run.
    fn continues(&self, round: i64, stats: &TriggerStats, decision: &Decision, by: &DecidedBy) -> bool {
        self.round == round
            && self.recheck_after_secs == decision.recheck_after_secs
            && self.reason == decision.reason
            && same_but_the_clock(&self.stats, stats)
            && *self.by == *by
    }

    fn answer(&self) -> TriggerAnswer {
        TriggerAnswer { train: false, recheck_after_secs: self.recheck_after_secs }
    }
}

/// Whether two trigger inputs differ at most in the clock (the wall clock, and so the time since
/// the last round).
fn same_but_the_clock(a: &TriggerStats, b: &TriggerStats) -> bool {
    // Destructured, so that a new field must be placed on one side or the other.
    let TriggerStats {
        pending_train,
        pending_eval,
        total_samples,
        rounds_completed,
        seconds_since_last_round: _,
        wall_clock_secs: _,
        utc_offset_secs,
        deployed_metrics,
    } = a;
    *pending_train == b.pending_train
        && *pending_eval == b.pending_eval
        && *total_samples == b.total_samples
        && *rounds_completed == b.rounds_completed
        && *utc_offset_secs == b.utc_offset_secs
        && *deployed_metrics == b.deployed_metrics
}

/// One run of waits inside a packed row (`runs` > 1), whose columns hold the job, policy and
/// round: a JSON array, a third of an object's bytes (what a flush costs is mostly its bytes):
/// `[atMs, lastMs, repeats, micros, recheckAfterSecs, reason, pendingTrain, pendingEval,
/// totalSamples, roundsCompleted, secondsSinceLastRound, wallClockSecs, utcOffsetSecs,
/// deployedMetrics]`.
#[derive(Serialize, Deserialize)]
struct PackedRun<Reason, Metrics>(
    u64,
    u64,
    u32,
    u64,
    Option<u64>,
    Reason,
    u64,
    u64,
    u64,
    u32,
    Option<u64>,
    u64,
    i32,
    Metrics,
);

impl<'a> PackedRun<&'a str, &'a perennial_policy::Metrics> {
    fn of(run: &'a WaitRun) -> Self {
        // Destructured, so that a new field cannot be left out.
        let TriggerStats {
            pending_train,
            pending_eval,
            total_samples,
            rounds_completed,
            seconds_since_last_round,
            wall_clock_secs,
            utc_offset_secs,
            deployed_metrics,
        } = &run.stats;
        PackedRun(
            run.at_ms,
            run.last_ms,
            run.repeats,
            run.micros,
            run.recheck_after_secs,
            &run.reason,
            *pending_train,
            *pending_eval,
            *total_samples,
            *rounds_completed,
            *seconds_since_last_round,
            *wall_clock_secs,
            *utc_offset_secs,
            deployed_metrics,
        )
    }
}

impl PackedRun<String, perennial_policy::Metrics> {
    /// The record it stands for, in its row `of`, numbered `id`.
    fn record(self, id: i64, of: &Record) -> Record {
        let PackedRun(
            at_ms,
            last_ms,
            repeats,
            micros,
            recheck_after_secs,
            reason,
            train,
            eval,
            total,
            rounds,
            since,
            wall,
            utc,
            metrics,
        ) = self;
        let stats = TriggerStats {
            pending_train: train,
            pending_eval: eval,
            total_samples: total,
            rounds_completed: rounds,
            seconds_since_last_round: since,
            wall_clock_secs: wall,
            utc_offset_secs: utc,
            deployed_metrics: metrics,
        };
        Record {
            id,
            at_ms,
            last_ms,
            repeats,
            micros,
            input: serde_json::to_value(stats).unwrap_or_default(),
            answer: serde_json::to_value(TriggerAnswer { train: false, recheck_after_secs }).unwrap_or_default(),
            reason,
            ..of.clone()
        }
    }
}

/// A job's waits not yet written.
#[derive(Default)]
struct JobWaits {
    /// Runs that ended before their row was complete, oldest first.
    closed: Vec<WaitRun>,
    /// The run going on.
    open: Option<WaitRun>,
    /// Since when some of it waits to be written.
    since: Option<Instant>,
}

/// When a job's records were last pruned, and what its retention allows.
struct Pruning {
    /// Records written since the last prune...
    written: u32,
    /// ...and how many may be before the next one.
    every: u32,
    max_count: u32,
}

/// What the store keeps of decision records between transactions.
#[derive(Default)]
pub struct Recorder {
    waits: BTreeMap<String, JobWaits>,
    pruning: HashMap<String, Pruning>,
    /// Shadow policies' counts not yet written, and since when.
    shadows: BTreeMap<(String, DecisionKind), (crate::shadow::Tally, Instant)>,
}

impl Recorder {
    /// Notes a trigger's decision to wait; written with the next transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn wait(
        &mut self,
        job: &str,
        round: i64,
        stats: &TriggerStats,
        decision: &Decision,
        policy: &DecidedBy,
        at_ms: u64,
        micros: u64,
    ) {
        let waits = match self.waits.get_mut(job) {
            Some(waits) => waits,
            None => self.waits.entry(job.to_owned()).or_default(),
        };
        waits.since.get_or_insert_with(Instant::now);
        if let Some(open) = &mut waits.open
            && open.continues(round, stats, decision, policy)
        {
            open.repeats = open.repeats.saturating_add(1);
            open.last_ms = at_ms;
            open.micros = open.micros.max(micros);
            open.unwritten = true;
            return;
        }
        let by = match &waits.open {
            Some(open) if *open.by == *policy => open.by.clone(),
            _ => Arc::new(policy.clone()),
        };
        let run = WaitRun {
            id: 0,
            unwritten: true,
            by,
            round,
            stats: stats.clone(),
            recheck_after_secs: decision.recheck_after_secs,
            reason: decision.reason.clone(),
            at_ms,
            last_ms: at_ms,
            repeats: 1,
            micros,
        };
        // The previous run keeps its row if it is complete; else it is written with the next
        // transaction.
        if let Some(previous) = waits.open.replace(run)
            && previous.unwritten
        {
            waits.closed.push(previous);
        }
    }

    /// Adds to a shadow's counts; written with the next transaction.
    pub fn shadow(&mut self, job: &str, kind: DecisionKind, tally: crate::shadow::Tally) {
        let entry = self.shadows.entry((job.to_owned(), kind)).or_insert_with(|| (Default::default(), Instant::now()));
        entry.0.add(tally);
    }

    /// Whether unwritten waits or shadow counts have waited [`WAIT_FLUSH`].
    pub fn flush_due(&self) -> bool {
        let shadows = self.shadows.values().map(|(_, since)| *since);
        shadows.chain(self.waits.values().filter_map(|waits| waits.since)).any(|since| since.elapsed() >= WAIT_FLUSH)
    }

    /// Writes the unwritten waits and shadow counts in `tx`; a failure is logged (they changed
    /// nothing).
    pub fn flush(&mut self, tx: &Transaction<'_>) {
        for ((job, kind), (tally, _)) in std::mem::take(&mut self.shadows) {
            if let Err(err) = tally.write(tx, &job, kind) {
                tracing::warn!(job, "recording the {kind} shadow's counts: {err}");
            }
        }
        for (job, waits) in &mut self.waits {
            if waits.since.take().is_none() {
                continue;
            }
            if let Err(err) = write_waits(tx, &mut self.pruning, job, waits) {
                tracing::warn!(job, "recording a trigger's waits: {err}");
            }
        }
    }

    /// Records a decision that acts, in the transaction that acts on it.
    pub fn record(&mut self, tx: &Transaction<'_>, record: &Record) -> rusqlite::Result<()> {
        if make_room(tx, &mut self.pruning, &record.job, record.at_ms, 1)?.is_none() {
            return Ok(());
        }
        insert(
            tx,
            &Row {
                id: None,
                job: &record.job,
                kind: record.kind,
                at_ms: record.at_ms,
                last_ms: record.last_ms,
                repeats: record.repeats,
                by: &record.policy,
                round: record.round,
                input: &record.input.to_string(),
                answer: &record.answer.to_string(),
                reason: &record.reason,
                micros: record.micros,
                runs: 1,
            },
        )
        .map(drop)
    }

    /// Forgets what it holds of `job` (deleted).
    pub fn forget(&mut self, job: &str) {
        self.waits.remove(job);
        self.pruning.remove(job);
        self.shadows.retain(|(shadowed, _), _| shadowed != job);
    }
}

/// Writes a job's unwritten waits: a run whose row is out of date is brought up to date, runs
/// never written are packed (one row per policy and round), the run going on gets a row of its
/// own (brought up to date while it goes on).
fn write_waits(
    tx: &Transaction<'_>,
    pruning: &mut HashMap<String, Pruning>,
    job: &str,
    waits: &mut JobWaits,
) -> rusqlite::Result<()> {
    let mut fresh: Vec<WaitRun> = Vec::new();
    for run in std::mem::take(&mut waits.closed) {
        // Pruned, or its transaction rolled back: written anew.
        if run.id == 0 || !update_run(tx, &run)? {
            fresh.push(run);
        }
    }
    if let Some(run) = waits.open.as_mut().filter(|open| open.unwritten && open.id > 0)
        && update_run(tx, run)?
    {
        run.unwritten = false;
    }
    let open = waits.open.as_mut().filter(|open| open.unwritten);
    let adding = fresh.len() + usize::from(open.is_some());
    if adding == 0 {
        return Ok(());
    }
    let decided_ms = fresh.first().or(open.as_deref()).map_or(0, |run| run.at_ms);
    let Some(max_count) = make_room(tx, pruning, job, decided_ms, adding as u32)? else { return Ok(()) };
    // More than the job keeps: the newest.
    let room = (max_count as usize).saturating_sub(usize::from(open.is_some()));
    fresh.drain(..fresh.len().saturating_sub(room));
    for group in fresh.chunk_by(|a, b| a.by == b.by && a.round == b.round) {
        insert_runs(tx, job, group)?;
    }
    if let Some(run) = open {
        run.id = insert_runs(tx, job, std::slice::from_ref(run))?;
        run.unwritten = false;
    }
    Ok(())
}

/// Brings a run's own row up to date; false if it has none (pruned, or rolled back).
fn update_run(tx: &Transaction<'_>, run: &WaitRun) -> rusqlite::Result<bool> {
    let mut update = tx.prepare_cached("UPDATE decisions SET last_ms = ?2, repeats = ?3, micros = ?4 WHERE id = ?1")?;
    let updated = update.execute(params![run.id, run.last_ms as i64, run.repeats, run.micros as i64])?;
    Ok(updated == 1)
}

/// Inserts runs of the same policy and round as one row: a lone run as any record, more as a
/// packed row whose ids are reserved below its own (so that every run keeps a number of its
/// own, in order). Returns the row's id.
fn insert_runs(tx: &Transaction<'_>, job: &str, runs: &[WaitRun]) -> rusqlite::Result<i64> {
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else { return Ok(0) };
    let answer = serde_json::to_string(&last.answer()).unwrap_or_default();
    let row = Row {
        id: None,
        job,
        kind: DecisionKind::Trigger,
        at_ms: first.at_ms,
        last_ms: last.last_ms,
        repeats: last.repeats,
        by: &last.by,
        round: last.round,
        input: "",
        answer: &answer,
        reason: &last.reason,
        micros: last.micros,
        runs: 1,
    };
    if let [only] = runs {
        let input = serde_json::to_string(&only.stats).unwrap_or_default();
        return insert(tx, &Row { input: &input, ..row });
    }
    let packed: Vec<_> = runs.iter().map(PackedRun::of).collect();
    let input = serde_json::to_string(&packed).unwrap_or_default();
    let highest: i64 = tx.query_row("SELECT COALESCE(MAX(id), 0) FROM decisions", [], |r| r.get(0))?;
    let packed_row = Row {
        id: Some(highest + runs.len() as i64),
        repeats: runs.iter().map(|run| run.repeats).fold(0u32, u32::saturating_add),
        micros: runs.iter().map(|run| run.micros).max().unwrap_or(0),
        runs: runs.len() as u32,
        input: &input,
        ..row
    };
    insert(tx, &packed_row)
}

/// A decisions row as written.
struct Row<'a> {
    /// Given for a packed row (its runs' ids are reserved below it); else the next.
    id: Option<i64>,
    job: &'a str,
    kind: DecisionKind,
    at_ms: u64,
    last_ms: u64,
    repeats: u32,
    by: &'a DecidedBy,
    round: i64,
    input: &'a str,
    answer: &'a str,
    reason: &'a str,
    micros: u64,
    runs: u32,
}

fn insert(tx: &Transaction<'_>, row: &Row<'_>) -> rusqlite::Result<i64> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO decisions (id, job, kind, at_ms, last_ms, repeats, plugin, digest, config, round, input, answer,
                                reason, micros, runs)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?;
    insert.execute(params![
        row.id,
        row.job,
        row.kind.as_str(),
        row.at_ms as i64,
        row.last_ms as i64,
        row.repeats,
        row.by.plugin,
        row.by.digest,
        row.by.config,
        row.round,
        row.input,
        row.answer,
        row.reason,
        row.micros as i64,
        row.runs,
    ])?;
    Ok(tx.last_insert_rowid())
}

/// Before `adding` records of `job` are written: prunes its records now and then (every tenth
/// of its `maxCount`). Returns how many it keeps, `None` if it records nothing.
fn make_room(
    tx: &Transaction<'_>,
    pruning: &mut HashMap<String, Pruning>,
    job: &str,
    now_ms: u64,
    adding: u32,
) -> rusqlite::Result<Option<u32>> {
    let due = pruning.get(job).is_none_or(|p| p.written >= p.every);
    if due {
        let retention = prune(tx, job, now_ms, adding)?;
        let every = (retention.max_count / 10).max(1);
        pruning.insert(job.to_owned(), Pruning { written: 0, every, max_count: retention.max_count });
    }
    let Some(state) = pruning.get_mut(job) else { return Ok(None) };
    if state.max_count == 0 {
        return Ok(None);
    }
    state.written = state.written.saturating_add(adding);
    Ok(Some(state.max_count))
}

/// The job's retention (its spec's, else the default).
fn retention(tx: &Transaction<'_>, job: &str) -> rusqlite::Result<RecordRetention> {
    let spec: Option<String> = tx
        .query_row("SELECT json_extract(spec, '$.decisionRecords') FROM jobs WHERE name = ?1", [job], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(spec.and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default())
}

/// Removes the job's records beyond its retention, leaving room for `adding`; returns the
/// retention.
fn prune(tx: &Transaction<'_>, job: &str, now_ms: u64, adding: u32) -> rusqlite::Result<RecordRetention> {
    let retention = retention(tx, job)?;
    let oldest_kept = now_ms.saturating_sub(retention.max_age_seconds.saturating_mul(1000)) as i64;
    // Walks the job's records from the oldest, up to the first young one.
    let first_young: Option<i64> = tx
        .query_row(
            "SELECT id FROM decisions WHERE job = ?1 AND last_ms >= ?2 ORDER BY id LIMIT 1",
            params![job, oldest_kept],
            |r| r.get(0),
        )
        .optional()?;
    tx.execute("DELETE FROM decisions WHERE job = ?1 AND id < ?2", params![job, first_young.unwrap_or(i64::MAX)])?;
    // Room for the records about to be written. The newest `keep` rows hold `keep` records or
    // more; those beyond the rows of singles are the packed rows' other runs (found by their
    // partial index), and that many more rows go. Never more than `keep` are kept; a packed
    // row goes whole.
    let keep = i64::from(retention.max_count.saturating_sub(adding));
    let nth_newest = |n: i64| -> rusqlite::Result<Option<i64>> {
        tx.prepare_cached("SELECT id FROM decisions WHERE job = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2")?
            .query_row(params![job, n], |r| r.get(0))
            .optional()
    };
    let mut first_gone = nth_newest(keep)?;
    let packed: i64 = tx
        .prepare_cached("SELECT COALESCE(SUM(runs - 1), 0) FROM decisions WHERE job = ?1 AND runs > 1 AND id > ?2")?
        .query_row(params![job, first_gone.unwrap_or(-1)], |r| r.get(0))?;
    if packed > 0 {
        first_gone = nth_newest((keep - packed).max(0))?;
    }
    if let Some(first_gone) = first_gone {
        tx.execute("DELETE FROM decisions WHERE job = ?1 AND id <= ?2", params![job, first_gone])?;
    }
    Ok(retention)
}

/// Which records to read.
#[derive(Clone, Debug, Default)]
pub struct Query {
    pub kind: Option<DecisionKind>,
    /// Only records decided at or after this time (unix milliseconds; a wait run, its last).
    pub since_ms: Option<u64>,
    /// At most this many, the newest (`None`: all).
    pub limit: Option<usize>,
}

/// The job's records, oldest first.
pub fn read(conn: &rusqlite::Connection, job: &str, query: &Query) -> rusqlite::Result<Vec<Record>> {
    let mut statement = conn.prepare(
        "SELECT d.id, d.job, d.kind, d.at_ms, d.last_ms, d.repeats, d.plugin, d.digest, d.config, d.round, d.input,
                d.answer, d.reason, b.assignments, d.micros, d.runs
         FROM decisions d LEFT JOIN batches b
             ON d.kind = 'splitter' AND b.job = d.job AND b.batch = json_extract(d.input, '$.batch')
         WHERE d.job = ?1 AND (?2 IS NULL OR d.kind = ?2) AND d.last_ms >= ?3
         ORDER BY d.id DESC",
    )?;
    let since = query.since_ms.unwrap_or(0);
    let mut rows = statement.query(params![job, query.kind.map(DecisionKind::as_str), since as i64])?;
    let json = |text: String| serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let limit = query.limit.unwrap_or(usize::MAX);
    // Newest first, up to the limit.
    let mut records = Vec::new();
    while records.len() < limit
        && let Some(r) = rows.next()?
    {
        let kind: String = r.get(2)?;
        let record = Record {
            id: r.get(0)?,
            job: r.get(1)?,
            kind: DecisionKind::parse(&kind).unwrap_or(DecisionKind::Trigger),
            at_ms: r.get::<_, i64>(3)?.max(0) as u64,
            last_ms: r.get::<_, i64>(4)?.max(0) as u64,
            repeats: r.get(5)?,
            policy: DecidedBy { plugin: r.get(6)?, digest: r.get(7)?, config: r.get(8)? },
            round: r.get(9)?,
            input: serde_json::Value::Null,
            answer: serde_json::Value::Null,
            reason: r.get(12)?,
            assignments: r.get(13)?,
            micros: r.get::<_, i64>(14)?.max(0) as u64,
        };
        let (input, answer): (String, String) = (r.get(10)?, r.get(11)?);
        if r.get::<_, i64>(15)? <= 1 {
            records.push(Record { input: json(input), answer: json(answer), ..record });
            continue;
        }
        // A packed row of waits: its runs, numbered up to the row's own id.
        let runs: Vec<PackedRun<String, perennial_policy::Metrics>> = serde_json::from_str(&input).unwrap_or_default();
        let first_id = record.id - runs.len() as i64 + 1;
        for (at, run) in runs.into_iter().enumerate().rev() {
            if run.1 < since || records.len() >= limit {
                continue;
            }
            records.push(run.record(first_id + at as i64, &record));
        }
    }
    records.reverse();
    Ok(records)
}

/// The jobs that have records.
pub fn jobs(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<String>> {
    let mut statement = conn.prepare("SELECT DISTINCT job FROM decisions ORDER BY job")?;
    let rows = statement.query_map([], |r| r.get(0))?;
    rows.collect()
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::Store;

    const JOB: &str = "default/a";

    fn store(retention: Option<RecordRetention>) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        let spec = perennial_types::JobSpec { decision_records: retention, ..Default::default() };
        crate::register_job(&mut store, JOB, "uid", &spec).unwrap();
        (dir, store)
    }

    fn selection(at_ms: u64, round: i64) -> Record {
        Record {
            id: 0,
            job: JOB.into(),
            kind: DecisionKind::Selector,
            at_ms,
            last_ms: at_ms,
            repeats: 1,
            policy: DecidedBy::default(),
            round,
            input: serde_json::json!({"deployed": null, "candidates": []}),
            answer: serde_json::json!({"deploy": null}),
            reason: "nothing to deploy".into(),
            assignments: None,
            micros: 3,
        }
    }

    fn commit(store: &mut Store, record: Record) {
        store.write_recording(&[record]).unwrap().commit().unwrap();
    }

    fn all(store: &Store) -> Vec<Record> {
        read(store.conn(), JOB, &Query::default()).unwrap()
    }

    fn waiting(pending: u64, now: u64) -> (TriggerStats, Decision) {
        let stats = TriggerStats { pending_train: pending, wall_clock_secs: now, ..TriggerStats::default() };
        let decision = Decision { train: false, reason: format!("{pending} < 10"), recheck_after_secs: None };
        (stats, decision)
    }

    #[test]
    fn a_job_keeps_its_newest_max_count_records() {
        let (_dir, mut store) = store(Some(RecordRetention { max_count: 4, ..RecordRetention::default() }));
        for round in 1..=10 {
            commit(&mut store, selection(decisions_now(), round));
        }
        let rounds: Vec<i64> = all(&store).iter().map(|r| r.round).collect();
        assert_eq!(rounds, [7, 8, 9, 10]);
    }

    #[test]
    fn records_older_than_max_age_go() {
        let (_dir, mut store) = store(Some(RecordRetention { max_age_seconds: 60, max_count: 1000 }));
        let now = decisions_now();
        for (age_secs, round) in [(300, 1), (120, 2), (30, 3)] {
            commit(&mut store, selection(now - age_secs * 1000, round));
        }
        // Pruned as the next record is written (the first write of a job prunes it too).
        commit(&mut store, selection(now, 4));
        store.recorder = Recorder::default();
        commit(&mut store, selection(now, 5));
        let rounds: Vec<i64> = all(&store).iter().map(|r| r.round).collect();
        assert_eq!(rounds, [3, 4, 5]);
    }

    #[test]
    fn max_count_zero_records_nothing() {
        let (_dir, mut store) = store(Some(RecordRetention { max_count: 0, ..RecordRetention::default() }));
        commit(&mut store, selection(decisions_now(), 1));
        assert!(all(&store).is_empty());
    }

    #[test]
    fn identical_waits_are_one_record_with_a_count_written_with_the_next_transaction() {
        let (_dir, mut store) = store(None);
        let by = DecidedBy { plugin: "builtin:threshold-trigger".into(), digest: "d".into(), config: "c".into() };
        for now in 100..103 {
            let (stats, decision) = waiting(5, now);
            store.recorder.wait(JOB, 0, &stats, &decision, &by, now * 1000, 2);
        }
        assert!(all(&store).is_empty(), "a wait acts on nothing: it waits for the next write");
        store.write().unwrap().commit().unwrap();
        let written = all(&store);
        assert_eq!(written.len(), 1);
        assert_eq!((written[0].repeats, written[0].at_ms, written[0].last_ms), (3, 100_000, 102_000));
        // The run goes on in the same row; another input starts another.
        let (stats, decision) = waiting(5, 110);
        store.recorder.wait(JOB, 0, &stats, &decision, &by, 110_000, 2);
        let (stats, decision) = waiting(7, 111);
        store.recorder.wait(JOB, 0, &stats, &decision, &by, 111_000, 2);
        store.flush_records().unwrap();
        let written = all(&store);
        assert_eq!(written.len(), 2, "{written:?}");
        assert_eq!((written[0].repeats, written[0].last_ms), (4, 110_000));
        assert_eq!(written[1].input["pendingTrain"], 7);
        assert_eq!(written[1].short_answer(), "wait");
    }

    fn pending_of(records: &[Record]) -> Vec<u64> {
        records.iter().map(|r| r.input["pendingTrain"].as_u64().unwrap_or(u64::MAX)).collect()
    }

    fn rows(store: &Store) -> i64 {
        store.conn().query_row("SELECT count(*) FROM decisions", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn differing_waits_written_together_share_a_row_and_keep_their_own_numbers() {
        let (_dir, mut store) = store(None);
        let by = DecidedBy { plugin: "builtin:threshold-trigger".into(), digest: "d".into(), config: "c".into() };
        let now = decisions_now() / 1000;
        for pending in 1..=5 {
            let (stats, decision) = waiting(pending, now + pending);
            store.recorder.wait(JOB, 0, &stats, &decision, &by, (now + pending) * 1000, 2);
        }
        store.flush_records().unwrap();
        assert_eq!(rows(&store), 2, "the ended runs in one row, the run going on in its own");
        let written = all(&store);
        assert_eq!(pending_of(&written), [1, 2, 3, 4, 5]);
        assert!(written.windows(2).all(|w| w[0].id < w[1].id), "numbered in order: {written:?}");
        assert!(written.iter().all(|r| r.short_answer() == "wait" && r.repeats == 1 && r.policy == by));
        assert_eq!(written[2].reason, "3 < 10");
        assert_eq!(written[2].at_ms, (now + 3) * 1000);
        // A decision that acts comes after them, in order.
        commit(&mut store, selection(decisions_now(), 1));
        let written = all(&store);
        assert_eq!(written.len(), 6);
        assert!(written.windows(2).all(|w| w[0].id < w[1].id), "numbered in order: {written:?}");
        // The newest N, and those since a time, reach into the packed row.
        let newest = read(store.conn(), JOB, &Query { limit: Some(3), ..Query::default() }).unwrap();
        assert_eq!(pending_of(&newest[..2]), [4, 5]);
        let since = Query { kind: Some(DecisionKind::Trigger), since_ms: Some((now + 3) * 1000), limit: None };
        assert_eq!(pending_of(&read(store.conn(), JOB, &since).unwrap()), [3, 4, 5]);
    }

    #[test]
    fn packed_waits_count_against_max_count() {
        let (_dir, mut store) = store(Some(RecordRetention { max_count: 4, ..RecordRetention::default() }));
        let by = DecidedBy::default();
        let now = decisions_now() / 1000;
        for pending in 1..=10 {
            let (stats, decision) = waiting(pending, now + pending);
            store.recorder.wait(JOB, 0, &stats, &decision, &by, (now + pending) * 1000, 1);
        }
        store.flush_records().unwrap();
        assert_eq!(pending_of(&all(&store)), [7, 8, 9, 10]);
        for pending in 11..=13 {
            let (stats, decision) = waiting(pending, now + pending);
            store.recorder.wait(JOB, 0, &stats, &decision, &by, (now + pending) * 1000, 1);
        }
        store.flush_records().unwrap();
        let kept = pending_of(&all(&store));
        assert!(kept.len() <= 4 && kept.ends_with(&[11, 12, 13]), "{kept:?}");
    }

    #[test]
    fn a_refused_transaction_takes_its_record_with_it() {
        let (_dir, mut store) = store(None);
        let tx = store.write_recording(&[selection(decisions_now(), 1)]).unwrap();
        drop(tx); // rolled back: the decision did not act
        assert!(all(&store).is_empty());
    }

    #[test]
    fn a_forgotten_job_has_no_records() {
        let (_dir, mut store) = store(None);
        commit(&mut store, selection(decisions_now(), 1));
        crate::forget_job(&mut store, JOB).unwrap();
        assert!(all(&store).is_empty());
    }

    fn decisions_now() -> u64 {
        now_ms()
    }
}
