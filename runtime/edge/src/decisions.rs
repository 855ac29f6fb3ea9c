//! Decision records: every decision a job's policies make, with what the policy saw, so that an
//! author can read them (`perennial decisions`) and replay a candidate on them
//! (`perennial plugin replay`).
//!
//! A decision that acts (a round started, a batch split, a model chosen) is recorded in the
//! transaction that acts on it, so that a crash never leaves one without the other. A trigger's
//! decision to wait acts on nothing: it is kept in memory and written with the next write
//! transaction (at most [`WAIT_FLUSH`] later), and a run of identical waits (same inputs but the
//! clock, same answer) is one record with a count and its first and last time, so that an idle
//! job does not write a record every poll. A crash loses at most those unwritten waits, which
//! changed nothing.
//!
//! Each job keeps the newest `maxCount` records, none older than `maxAgeSeconds`
//! (`spec.decisionRecords`), pruned as records are written.

use std::collections::{BTreeMap, HashMap};
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
    /// How long the call took, in microseconds.
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

/// A trigger's run of identical waits for one job, in memory.
struct OpenWait {
    /// The stats without the clock, answer and reason, policy: what makes two waits the same.
    same: (TriggerStats, Option<u64>, String, DecidedBy, i64),
    record: Record,
    /// Unwritten changes since `since`.
    dirty: Option<Instant>,
}

/// What the store keeps of decision records between transactions.
#[derive(Default)]
pub struct Recorder {
    waits: BTreeMap<String, OpenWait>,
    /// Runs of waits that ended before they were written, and since when they wait.
    closed: Vec<(Record, Instant)>,
    /// Records written per job since it was last pruned, and how many may be before the next prune.
    written: HashMap<String, (u32, u32)>,
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
        let mut without_clock = stats.clone();
        without_clock.wall_clock_secs = 0;
        without_clock.seconds_since_last_round = None;
        let same = (without_clock, decision.recheck_after_secs, decision.reason.clone(), policy.clone(), round);
        if let Some(open) = self.waits.get_mut(job)
            && open.same == same
        {
            open.record.repeats = open.record.repeats.saturating_add(1);
            open.record.last_ms = at_ms;
            open.record.micros = open.record.micros.max(micros);
            open.dirty.get_or_insert_with(Instant::now);
            return;
        }
        let answer = TriggerAnswer { train: false, recheck_after_secs: decision.recheck_after_secs };
        let record = Record {
            input: serde_json::to_value(stats).unwrap_or_default(),
            answer: serde_json::to_value(answer).unwrap_or_default(),
            reason: decision.reason.clone(),
            micros,
            ..Record::of(DecisionKind::Trigger, job, at_ms, policy.clone(), round)
        };
        // The previous run keeps its row; if it was never written, it is written now with the
        // next transaction (it stays in `closed`).
        if let Some(previous) =
            self.waits.insert(job.to_owned(), OpenWait { same, record, dirty: Some(Instant::now()) })
            && let Some(since) = previous.dirty
        {
            self.closed.push((previous.record, since));
        }
    }

    /// Adds to a shadow's counts; written with the next transaction.
    pub fn shadow(&mut self, job: &str, kind: DecisionKind, tally: crate::shadow::Tally) {
        let entry = self.shadows.entry((job.to_owned(), kind)).or_insert_with(|| (Default::default(), Instant::now()));
        entry.0.add(tally);
    }

    /// Whether unwritten waits or shadow counts have waited [`WAIT_FLUSH`].
    pub fn flush_due(&self) -> bool {
        let closed = self.closed.iter().map(|(_, since)| *since);
        let shadows = self.shadows.values().map(|(_, since)| *since);
        closed
            .chain(shadows)
            .chain(self.waits.values().filter_map(|open| open.dirty))
            .any(|since| since.elapsed() >= WAIT_FLUSH)
    }

    /// Writes the unwritten waits and shadow counts in `tx`; a failure is logged (they changed
    /// nothing).
    pub fn flush(&mut self, tx: &Transaction<'_>) {
        for ((job, kind), (tally, _)) in std::mem::take(&mut self.shadows) {
            if let Err(err) = tally.write(tx, &job, kind) {
                tracing::warn!(job, "recording the {kind} shadow's counts: {err}");
            }
        }
        for (record, _) in std::mem::take(&mut self.closed) {
            if let Err(err) = write(tx, &mut self.written, &record) {
                tracing::warn!(job = record.job, "recording a trigger's waits: {err}");
            }
        }
        for open in self.waits.values_mut().filter(|open| open.dirty.is_some()) {
            match write(tx, &mut self.written, &open.record) {
                Ok(id) => {
                    open.record.id = id;
                    open.dirty = None;
                }
                Err(err) => tracing::warn!(job = open.record.job, "recording a trigger's waits: {err}"),
            }
        }
    }

    /// Records a decision that acts, in the transaction that acts on it.
    pub fn record(&mut self, tx: &Transaction<'_>, record: &Record) -> rusqlite::Result<()> {
        write(tx, &mut self.written, record).map(drop)
    }

    /// Forgets what it holds of `job` (deleted).
    pub fn forget(&mut self, job: &str) {
        self.waits.remove(job);
        self.closed.retain(|(record, _)| record.job != job);
        self.written.remove(job);
        self.shadows.retain(|(shadowed, _), _| shadowed != job);
    }
}

