//! The worker report API, as Sedna's workers call it: `POST /sedna/workers/{name}/info` on the
//! edge agent (port 9100, `BIND_PORT`), with Sedna's body and reply, so that Sedna's Python
//! worker library works unchanged.
//!
//! Unlike Sedna: a report from a worker name this agent did not issue for that job is refused
//! (403, with the reason); a report for an unknown job is 404; a malformed body is 400 naming
//! the field; a model URL outside the job's output directory and dataset folder is refused (no
//! path traversal); the report is committed before 200 is sent; a repeated report is harmless;
//! a round's stage takes its first report, and a later, different one is 409.

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::post;
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::jobs::job_spec_in;
use super::report::{self, Model, Output, Report};
use super::rounds::{eval_ahead, record_result};
use crate::sqlite::Store;

pub use perennial_types::new_worker_name;
use perennial_types::{Phase, Stage};

/// Issues a worker name for a job's stage and round: Sedna's shape (`train-worker-…`) with an
/// unguessable token, remembered so that only this worker may report for that round. Takes a
/// connection or the caller's transaction (many workers, one commit).
pub fn issue_worker_name(
    conn: &rusqlite::Connection,
    job: &str,
    round: i64,
    stage: &str,
) -> Result<String, rusqlite::Error> {
    let name = new_worker_name(stage).map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
    conn.execute(
        "INSERT INTO workers (name, job, round, stage) VALUES (?1, ?2, ?3, ?4)",
        params![name, job, round, stage],
    )?;
    Ok(name)
}

/// Sedna's report body (`lib/sedna/core/base.py`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerReport {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub owner_name: Option<String>,
    pub owner_kind: Option<String>,
    pub kind: Option<String>,
    pub status: Option<String>,
    #[serde(default)]
    pub results: Vec<serde_json::Value>,
    #[serde(default)]
    pub owner_info: Option<serde_json::Value>,
}

/// Sedna's reply: `{"Status": 200, "Message": "OK"}` (capitalised keys).
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Reply {
    #[serde(rename = "Status")]
    pub status: u16,
    #[serde(rename = "Message")]
    pub message: String,
}

type Answer = (StatusCode, Json<Reply>);

fn answer(status: StatusCode, message: impl Into<String>) -> Answer {
    (status, Json(Reply { status: status.as_u16(), message: message.into() }))
}

/// A checked report, ready to commit.
#[derive(Debug, Serialize, Deserialize)]
struct Accepted {
    job: String,
    stage: String,
    status: String,
    models: Vec<Model>,
}

/// Called after a report was committed to the outbox (the link sends it, the embedded mode wakes
/// its control plane), with the report's job when the report moved it on: a train result makes
/// its eval step due now, for the job's loop.
pub type OnReport = Arc<dyn Fn(Option<&str>) + Send + Sync>;

#[derive(Clone)]
struct ApiState {
    store: Arc<Mutex<Store>>,
    on_report: OnReport,
    /// How long a report from a worker not named yet is held (`None`: refused at once).
    hold: Option<Duration>,
}

/// How long a linked agent holds a report from a worker the control plane has not named to it
/// yet: the link is back within this after an operator's restart or failover.
pub const HOLD_UNKNOWN_WORKERS: Duration = Duration::from_secs(600);

/// The router, over the edge's store. `hold`: how long a report from a worker this agent has
/// not heard of is held for the control plane to name it (a linked agent); `None` refuses it
/// (the embedded mode, where every worker is named before it starts).
pub fn router(store: Arc<Mutex<Store>>, on_report: OnReport, hold: Option<Duration>) -> axum::Router {
    axum::Router::new()
        .route("/sedna/workers/{name}/info", post(receive))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REPORT_BYTES))
        .with_state(ApiState { store, on_report, hold })
}

