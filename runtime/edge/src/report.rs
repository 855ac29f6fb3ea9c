//! Reports from the edge to the control plane, kept in the durable outbox until acknowledged.
//!
//! The body is Sedna's upstream message (`phase`, `status`, `input`, `output`, with Sedna's
//! field names) plus what Perennial adds so that a late or stale report is recognised: the
//! job's uid and the round.

use rusqlite::params;

use crate::sqlite::Store;

pub use perennial_types::{Input, Model, Output, Report};

/// Queues `report` in the outbox, inside the caller's transaction.
pub fn enqueue(tx: &rusqlite::Transaction<'_>, report: &Report, now: u64) -> Result<(), rusqlite::Error> {
    let body = serde_json::to_string(report).map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
    tx.execute("INSERT INTO outbox (job, body, created) VALUES (?1, ?2, ?3)", params![report.job, body, now as i64])?;
    Ok(())
}

/// Reports not yet acknowledged, oldest first, with their outbox sequence numbers.
pub fn pending(store: &Store, limit: usize) -> Result<Vec<(i64, Report)>, rusqlite::Error> {
    let mut statement = store.conn().prepare("SELECT seq, body FROM outbox ORDER BY seq LIMIT ?1")?;
    let rows = statement.query_map([limit as i64], |row| {
        let body: String = row.get(1)?;
        let report = serde_json::from_str(&body)
            .map_err(|err| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(err)))?;
        Ok((row.get(0)?, report))
    })?;
    rows.collect()
}

/// Drops every report up to and including `seq`: the control plane has applied them.
pub fn acknowledge(store: &mut Store, seq: i64) -> Result<(), rusqlite::Error> {
    store.conn().execute("DELETE FROM outbox WHERE seq <= ?1", [seq])?;
    Ok(())
}

/// Datasets whose sample count changed since it was last reported: (namespace/name, samples).
pub fn dataset_updates(store: &Store) -> Result<Vec<(String, u64)>, rusqlite::Error> {
    let mut statement = store.conn().prepare("SELECT dataset, samples FROM dataset_status WHERE reported = 0")?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as u64)))?;
    rows.collect()
}

/// Notes that `samples` was reported for `dataset` (a later count stays unreported).
pub fn dataset_reported(store: &mut Store, dataset: &str, samples: u64) -> Result<(), rusqlite::Error> {
    store.conn().execute(
        "UPDATE dataset_status SET reported = 1 WHERE dataset = ?1 AND samples = ?2",
        params![dataset, samples as i64],
    )?;
    Ok(())
}
