//! What the edge does in each Waiting stage of a job's round:
//!
//! - Train/Waiting: ask the trigger; when it fires, write the round's train samples to
//!   `<outputDir>/data/train/<round>/data.{txt,csv}` and report Train Ready.
//! - Eval/Waiting: with the train result at hand, write the rolling eval set (the job's most
//!   recent eval samples, `evalSetSize` of them, each once, in dataset order) to
//!   `data/eval/<round>/` and report Eval Ready with the trained models; without it, wait and
//!   say so.
//! - Deploy/Waiting: ask the selector; copy the chosen model to `deploy/index.pkl` and report
//!   Deploy Ready, or report Deploy Completed with the selector's reason, or Deploy Failed with
//!   the cause of a failed copy.
//!
//! Files are written before the transaction that records them: a crash in between rewrites the
//! same file on restart, and a reader never sees a half-written one. Each step happens once per
//! round (`acted`), so a repeated stage notice does not report twice.
//!
//! A step is a shell around pure decisions (`due`, `stats_of`, the reports): it locks the
//! store to read the job, lets go of it while the policy decides and the files are written or
//! the model copied, and locks it again to commit, only if the job's row is still as it read it
//! (the control plane may have moved the job meanwhile: then nothing is committed, and the next
//! turn looks again).

use std::sync::Mutex;

use opendal::blocking::Operator;
use rusqlite::{OptionalExtension, params};

use super::index_file::IndexFile;
use super::lines::{self, Cursor};
use super::report::{self, Input, Model, Report};
use crate::decisions::{DecidedBy, DecisionKind, Record, SelectAnswer, SelectInput, TriggerAnswer};
use crate::shadow::Question;
use crate::sqlite::{Store, lock};
use perennial_policy::{Metrics, ModelInfo, PolicyError, SelectorPolicy, TriggerPolicy, TriggerStats};
use perennial_types::{Phase, Stage, StageNotice};

/// Where the serving policy's question and answer go for the job's shadow of that kind, if it
/// has one (shadow.rs): after the serving decision, never waiting.
pub type Shadow<'a> = Option<&'a dyn Fn(Question)>;

/// The job's dataset index, to read sample lines back from.
pub struct Index<'a> {
    pub file: &'a mut dyn IndexFile,
    pub csv: bool,
    /// The dataset's `spec.url`.
    pub url: &'a str,
    pub max_line: usize,
}

/// The job's output directory.
pub struct OutputDir<'a> {
    /// `spec.outputDir` as the job gives it (a path or `s3://bucket/prefix`).
    pub url: &'a str,
    pub op: &'a Operator,
}

/// Wall clock and the node's offset from UTC.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub now: u64,
    pub utc_offset_secs: i32,
}

/// What a step did.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Nothing to report yet, and why; the trigger may ask to be asked again after a while.
    Waiting { reason: String, recheck_after_secs: Option<u64> },
    /// A report was committed to the outbox.
    Reported(Box<Report>),
    /// Nothing for the edge to do in this stage or round (another stage, or this step already
    /// done); no policy was asked.
    NotDue { reason: String },
}

impl Outcome {
    fn wait(reason: impl Into<String>) -> Outcome {
        Outcome::Waiting { reason: reason.into(), recheck_after_secs: None }
    }