async fn receive(
    State(ApiState { store, on_report, hold }): State<ApiState>,
    UrlPath(name): UrlPath<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Answer {
    // A body over the limit (MAX_REPORT_BYTES) or cut short: said in Sedna's reply, as every other refusal.
    let body = match body {
        Ok(body) => body,
        Err(rejected) => {
            let limit = format!(" (a report is at most {} KiB)", MAX_REPORT_BYTES >> 10);
            let over = rejected.status() == StatusCode::PAYLOAD_TOO_LARGE;
            return answer(
                rejected.status(),
                format!("body: {}{}", rejected.body_text(), if over { limit.as_str() } else { "" }),
            );
        }
    };
    let accepted = match read_report(&name, &body) {
        Ok(accepted) => accepted,
        Err(message) => return answer(StatusCode::BAD_REQUEST, message),
    };
    let job = accepted.job.clone();
    // SQLite work off the async threads.
    let outcome = tokio::task::spawn_blocking(move || {
        let mut store = crate::sqlite::lock(&store);
        commit(&mut store, &name, accepted, hold)
    })
    .await;
    match outcome {
        Ok(Ok(Taken::Taken { moved })) => {
            on_report(moved.then_some(job.as_str()));
            answer(StatusCode::OK, "OK")
        }
        Ok(Ok(Taken::Held)) => answer(
            StatusCode::OK,
            "held: this agent has not been told of this worker yet; the report is taken when it is",
        ),
        Ok(Err((status, message))) => answer(status, message),
        Err(join) => answer(StatusCode::INTERNAL_SERVER_ERROR, format!("the report was not stored: {join}")),
    }
}

/// A report's body read and checked as far as the request alone allows.
fn read_report(path_name: &str, body: &[u8]) -> Result<Accepted, String> {
    let report: WorkerReport = serde_json::from_slice(body).map_err(|err| format!("body: {err}"))?;
    check_shape(path_name, report)
}

/// The checks that need nothing but the request; the error names the field.
fn check_shape(path_name: &str, report: WorkerReport) -> Result<Accepted, String> {
    let name = report.name.ok_or("name: missing")?;
    if name != path_name {
        return Err(format!("name: {name:?} does not match the worker name {path_name:?} in the path"));
    }
    let namespace = report.namespace.ok_or("namespace: missing")?;
    let owner = report.owner_name.ok_or("ownerName: missing")?;
    let owner_kind = report.owner_kind.ok_or("ownerKind: missing")?;
    if !owner_kind.eq_ignore_ascii_case("lifelonglearningjob") {
        return Err(format!("ownerKind: {owner_kind:?} is not lifelonglearningjob"));
    }
    let stage = report.kind.ok_or("kind: missing")?.to_ascii_lowercase();
    if !["train", "eval", "deploy"].contains(&stage.as_str()) {
        return Err(format!("kind: {stage:?} is not train, eval or deploy"));
    }
    let status = report.status.ok_or("status: missing")?.to_ascii_lowercase();
    if !["completed", "failed", "running"].contains(&status.as_str()) {
        return Err(format!("status: {status:?} is not completed, failed or running"));
    }
    if report.results.len() > MAX_MODELS {
        return Err(format!("results: {} models, at most {MAX_MODELS} a report", report.results.len()));
    }
    let mut models = Vec::new();
    for (i, result) in report.results.into_iter().enumerate() {
        let model: Model = serde_json::from_value(result).map_err(|err| format!("results[{i}]: {err}"))?;
        if model.url.is_empty() {
            return Err(format!("results[{i}].url: empty"));
        }
        if model.url.contains('\0') {
            return Err(format!("results[{i}].url: contains a NUL character"));
        }
        if let Some(metrics) = model.metrics.as_ref().filter(|m| !m.is_null() && !m.is_object()) {
            return Err(format!("results[{i}].metrics: {metrics} is not an object of named metrics"));
        }
        if let Some(serde_json::Value::Object(metrics)) = &model.metrics {
            check_metrics(metrics).map_err(|why| format!("results[{i}].metrics: {why}"))?;
        }
        models.push(model);
    }
    if status == "completed" && stage != "deploy" && models.is_empty() {
        return Err(format!("results: a completed {stage} report needs at least one model"));
    }
    Ok(Accepted { job: format!("{namespace}/{owner}"), stage, status, models })
}

/// The most metrics one model may carry, and their size as JSON: they go into the job's status
/// and every view of it, so they are bounded where they are received.
pub const MAX_METRICS: usize = 64;
pub const MAX_METRICS_BYTES: usize = 8 << 10;

fn check_metrics(metrics: &serde_json::Map<String, serde_json::Value>) -> Result<(), String> {
    if metrics.len() > MAX_METRICS {
        return Err(format!("{} metrics, at most {MAX_METRICS}", metrics.len()));
    }
    // Names are printed in status tables and round lines: no control or bidi-override
    // characters that would forge or hide a line.
    let unprintable = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if let Some(name) = metrics.keys().find(|name| name.chars().any(unprintable)) {
        return Err(format!("the metric name {name:?} has a control character"));
    }
    let size = serde_json::to_string(metrics).map_or(usize::MAX, |json| json.len());
    if size > MAX_METRICS_BYTES {
        return Err(format!("{size} bytes as JSON, at most {MAX_METRICS_BYTES}"));
    }
    Ok(())
}

/// The most models one report may carry (Sedna's workers report one or two).
pub const MAX_MODELS: usize = 16;

/// The largest report body taken (Sedna's are a few hundred bytes).
pub const MAX_REPORT_BYTES: usize = 256 << 10;

/// What became of a report that was not refused.
#[derive(Debug, PartialEq)]
enum Taken {
    /// Queued for the control plane; `moved`: the job moved on with it (its eval step is due).
    Taken { moved: bool },
    /// From a worker the control plane has not named to this agent yet: held until it does.
    Held,
}

type Refusal = (StatusCode, String);

fn db(err: rusqlite::Error) -> Refusal {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("state database: {err}"))
}

