//! Jobs known to the edge store.

use rusqlite::{OptionalExtension, params};

use crate::sqlite::Store;

pub use perennial_types::{DEFAULT_EVAL_SET_SIZE, JobSpec};

/// The stored spec of `job`.
pub fn job_spec(store: &Store, job: &str) -> Result<Option<JobSpec>, rusqlite::Error> {
    job_spec_in(store.conn(), job)
}

/// [`job_spec`] on a connection or the caller's transaction.
pub fn job_spec_in(conn: &rusqlite::Connection, job: &str) -> Result<Option<JobSpec>, rusqlite::Error> {
    let spec: Option<String> =
        conn.query_row("SELECT spec FROM jobs WHERE name = ?1", [job], |row| row.get(0)).optional()?;
    Ok(spec.and_then(|spec| serde_json::from_str(&spec).ok()))
}

/// Registers a job, or updates its spec. A job that comes back under the same name with
/// another uid is a new job: its old state is dropped in the same transaction.
pub fn register_job(store: &mut Store, name: &str, uid: &str, spec: &JobSpec) -> Result<(), rusqlite::Error> {
    let tx = store.write()?;
    register_in(&tx, name, uid, spec)?;
    tx.commit()
}

/// [`register_job`] inside the caller's transaction.
pub fn register_in(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
    uid: &str,
    spec: &JobSpec,
) -> Result<(), rusqlite::Error> {
    let spec_json =
        serde_json::to_string(spec).map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
    let known: Option<String> =
        tx.query_row("SELECT uid FROM jobs WHERE name = ?1", [name], |row| row.get(0)).optional()?;
    match known {
        Some(old) if old == uid => {
            tx.execute("UPDATE jobs SET spec = ?2 WHERE name = ?1", params![name, spec_json])?;
        }
        Some(_) => {
            forget(tx, name)?;
            tx.execute("INSERT INTO jobs (name, uid, spec) VALUES (?1, ?2, ?3)", params![name, uid, spec_json])?;
        }
        None => {
            tx.execute("INSERT INTO jobs (name, uid, spec) VALUES (?1, ?2, ?3)", params![name, uid, spec_json])?;
        }
    }
    Ok(())
}

/// Forgets a job and everything the edge kept for it.
pub fn forget_job(store: &mut Store, name: &str) -> Result<(), rusqlite::Error> {
    store.recorder.forget(name);
    let tx = store.write()?;
    forget(&tx, name)?;
    tx.commit()
}

pub(crate) fn forget(tx: &rusqlite::Transaction<'_>, name: &str) -> Result<(), rusqlite::Error> {
    // policy_health too: a job re-created under the same name must not show the old one's last
    // decision or failing policy as its own.
    for table in ["batches", "results", "outbox", "workers", "decisions", "shadows", "held_reports", "policy_health"] {
        tx.execute(&format!("DELETE FROM {table} WHERE job = ?1"), [name])?;
    }
    tx.execute("DELETE FROM jobs WHERE name = ?1", [name])?;
    Ok(())
}

/// A committed batch: which samples, where in the file, and their assignments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchRow {
    pub batch: i64,
    pub first_seq: u64,
    pub start: u64,
    pub end: u64,
    pub assignments: Vec<u8>,
    pub train_round: Option<i64>,
}

/// The job's committed batches, in order.
pub fn batches(store: &Store, job: &str) -> Result<Vec<BatchRow>, rusqlite::Error> {
    let mut statement = store.conn().prepare(
        "SELECT batch, first_seq, start, end, assignments, train_round FROM batches WHERE job = ?1 ORDER BY batch",
    )?;
    let rows = statement.query_map([job], |row| {
        Ok(BatchRow {
            batch: row.get(0)?,
            first_seq: row.get::<_, i64>(1)? as u64,
            start: row.get::<_, i64>(2)? as u64,
            end: row.get::<_, i64>(3)? as u64,
            assignments: row.get(4)?,
            train_round: row.get(5)?,
        })
    })?;
    rows.collect()
}

/// The csv header of the job's dataset, once read.
pub fn header(store: &Store, job: &str) -> Result<Option<String>, rusqlite::Error> {
    store
        .conn()
        .query_row("SELECT header FROM jobs WHERE name = ?1", [job], |row| row.get(0))
        .optional()
        .map(Option::flatten)
}