/// Inserts a record (or, for a wait run already written, brings its row up to date); prunes the
/// job's records now and then. Returns the row's id.
fn write(tx: &Transaction<'_>, written: &mut HashMap<String, (u32, u32)>, record: &Record) -> rusqlite::Result<i64> {
    if record.id > 0 {
        let updated = tx.execute(
            "UPDATE decisions SET last_ms = ?2, repeats = ?3, micros = ?4 WHERE id = ?1",
            params![record.id, record.last_ms as i64, record.repeats, record.micros as i64],
        )?;
        if updated == 1 {
            return Ok(record.id);
        }
        // Pruned, or its transaction rolled back: written anew.
    }
    let count = written.entry(record.job.clone()).or_insert((0, 0));
    if count.0 >= count.1 {
        let retention = prune(tx, &record.job, record.at_ms)?;
        *count = (0, (retention.max_count / 10).max(1));
        if retention.max_count == 0 {
            return Ok(0);
        }
    }
    count.0 += 1;
    let body = |value: &serde_json::Value| value.to_string();
    let mut insert = tx.prepare_cached(
        "INSERT INTO decisions (job, kind, at_ms, last_ms, repeats, plugin, digest, config, round, input, answer,
                                reason, micros)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    insert.execute(params![
        record.job,
        record.kind.as_str(),
        record.at_ms as i64,
        record.last_ms as i64,
        record.repeats,
        record.policy.plugin,
        record.policy.digest,
        record.policy.config,
        record.round,
        body(&record.input),
        body(&record.answer),
        record.reason,
        record.micros as i64,
    ])?;
    Ok(tx.last_insert_rowid())
}

/// The job's retention (its spec's, else the default).
fn retention(tx: &Transaction<'_>, job: &str) -> rusqlite::Result<RecordRetention> {
    let spec: Option<String> = tx
        .query_row("SELECT json_extract(spec, '$.decisionRecords') FROM jobs WHERE name = ?1", [job], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(spec.and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default())
}

/// Removes the job's records beyond its retention; returns the retention.
fn prune(tx: &Transaction<'_>, job: &str, now_ms: u64) -> rusqlite::Result<RecordRetention> {
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
    // Room for the record about to be written.
    let keep = retention.max_count.saturating_sub(1);
    tx.execute(
        "DELETE FROM decisions WHERE job = ?1 AND id <= COALESCE(
             (SELECT id FROM decisions WHERE job = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2), -1)",
        params![job, keep],
    )?;
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
                d.answer, d.reason, b.assignments, d.micros
         FROM decisions d LEFT JOIN batches b
             ON d.kind = 'splitter' AND b.job = d.job AND b.batch = json_extract(d.input, '$.batch')
         WHERE d.job = ?1 AND (?2 IS NULL OR d.kind = ?2) AND d.last_ms >= ?3
         ORDER BY d.id DESC LIMIT ?4",
    )?;
    let limit = query.limit.map_or(-1, |n| n as i64);
    let since = query.since_ms.unwrap_or(0) as i64;
    let rows = statement.query_map(params![job, query.kind.map(DecisionKind::as_str), since, limit], |r| {
        let kind: String = r.get(2)?;
        let json = |text: String| serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        Ok(Record {
            id: r.get(0)?,
            job: r.get(1)?,
            kind: DecisionKind::parse(&kind).unwrap_or(DecisionKind::Trigger),
            at_ms: r.get::<_, i64>(3)?.max(0) as u64,
            last_ms: r.get::<_, i64>(4)?.max(0) as u64,
            repeats: r.get(5)?,
            policy: DecidedBy { plugin: r.get(6)?, digest: r.get(7)?, config: r.get(8)? },
            round: r.get(9)?,
            input: json(r.get(10)?),
            answer: json(r.get(11)?),
            reason: r.get(12)?,
            assignments: r.get(13)?,
            micros: r.get::<_, i64>(14)?.max(0) as u64,
        })
    })?;
    let mut records = rows.collect::<rusqlite::Result<Vec<_>>>()?;
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