/// Checks and commits a report in one transaction; one from a worker this agent has not heard
/// of is held (when `hold` says how long) or refused.
fn commit(store: &mut Store, worker: &str, report: Accepted, hold: Option<Duration>) -> Result<Taken, Refusal> {
    let tx = store.write().map_err(db)?;
    let Some(spec) = job_spec_in(&tx, &report.job).map_err(db)? else {
        return Err((StatusCode::NOT_FOUND, format!("job {} is not known to this agent", report.job)));
    };
    let dataset_dir = Path::new(&spec.dataset_url).parent().map(|p| p.display().to_string()).unwrap_or_default();
    let roots = [spec.output_dir.as_str(), dataset_dir.as_str()];
    for (i, model) in report.models.iter().enumerate() {
        if let Err(why) = check_model_url(&model.url, &roots) {
            return Err((StatusCode::FORBIDDEN, format!("results[{i}].url: {why}")));
        }
    }
    let known: bool =
        tx.query_row("SELECT count(*) > 0 FROM workers WHERE name = ?1", [worker], |r| r.get(0)).map_err(db)?;
    let taken = match hold {
        Some(grace) if !known => {
            hold_report(&tx, worker, &report, grace)?;
            Taken::Held
        }
        _ => {
            let moved = take(&tx, worker, report)?;
            Taken::Taken { moved }
        }
    };
    tx.commit().map_err(db)?;
    Ok(taken)
}

/// The most reports held at once for one job's unknown workers.
pub const MAX_HELD_PER_JOB: i64 = 32;

/// Holds a report from a worker not named yet (a linked agent learns a worker's name from the
/// control plane, which may start the worker before the link is back after a restart): durably,
/// for `grace`, at most [`MAX_HELD_PER_JOB`] a job. [`release_held`] takes it when the name
/// arrives; a name that never arrives (a forged one) is dropped with it.
fn hold_report(
    tx: &rusqlite::Transaction<'_>,
    worker: &str,
    report: &Accepted,
    grace: Duration,
) -> Result<(), Refusal> {
    let now = crate::decisions::now_ms() / 1000;
    tx.execute("DELETE FROM held_reports WHERE expires < ?1", [now as i64]).map_err(db)?;
    let held: i64 =
        tx.query_row("SELECT count(*) FROM held_reports WHERE job = ?1", [&report.job], |r| r.get(0)).map_err(db)?;
    if held >= MAX_HELD_PER_JOB {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "worker {worker} is not known to this agent, and {held} reports of job {}'s unknown workers are \
                 held already",
                report.job
            ),
        ));
    }
    let body =
        serde_json::to_string(report).map_err(|err| db(rusqlite::Error::ToSqlConversionFailure(Box::new(err))))?;
    tx.execute(
        "INSERT INTO held_reports (worker, job, body, expires) VALUES (?1, ?2, ?3, ?4)",
        params![worker, report.job, body, (now + grace.as_secs()) as i64],
    )
    .map_err(db)?;
    tracing::info!(job = report.job, worker, "a report from a worker not named yet is held for {grace:?}");
    Ok(())
}