    fn not_due(reason: impl Into<String>) -> Outcome {
        Outcome::NotDue { reason: reason.into() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    #[error("job {0} is not known to the edge store")]
    UnknownJob(String),
    #[error("the job's {kind} policy failed: {error}")]
    Policy { kind: &'static str, error: PolicyError },
    #[error("reading the dataset index {file}: {message}")]
    Index { file: String, message: String },
    #[error("writing {path}: {source}")]
    Write { path: String, source: opendal::Error },
    #[error(transparent)]
    Store(#[from] rusqlite::Error),
}

#[derive(Debug, PartialEq)]
struct JobRow {
    uid: String,
    round: i64,
    /// As the control plane last said (absent: an unreadable row, never due).
    stage: Option<Stage>,
    phase: Option<Phase>,
    acted: Option<String>,
    round_started_at: Option<i64>,
    samples: i64,
    header: Option<String>,
    deployed: Option<String>,
}

fn job_row(conn: &rusqlite::Connection, job: &str) -> Result<Option<JobRow>, rusqlite::Error> {
    conn.prepare_cached(
        "SELECT uid, round, stage, phase, acted, round_started_at, cursor_samples, header, deployed
             FROM jobs WHERE name = ?1",
    )?
    .query_row([job], |row| {
        Ok(JobRow {
            uid: row.get(0)?,
            round: row.get(1)?,
            stage: Stage::parse(&row.get::<_, String>(2)?),
            phase: Phase::parse(&row.get::<_, String>(3)?),
            acted: row.get(4)?,
            round_started_at: row.get(5)?,
            samples: row.get(6)?,
            header: row.get(7)?,
            deployed: row.get(8)?,
        })
    })
    .optional()
}

fn read_job(store: &Store, job: &str) -> Result<JobRow, RoundError> {
    job_row(store.conn(), job)?.ok_or_else(|| RoundError::UnknownJob(job.to_owned()))
}

/// The round to act on, if the job waits in `stage` and the edge has not yet done that stage's
/// step for the round (Train acts for the next round); otherwise why it waits.
fn due(row: &JobRow, stage: Stage) -> Result<i64, Outcome> {
    let round = if stage == Stage::Train { row.round + 1 } else { row.round };
    if (row.stage, row.phase) != (Some(stage), Some(Phase::Waiting)) {
        let said = |s: Option<String>| s.unwrap_or_else(|| "?".into());
        let (now, phase) = (said(row.stage.map(|s| s.to_string())), said(row.phase.map(|p| p.to_string())));
        return Err(Outcome::not_due(format!("the job is in {now}/{phase}, not {stage}/Waiting")));
    }
    if row.acted.as_deref() == Some(&format!("{round}/{stage}")) {
        return Err(Outcome::not_due(format!("the {stage} step of round {round} was already done")));
    }
    Ok(round)
}

/// Reads the job under the lock, with the round its `stage` step acts on, or why there is none.
fn read_due(store: &Store, job: &str, stage: Stage) -> Result<Result<(JobRow, i64), Outcome>, RoundError> {
    let row = read_job(store, job)?;
    Ok(due(&row, stage).map(|round| (row, round)))
}

/// Why a step that ran without the lock commits nothing.
const MOVED: &str = "the job changed while the step ran (the control plane moved it, or it was replaced): \
                     nothing was committed";

/// Under the lock, before a step commits: whether the job's row is still as the step read it.
fn unchanged(store: &Store, job: &str, read: &JobRow) -> Result<bool, rusqlite::Error> {
    Ok(job_row(store.conn(), job)?.as_ref() == Some(read))
}

/// Records the stage the control plane says the job is in.
pub fn set_stage(store: &mut Store, job: &str, stage: Stage, phase: Phase) -> Result<(), rusqlite::Error> {
    store.conn().execute(
        "UPDATE jobs SET stage = ?2, phase = ?3 WHERE name = ?1",
        params![job, stage.to_string(), phase.to_string()],
    )?;
    Ok(())
}

/// Applies the control plane's word that the job waits in `stage` for `round`'s step (Train:
/// `round` is the last round, done or failed; the edge starts `round + 1`). A notice older than
/// what the edge already did is ignored, so that a resent notice never makes the edge step back.
/// When `failed`, the failed round's train samples return to the pending ones, for the next
/// round. Returns whether the notice was applied.
pub fn apply_notice(store: &mut Store, job: &str, notice: &StageNotice) -> Result<bool, rusqlite::Error> {
    let tx = store.write()?;
    let applied = apply_notice_in(&tx, job, notice)?;
    tx.commit()?;
    Ok(applied)
}

/// [`apply_notice`] inside the caller's transaction.
pub fn apply_notice_in(
    tx: &rusqlite::Transaction<'_>,
    job: &str,
    notice: &StageNotice,
) -> Result<bool, rusqlite::Error> {
    let (stage, failed) = (notice.stage, notice.failed);
    let round = i64::try_from(notice.round).unwrap_or(i64::MAX);
    let edge_round: Option<i64> =
        tx.query_row("SELECT round FROM jobs WHERE name = ?1", [job], |r| r.get(0)).optional()?;
    let Some(edge_round) = edge_round else { return Ok(false) };
    // The edge may be ahead (it started the next round and its report is on the way), never behind.
    if round < edge_round {
        return Ok(false);
    }
    // Behind: the edge starts every round, so a control plane at a round the edge never started
    // means the edge lost the job's history (its store removed or replaced). Going on from that
    // round would read the index from its first byte and train again on samples already trained:
    // the job is held, and says why, until the store is put back or the job made anew.
    if round > edge_round {
        let why = lost_history(round);
        tx.execute("UPDATE jobs SET lost = ?2 WHERE name = ?1 AND lost IS NOT ?2", params![job, why])?;
        return Ok(false);
    }
    if failed && stage == Stage::Train {
        tx.execute("UPDATE batches SET train_round = NULL WHERE job = ?1 AND train_round = ?2", params![job, round])?;
    }
    tx.execute(
        "UPDATE jobs SET stage = ?2, phase = 'Waiting', round = MAX(round, ?3) WHERE name = ?1",
        params![job, stage.to_string(), round],
    )?;
    Ok(true)
}

/// Why a job whose history the edge lacks is held.
fn lost_history(round: i64) -> String {
    format!(
        "held: the control plane has this job at round {round}, which this edge never started: its state (edge.db) \
         was lost or replaced, and going on would train again on samples already trained. Put back edge.db from a \
         backup, or delete and create the job again to start it over"
    )
}

/// Why the edge holds the job (it lacks its history), if it does.
pub fn held(conn: &rusqlite::Connection, job: &str) -> Result<Option<String>, rusqlite::Error> {
    conn.prepare_cached("SELECT lost FROM jobs WHERE name = ?1")?
        .query_row([job], |r| r.get(0))
        .optional()
        .map(Option::flatten)
}

/// Records why the job waits on the edge (`None`: it does not); writes only a change.
pub fn set_waiting(store: &mut Store, job: &str, why: Option<&str>) -> Result<(), rusqlite::Error> {
    store.conn().execute("UPDATE jobs SET waiting = ?2 WHERE name = ?1 AND waiting IS NOT ?2", params![job, why])?;
    Ok(())
}

/// Records the job's repeating error as its status shows it (`None` when there is none); writes
/// only when it changes.
pub fn set_fault(store: &mut Store, job: &str, fault: Option<&str>) -> Result<(), rusqlite::Error> {
    store.conn().execute("UPDATE jobs SET fault = ?2 WHERE name = ?1 AND fault IS NOT ?2", params![job, fault])?;
    Ok(())
}

/// Each job's repeating error, for the jobs that have one.
pub fn faults(conn: &rusqlite::Connection) -> Result<Vec<(String, String)>, rusqlite::Error> {
    let mut statement = conn.prepare_cached("SELECT name, fault FROM jobs WHERE fault IS NOT NULL")?;
    let rows = statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// Why each job waits on the edge, for the jobs that do.
pub fn waiting_reasons(store: &Store) -> Result<Vec<(String, String)>, rusqlite::Error> {
    let mut statement = store.conn().prepare_cached("SELECT name, waiting FROM jobs WHERE waiting IS NOT NULL")?;
    let rows = statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// Records a worker's result for a round and stage (`train` or `eval`); a repeat replaces it.
pub fn record_result(
    tx: &rusqlite::Transaction<'_>,
    job: &str,
    round: i64,
    stage: &str,
    models: &[Model],
) -> Result<(), rusqlite::Error> {
    let body = serde_json::to_string(models).map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
    tx.execute(
        "INSERT INTO results (job, round, stage, body) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (job, round, stage) DO UPDATE SET body = excluded.body",
        params![job, round, stage, body],
    )?;
    Ok(())
}

/// After a worker's train result is relayed, in the same transaction: the job moves to
/// Eval/Waiting on the edge by itself, as the control plane's stage machine will, so that the
/// eval set is written and Eval Ready sent right behind the result (on a cluster, one status
/// write for both instead of two). Only from this edge's own Train step of that round. A result
/// the control plane does not take leaves the Eval Ready untaken too, and its next notice (Train,
/// the round failed) brings the job back; the eval files written meanwhile change nothing.
/// Returns whether the job moved.
pub fn eval_ahead(tx: &rusqlite::Transaction<'_>, job: &str, round: i64) -> Result<bool, rusqlite::Error> {
    let moved = tx.execute(
        "UPDATE jobs SET stage = 'Eval', phase = 'Waiting'
         WHERE name = ?1 AND round = ?2 AND acted = ?3 AND stage = 'Train' AND phase = 'Ready'",
        params![job, round, format!("{round}/{}", Stage::Train)],
    )?;
    Ok(moved == 1)
}

/// The result a round's stage took (its first completed report), if it has one.
pub fn stage_result(store: &Store, job: &str, round: i64, stage: &str) -> Result<Option<Vec<Model>>, rusqlite::Error> {
    let body: Option<String> = store
        .conn()
        .query_row(
            "SELECT body FROM results WHERE job = ?1 AND round = ?2 AND stage = ?3",
            params![job, round, stage],
            |r| r.get(0),
        )
        .optional()?;
    Ok(body.and_then(|body| serde_json::from_str(&body).ok()))
}

/// The trigger's view of the job.
pub fn trigger_stats(store: &Store, job: &str, clock: Clock) -> Result<TriggerStats, RoundError> {
    let row = read_job(store, job)?;
    Ok(stats_of(&row, pending_counts(store, job)?, clock))
}

/// The train and eval samples not yet in a round.
fn pending_counts(store: &Store, job: &str) -> Result<(u64, u64), rusqlite::Error> {
    let (train, eval): (i64, i64) = store
        .conn()
        .prepare_cached(
            "SELECT COALESCE(SUM(train_count), 0), COALESCE(SUM(eval_count), 0) FROM batches
             WHERE job = ?1 AND train_round IS NULL",
        )?
        .query_row([job], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((train as u64, eval as u64))
}

/// The trigger's view of the job, from its row and its pending train and eval samples.
fn stats_of(row: &JobRow, (pending_train, pending_eval): (u64, u64), clock: Clock) -> TriggerStats {
    let deployed: Option<Model> = row.deployed.as_deref().and_then(|d| serde_json::from_str(d).ok());
    TriggerStats {
        pending_train,
        pending_eval,
        total_samples: row.samples as u64,
        rounds_completed: u32::try_from(row.round).unwrap_or(u32::MAX),
        seconds_since_last_round: row.round_started_at.map(|t| clock.now.saturating_sub(t as u64)),
        wall_clock_secs: clock.now,
        utc_offset_secs: clock.utc_offset_secs,
        deployed_metrics: deployed.as_ref().map(metrics_of).unwrap_or_default(),
    }
}

/// Train/Waiting: ask the trigger, and start the next round when it says so.
pub fn train_waiting(
    store: &Mutex<Store>,
    job: &str,
    index: &mut Index<'_>,
    output: &OutputDir<'_>,
    trigger: &TriggerPolicy,
    clock: Clock,
    shadow: Shadow<'_>,
) -> Result<Outcome, RoundError> {
    let (row, round, stats) = {
        let store = lock(store);
        let (row, round) = match read_due(&store, job, Stage::Train)? {
            Ok(due) => due,
            Err(wait) => return Ok(wait),
        };
        let stats = stats_of(&row, pending_counts(&store, job)?, clock);
        (row, round, stats)
    };
    let decision = trigger.decide(&stats).map_err(|error| RoundError::Policy { kind: "trigger", error })?;
    let micros = trigger.last_call_micros();
    let by = DecidedBy::of(trigger);
    // The shadow is asked once the answer has acted (it never delays it).
    if !decision.train {
        lock(store).recorder.wait(job, row.round, &stats, &decision, &by, clock.now * 1000, micros);
        if let Some(shadow) = shadow {
            shadow(Question::Trigger { stats, train: false });
        }
        return Ok(Outcome::Waiting { reason: decision.reason, recheck_after_secs: decision.recheck_after_secs });
    }
    let answer = TriggerAnswer { train: true, recheck_after_secs: decision.recheck_after_secs };
    let record = Record {
        input: serde_json::to_value(&stats).unwrap_or_default(),
        answer: serde_json::to_value(answer).unwrap_or_default(),
        reason: decision.reason.clone(),
        micros,
        ..Record::of(DecisionKind::Trigger, job, clock.now * 1000, by, row.round)
    };
    let pending = {
        let store = lock(store);
        if !unchanged(&store, job, &row)? {
            return Ok(Outcome::not_due(MOVED));
        }
        pending_batches(&store, job)?
    };
    let extension = if index.csv { "csv" } else { "txt" };
    let data_path = format!("data/train/{round}/data.{extension}");
    let data_index =
        write_samples(index, output, &data_path, row.header.as_deref(), pending.iter().map(|(_, b)| b), 0)?;
    let report = train_report(job, &row, round, output.url, &data_path, data_index, decision.reason);
    let mut store = lock(store);
    // Unchanged, the job's pending batches are the ones read: only this loop adds any.
    if !unchanged(&store, job, &row)? {
        return Ok(Outcome::not_due(MOVED));
    }
    let counts_in_outbox = store.counts_in_outbox;
    let tx = store.write_recording(std::slice::from_ref(&record))?;
    super::health::decided(&tx, job, "trigger", "train", report.reason.as_deref().unwrap_or_default(), clock.now)?;
    for (batch, ..) in &pending {
        tx.execute("UPDATE batches SET train_round = ?3 WHERE job = ?1 AND batch = ?2", params![job, batch, round])?;
    }
    tx.execute(
        "UPDATE jobs SET round = ?2, round_started_at = ?3, acted = ?4, stage = 'Train', phase = 'Ready' WHERE name = ?1",
        params![job, round, clock.now as i64, format!("{round}/Train")],
    )?;
    if counts_in_outbox {
        super::status_report::queue_job_count(&tx, job, clock.now)?;
    }
    report::enqueue(&tx, &report, clock.now)?;
    tx.commit()?;
    drop(store);
    if let Some(shadow) = shadow {
        shadow(Question::Trigger { stats, train: true });
    }
    Ok(Outcome::Reported(Box::new(report)))
}

/// The job's batches not yet in a round, by number.
fn pending_batches(store: &Store, job: &str) -> Result<Vec<(i64, Stored)>, rusqlite::Error> {
    let mut statement = store.conn().prepare(
        "SELECT batch, start, end, assignments, checksum FROM batches
         WHERE job = ?1 AND train_round IS NULL ORDER BY batch",
    )?;
    statement.query_map([job], |r| Ok((r.get(0)?, stored(r, 1)?)))?.collect()
}

/// Train Ready for `round`, its samples at `data_path` in the output directory.
fn train_report(
    job: &str,
    row: &JobRow,
    round: i64,
    output: &str,
    data_path: &str,
    data_index: Option<String>,
    reason: String,
) -> Report {
    let input = Input {
        models: Vec::new(),
        data_url: Some(super::output::url_in(output, data_path)),
        data_index_url: data_index.map(|path| super::output::url_in(output, &path)),
        output_dir: Some(super::output::url_in(output, &format!("train/{round}"))),
    };
    Report {
        job: job.to_owned(),
        job_uid: row.uid.clone(),
        round,
        phase: Stage::Train,
        status: Phase::Ready,
        input: Some(input),
        output: None,
        reason: Some(reason),
        next_follows: false,
    }
}

/// Eval/Waiting: write the eval set (the job's last `eval_set_size` eval samples) and report
/// Eval Ready with the train result's models.
pub fn eval_waiting(
    store: &Mutex<Store>,
    job: &str,
    index: &mut Index<'_>,
    output: &OutputDir<'_>,
    eval_set_size: u64,
    clock: Clock,
) -> Result<Outcome, RoundError> {
    let (row, round, models, recent) = {
        let store = lock(store);
        let (row, round) = match read_due(&store, job, Stage::Eval)? {
            Ok(due) => due,
            Err(wait) => return Ok(wait),
        };
        let Some(models) = stage_result(&store, job, round, "train")?.filter(|models| !models.is_empty()) else {
            return Ok(Outcome::wait(format!("waiting for the train result of round {round}")));
        };
        let recent = recent_eval(&store, job, eval_set_size)?;
        (row, round, models, recent)
    };
    let extension = if index.csv { "csv" } else { "txt" };
    let data_path = format!("data/eval/{round}/data.{extension}");
    let data_index = write_samples(index, output, &data_path, row.header.as_deref(), recent.iter(), EVAL)?;
    let report = Report {
        job: job.to_owned(),
        job_uid: row.uid.clone(),
        round,
        phase: Stage::Eval,
        status: Phase::Ready,
        input: Some(Input {
            models,
            data_url: Some(super::output::url_in(output.url, &data_path)),
            data_index_url: data_index.map(|path| super::output::url_in(output.url, &path)),
            output_dir: Some(super::output::url_in(output.url, &format!("eval/{round}"))),
        }),
        output: None,
        reason: None,
        next_follows: false,
    };
    commit_report(store, &row, report, None, None, clock)
}

/// Deploy/Waiting: let the selector choose among the evaluated models, and deploy its choice.
pub fn deploy_waiting(
    store: &Mutex<Store>,
    job: &str,
    output: &OutputDir<'_>,
    copy_model: &dyn Fn(&str, &str) -> Result<u64, String>,
    selector: &SelectorPolicy,
    clock: Clock,
    shadow: Shadow<'_>,
) -> Result<Outcome, RoundError> {
    let (row, round, candidates) = {
        let store = lock(store);
        let (row, round) = match read_due(&store, job, Stage::Deploy)? {
            Ok(due) => due,
            Err(wait) => return Ok(wait),
        };
        let candidates = stage_result(&store, job, round, "eval")?.unwrap_or_default();
        (row, round, candidates)
    };
    let deployed: Option<Model> = row.deployed.as_deref().and_then(|d| serde_json::from_str(d).ok());
    let as_info = |m: &Model| ModelInfo { url: m.url.clone(), format: m.format.clone(), metrics: metrics_of(m) };
    let input =
        SelectInput { deployed: deployed.as_ref().map(as_info), candidates: candidates.iter().map(as_info).collect() };
    let choice = selector
        .select(input.deployed.as_ref(), &input.candidates)
        .map_err(|error| RoundError::Policy { kind: "selector", error })?;
    let record = Record {
        input: serde_json::to_value(&input).unwrap_or_default(),
        answer: serde_json::to_value(SelectAnswer { deploy: choice.deploy }).unwrap_or_default(),
        reason: choice.reason.clone(),
        micros: selector.last_call_micros(),
        ..Record::of(DecisionKind::Selector, job, clock.now * 1000, DecidedBy::of(selector), round)
    };
    if let Some(shadow) = shadow {
        shadow(Question::Select { input, deploy: choice.deploy });
    }
    let mut report = Report {
        job: job.to_owned(),
        job_uid: row.uid.clone(),
        round,
        phase: Stage::Deploy,
        status: Phase::Completed,
        input: None,
        output: None,
        reason: Some(choice.reason),
        next_follows: false,
    };
    let decided = Some(&record);
    let Some(chosen) = choice.deploy.and_then(|i| candidates.get(i as usize)) else {
        return commit_report(store, &row, report, None, decided, clock);
    };
    let deploy_path = "deploy/index.pkl";
    // Streamed, the store unlocked: a model may be gigabytes.
    match copy_model(&chosen.url, deploy_path) {
        Ok(_) => {
            let deployed = Model {
                format: chosen.format.clone(),
                url: super::output::url_in(output.url, deploy_path),
                metrics: chosen.metrics.clone(),
            };
            report.status = Phase::Ready;
            report.input = Some(Input { models: vec![deployed.clone()], ..Input::default() });
            commit_report(store, &row, report, Some(&deployed), decided, clock)
        }
        Err(cause) => {
            report.status = Phase::Failed;
            report.reason = Some(format!("copying {} to {deploy_path} failed: {cause}", chosen.url));
            commit_report(store, &row, report, None, decided, clock)
        }
    }
}

/// Commits a step's report (its job, round and stage are the step acted on), with the model
/// deployed and the selector's decision record when there are, if the job's row is still `read`.
fn commit_report(
    store: &Mutex<Store>,
    read: &JobRow,
    report: Report,
    deployed: Option<&Model>,
    decided: Option<&Record>,
    clock: Clock,
) -> Result<Outcome, RoundError> {
    let (job, stage) = (report.job.as_str(), report.phase);
    let acted = format!("{}/{stage}", report.round);
    let mut store = lock(store);
    if !unchanged(&store, job, read)? {
        return Ok(Outcome::not_due(MOVED));
    }
    let tx = store.write_recording(decided.map(std::slice::from_ref).unwrap_or_default())?;
    if let Some(record) = decided {
        let answer = record.short_answer();
        super::health::decided(&tx, job, record.kind.as_str(), &answer, &record.reason, clock.now)?;
    }
    tx.execute(
        "UPDATE jobs SET acted = ?2, stage = ?3, phase = ?4 WHERE name = ?1",
        params![job, acted, stage.to_string(), report.status.to_string()],
    )?;
    if let Some(model) = deployed {
        let body =
            serde_json::to_string(model).map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
        tx.execute("UPDATE jobs SET deployed = ?2 WHERE name = ?1", params![job, body])?;
    }
    report::enqueue(&tx, &report, clock.now)?;
    tx.commit()?;
    Ok(Outcome::Reported(Box::new(report)))
}

/// A model's numeric metrics by name: top-level numbers, and numbers one level down as
/// `outer.inner`.
pub fn metrics_of(model: &Model) -> Metrics {
    let mut metrics = Metrics::new();
    if let Some(serde_json::Value::Object(map)) = &model.metrics {
        for (name, value) in map {
            match value {
                serde_json::Value::Number(n) => {
                    metrics.insert(name.clone(), n.as_f64().unwrap_or(f64::NAN));
                }
                serde_json::Value::Object(inner) => {
                    for (sub, value) in inner {
                        if let Some(v) = value.as_f64() {
                            metrics.insert(format!("{name}.{sub}"), v);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    metrics
}

/// The batches that hold the job's last `size` eval samples, oldest first; in the oldest, the
/// eval samples before the window are marked skip, so that exactly `size` remain (or all there
/// are, when fewer).
fn recent_eval(store: &Store, job: &str, size: u64) -> Result<Vec<Stored>, rusqlite::Error> {
    let mut statement = store
        .conn()
        .prepare("SELECT start, end, assignments, checksum FROM batches WHERE job = ?1 ORDER BY batch DESC")?;
    let mut rows = statement.query([job])?;
    let mut recent = Vec::new();
    let mut held = 0u64;
    while held < size {
        let Some(row) = rows.next()? else { break };
        let mut batch = stored(row, 0)?;
        let eval = batch.assignments.iter().filter(|a| **a == EVAL).count() as u64;
        if eval == 0 {
            continue;
        }
        if held + eval > size {
            let mut excess = held + eval - size;
            for assignment in batch.assignments.iter_mut() {
                if excess == 0 {
                    break;
                }
                if *assignment == EVAL {
                    *assignment = SKIP;
                    excess -= 1;
                }
            }
        }
        held += eval.min(size - held);
        recent.push(batch);
    }
    recent.reverse();
    Ok(recent)
}

/// Assignment bytes, as stored.
const EVAL: u8 = 1;
const SKIP: u8 = 2;

/// A committed batch as round files need it: its byte range, assignments and checksum.
struct Stored {
    start: u64,
    end: u64,
    assignments: Vec<u8>,
    checksum: Option<Vec<u8>>,
}

/// Reads a `Stored` from the columns start, end, assignments, checksum, from column `first` on.
fn stored(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Stored> {
    Ok(Stored {
        start: row.get::<_, i64>(first)? as u64,
        end: row.get::<_, i64>(first + 1)? as u64,
        assignments: row.get(first + 2)?,
        checksum: row.get(first + 3)?,
    })
}

/// Writes the samples with assignment `wanted` from the given batches (byte ranges of the index
/// and their assignments) to `path` in the output directory, header first for csv. For a txt
/// dataset on S3, also writes `dataIndex.txt` (the dataset's base URL, then each sample's file
/// names) and returns its path.
fn write_samples<'r>(
    index: &mut Index<'_>,
    output: &OutputDir<'_>,
    path: &str,
    header: Option<&str>,
    batches: impl Iterator<Item = &'r Stored>,
    wanted: u8,
) -> Result<Option<String>, RoundError> {
    let write_error = |source| RoundError::Write { path: super::output::url_in(output.url, path), source };
    let name = index.file.name();
    let remote_txt = !index.csv && index.url.starts_with("s3://");
    let mut writer = output.op.writer(path).map_err(write_error)?;
    let mut data_index = String::new();
    if remote_txt {
        let base = index.url.rsplit_once('/').map(|(dir, _)| dir).unwrap_or(index.url);
        data_index.push_str(base);
        data_index.push('\n');
    }
    if let (true, Some(header)) = (index.csv, header) {
        writer.write(format!("{header}\n")).map_err(write_error)?;
    }
    let (mut kept, mut left_out) = (0usize, None);
    for Stored { start, end, assignments, checksum } in batches {
        let (start, end) = (*start, *end);
        // The range ends at the last sample's text; its line end follows (at most "\r\n").
        let bytes = index
            .file
            .read_at(start, (end - start) as usize + 2)
            .map_err(|err| RoundError::Index { file: name.clone(), message: err.to_string() })?;
        let range = &bytes[..((end - start) as usize).min(bytes.len())];
        let changed = if checksum.as_ref().is_some_and(|sum| *sum != super::ingest::batch_checksum(range)) {
            Some(format!("bytes {start}..{end} changed since they were read (was the index overwritten in place?)"))
        } else {
            None
        };
        let scan = lines::scan(&bytes, Cursor { offset: start, ..Cursor::default() }, index.max_line, false);
        let changed = changed.or_else(|| {
            (scan.samples.len() != assignments.len())
                .then(|| format!("bytes {start}..{end} no longer hold the {} samples read there", assignments.len()))
        });
        match changed {
            // The eval set is the recent samples: one batch fewer still makes one, and waiting
            // would hold the job until that batch leaves the window.
            Some(why) if wanted == EVAL => {
                tracing::warn!("{name}: {why}: its samples are left out of {path}");
                left_out = Some(why);
                continue;
            }
            // A round's train samples are exactly the new ones: none is silently dropped.
            Some(why) => return Err(RoundError::Index { file: name.clone(), message: why }),
            None => {}
        }
        let mut chunk = String::new();
        for (line, assignment) in scan.samples.iter().zip(assignments) {
            if *assignment == wanted {
                chunk.push_str(line.text);
                chunk.push('\n');
                if remote_txt {
                    for token in line.text.split_whitespace().filter(|t| t.contains('.')) {
                        data_index.push_str(token);
                        data_index.push('\n');
                    }
                }
            }
        }
        kept += 1;
        writer.write(chunk).map_err(write_error)?;
    }
    if let (0, Some(why)) = (kept, left_out) {
        // Nothing left to evaluate on.
        return Err(RoundError::Index { file: name.clone(), message: why });
    }
    writer.close().map_err(write_error)?;
    if !remote_txt {
        return Ok(None);
    }
    let index_path = path.rsplit_once('/').map(|(dir, _)| format!("{dir}/dataIndex.txt")).unwrap_or_default();
    output
        .op
        .write(&index_path, data_index)
        .map_err(|source| RoundError::Write { path: index_path.clone(), source })?;
    Ok(Some(index_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control plane at a round this edge never started: the edge lost the job's history (its
    /// store removed or replaced). It is held with why, not fast-forwarded to re-train.
    #[test]
    fn a_notice_ahead_of_the_edge_holds_the_job_instead_of_skipping_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        crate::register_job(&mut store, "default/a", "u1", &crate::JobSpec::default()).unwrap();
        let notice = |round| StageNotice { stage: Stage::Train, round, failed: false };
        // Its own round (0, none yet): applied as ever.
        assert!(apply_notice(&mut store, "default/a", &notice(0)).unwrap());
        assert_eq!(held(store.conn(), "default/a").unwrap(), None);
        // Round 2 on the control plane, never started here.
        assert!(!apply_notice(&mut store, "default/a", &notice(2)).unwrap());
        let why = held(store.conn(), "default/a").unwrap().expect("held");
        assert!(why.contains("round 2") && why.contains("(edge.db) was lost or replaced"), "{why}");
        let round: i64 = store.conn().query_row("SELECT round FROM jobs", [], |r| r.get(0)).unwrap();
        assert_eq!(round, 0, "the edge skipped to the control plane's round");
        // The job made anew (another uid) starts over, not held.
        crate::register_job(&mut store, "default/a", "u2", &crate::JobSpec::default()).unwrap();
        assert_eq!(held(store.conn(), "default/a").unwrap(), None);
    }
}