/// Takes the reports held for `worker`, now that the control plane named it, in the caller's
/// transaction (the one that records the name). Returns why any of them was refused.
pub fn release_held(tx: &rusqlite::Transaction<'_>, worker: &str) -> Result<Vec<String>, rusqlite::Error> {
    let now = (crate::decisions::now_ms() / 1000) as i64;
    let bodies: Vec<String> = tx
        .prepare_cached("SELECT body FROM held_reports WHERE worker = ?1 AND expires >= ?2 ORDER BY seq")?
        .query_map(params![worker, now], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    tx.execute("DELETE FROM held_reports WHERE worker = ?1", [worker])?;
    let mut refused = Vec::new();
    for body in bodies {
        let Ok(report) = serde_json::from_str::<Accepted>(&body) else { continue };
        if let Err((status, why)) = take(tx, worker, report) {
            refused.push(format!("the held report of worker {worker}: {status}: {why}"));
        }
    }
    Ok(refused)
}

/// Takes a report from a worker this agent issued or was told of, in `tx`.
/// Returns whether the report moved its job on (a train result: its eval step is due).
fn take(tx: &rusqlite::Transaction<'_>, worker: &str, report: Accepted) -> Result<bool, Refusal> {
    let issued: Option<(String, i64, String)> = tx
        .query_row("SELECT job, round, stage FROM workers WHERE name = ?1", [worker], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()
        .map_err(db)?;
    let Some((job, round, stage)) = issued else {
        return Err((StatusCode::FORBIDDEN, format!("worker {worker} was not started by this agent")));
    };
    if job != report.job || stage != report.stage {
        return Err((
            StatusCode::FORBIDDEN,
            format!(
                "worker {worker} was started for the {stage} stage of job {job}, not {} of {}",
                report.stage, report.job
            ),
        ));
    }
    if report.status == "running" || stage == "deploy" {
        return Ok(false); // nothing to keep: Sedna's control plane ignores these too
    }
    let uid: String = tx.query_row("SELECT uid FROM jobs WHERE name = ?1", [&job], |r| r.get(0)).map_err(db)?;
    // A repeat of the worker's last report (same status, same results) is not relayed again.
    let body = serde_json::to_string(&report.models).unwrap_or_default();
    let fingerprint = format!("{}|{body}", report.status);
    let last: Option<String> = tx
        .query_row("SELECT last_report FROM workers WHERE name = ?1", [worker], |r| r.get(0))
        .optional()
        .map_err(db)?
        .flatten();
    if last.as_deref() == Some(fingerprint.as_str()) {
        return Ok(false); // the same report again: taken once
    }
    // A stage's result is its first report: the control plane's stage machine takes the first
    // Completed or Failed of a round's stage and ignores what follows, so a later, different
    // report is refused here too, and the selector decides on what the stage machine took.
    let taken: Option<(String, String)> = tx
        .query_row(
            "SELECT name, last_report FROM workers
             WHERE job = ?1 AND round = ?2 AND stage = ?3 AND last_report IS NOT NULL LIMIT 1",
            params![job, round, stage],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(db)?;
    if let Some((by, taken)) = taken {
        let was = taken.split_once('|').map_or(taken.as_str(), |(status, _)| status);
        return Err((
            StatusCode::CONFLICT,
            format!(
                "round {round}'s {stage} already reported {was} (worker {by}); a stage takes its first report, \
                 and this one is not taken"
            ),
        ));
    }
    let completed = report.status == "completed";
    if completed {
        record_result(tx, &job, round, &stage, &report.models).map_err(db)?;
    }
    let phase = if stage == "train" { Stage::Train } else { Stage::Eval };
    // A train result with a model moves the job on to its eval step here and now (the relayed
    // result says so), not when the control plane's notice comes back.
    let next_follows =
        completed && phase == Stage::Train && !report.models.is_empty() && eval_ahead(tx, &job, round).map_err(db)?;
    let relayed = Report {
        job: job.clone(),
        job_uid: uid,
        round,
        phase,
        status: if report.status == "completed" { Phase::Completed } else { Phase::Failed },
        input: None,
        output: Some(Output { models: report.models }),
        reason: (report.status == "failed").then(|| format!("worker {worker} reported failure")),
        next_follows,
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    report::enqueue(tx, &relayed, now).map_err(db)?;
    tx.execute("UPDATE workers SET last_report = ?2 WHERE name = ?1", params![worker, fingerprint]).map_err(db)?;
    Ok(next_follows)
}

/// Checks that a reported model URL lies under one of `roots` (the job's output directory, the
/// dataset's folder), with no `..` to climb out; returns the reason when it does not.
pub fn check_model_url(url: &str, roots: &[&str]) -> Result<(), String> {
    let normal = normalize(url).ok_or_else(|| format!("{url:?} climbs out with `..`"))?;
    let inside = roots.iter().filter(|root| !root.is_empty()).any(|root| match normalize(root) {
        Some(root) => normal.starts_with(&root),
        None => false,
    });
    if inside { Ok(()) } else { Err(format!("{url:?} is outside the job's output directory and dataset")) }
}

/// A URL or path as components, without `.`; `None` if it has a `..`.
fn normalize(url: &str) -> Option<PathBuf> {
    let (scheme, path) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let mut out = PathBuf::from(scheme);
    for component in Path::new(path).components() {
        match component {
            Component::ParentDir => return None,
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{check_model_url, read_report};
    use proptest::prelude::*;

    const REPORT: &str = r#"{"name":"w","namespace":"default","ownerName":"j","ownerKind":"LifelongLearningJob","kind":"train","status":"completed","results":[{"format":"pkl","url":"/output/train/1/m.pkl","metrics":{"accuracy":0.9}}]}"#;

    // A bounded fuzz of the report body: any bytes, and Sedna's report with bytes inserted,
    // deleted or replaced anywhere, are read or refused without a panic, in bounded time.
    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_body(body in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = read_report("w", &body);
        }

        #[test]
        fn an_edited_report(edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..8)) {
            let mut body = REPORT.as_bytes().to_vec();
            for (at, how, byte) in edits {
                let at = at.index(body.len());
                match how {
                    0 => body.insert(at, byte),
                    1 => { body.remove(at); }
                    _ => body[at] = byte,
                }
            }
            let started = std::time::Instant::now();
            let _ = read_report("w", &body);
            prop_assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
    }

    // Any sequence of reports from a round's eval workers (two of them, as after a restart):
    // the stage keeps its first Completed or Failed, relays it once, refuses a different later
    // one with 409, takes an identical repeat as a no-op, and keeps no `running` report.
    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn a_stage_keeps_its_first_report(reports in proptest::collection::vec((0usize..2, 0u8..3, 0u32..3), 1..10)) {
            use super::{Accepted, commit, issue_worker_name};
            use crate::report::{Model, pending};
            let dir = tempfile::tempdir().unwrap();
            let mut store = crate::sqlite::Store::open(&dir.path().join("edge.db")).unwrap();
            let spec = crate::JobSpec { output_dir: "/out".into(), dataset_url: "/data/index.csv".into(), ..Default::default() };
            crate::register_job(&mut store, "default/j", "u1", &spec).unwrap();
            let workers: Vec<String> =
                (0..2).map(|_| issue_worker_name(store.conn(), "default/j", 1, "eval").unwrap()).collect();
            let mut first: Option<(usize, String, u32)> = None;
            for (worker, kind, accuracy) in reports {
                let status = ["completed", "failed", "running"][kind as usize].to_owned();
                let models = if status == "completed" {
                    let metrics = serde_json::json!({"accuracy": accuracy});
                    vec![Model { format: "json".into(), url: "/out/eval/1/m.json".into(), metrics: Some(metrics) }]
                } else {
                    Vec::new()
                };
                let report = Accepted { job: "default/j".into(), stage: "eval".into(), status: status.clone(), models };
                let got = commit(&mut store, &workers[worker], report, None).map(drop).map_err(|(code, _)| code.as_u16());
                let expected = match &first {
                    _ if status == "running" => Ok(()),
                    None => {
                        first = Some((worker, status.clone(), accuracy));
                        Ok(())
                    }
                    Some((w, s, a)) if *w == worker && *s == status && (status == "failed" || *a == accuracy) => Ok(()),
                    Some(_) => Err(409),
                };
                prop_assert_eq!(got, expected);
            }
            let relayed = pending(&store, 100).unwrap();
            prop_assert_eq!(relayed.len(), usize::from(first.is_some()));
            let result = crate::rounds::stage_result(&store, "default/j", 1, "eval").unwrap();
            match &first {
                Some((_, status, accuracy)) if status == "completed" => {
                    let models = result.expect("the first completed report's result");
                    prop_assert_eq!(models[0].metrics.clone(), Some(serde_json::json!({"accuracy": accuracy})));
                }
                _ => prop_assert!(result.is_none()),
            }
        }
    }

    #[test]
    fn sednas_report_reads() {
        assert!(read_report("w", REPORT.as_bytes()).is_ok());
        // Deep nesting is refused at once, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(read_report("w", deep.as_bytes()).is_err());
    }

    #[test]
    fn model_urls_must_stay_inside_the_roots() {
        let roots = ["/output", "/data/thermal"];
        let cases: &[(&str, bool)] = &[
            ("/output/train/1/index.pkl", true),
            ("/output/./eval/2/index.pkl", true),
            ("/data/thermal/model.pkl", true),
            ("/output/../etc/shadow", false),
            ("/output/train/../../etc/passwd", false),
            ("/outputs/x.pkl", false),
            ("/etc/passwd", false),
            ("relative/x.pkl", false),
        ];
        for (url, ok) in cases {
            assert_eq!(check_model_url(url, &roots).is_ok(), *ok, "{url}");
        }
        let s3 = ["s3://bucket/out"];
        assert!(check_model_url("s3://bucket/out/train/1/index.pkl", &s3).is_ok());
        assert!(check_model_url("s3://bucket/out/../other/x", &s3).is_err());
        assert!(check_model_url("s3://bucket/outside/x", &s3).is_err());
        assert!(check_model_url("s3://other/out/x", &s3).is_err());
    }
}
