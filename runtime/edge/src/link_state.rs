//! The edge store as the cloud link sees it ([`EdgeState`]): the outbox it resends from, and the
//! node's desired state, committed with its seq in one transaction together with what it means
//! for the edge's jobs (registered, re-staged, forgotten). The agent runs on from this state
//! while the cloud is away.

use std::collections::BTreeSet;

use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::jobs::{forget, register_in};
use super::rounds::apply_notice_in;
use crate::sqlite::Store;
use perennial_link::edge_client::EdgeState;
use perennial_link::{Changes, Delete};

use perennial_types::RegistryAuth;
pub use perennial_types::{NodeJob, NodeJobMeta, NodeWorker, StageNotice, node_job};

/// The desired jobs held now, as last committed.
pub fn desired_jobs(store: &Store) -> Result<Vec<NodeJob>, rusqlite::Error> {
    let mut statement = store.conn().prepare("SELECT key, body FROM desired WHERE kind = 'job' ORDER BY key")?;
    let rows = statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))?;
    let mut jobs = Vec::new();
    for row in rows {
        let (key, body) = row?;
        match serde_json::from_str::<Value>(&body).map_err(|err| err.to_string()).and_then(|v| node_job(&key, &v)) {
            Ok(job) => jobs.push(job),
            Err(err) => tracing::error!("stored desired state: {err}"),
        }
    }
    Ok(jobs)
}

/// A desired job as this node keeps it: without its registry logins (`config.registryAuth`),
/// which live in memory only; only which registries they were for (`withheld`) and from which
/// Secrets. After a restart, the components they pulled serve from the copies kept by digest
/// until the link brings them again.
fn kept_form(object: &Value) -> std::borrow::Cow<'_, Value> {
    let Some(auth) = object.pointer("/config/registryAuth") else {
        return std::borrow::Cow::Borrowed(object);
    };
    // Unreadable: dropped whole (the job reads it anyway, or is left out).
    let withheld = serde_json::from_value::<RegistryAuth>(auth.clone())
        .ok()
        .map(|auth| auth.kept_form())
        .filter(|kept| !kept.is_empty())
        .and_then(|kept| serde_json::to_value(kept).ok());
    let mut kept = object.clone();
    if let Some(config) = kept.get_mut("config").and_then(Value::as_object_mut) {
        match withheld {
            Some(withheld) => config.insert("registryAuth".into(), withheld),
            None => config.remove("registryAuth"),
        };
    }
    std::borrow::Cow::Owned(kept)
}

fn sql(err: rusqlite::Error) -> String {
    format!("edge state database: {err}")
}

impl EdgeState for Store {
    fn allocated(&mut self) -> Result<u64, String> {
        let seq: Option<i64> = self
            .conn()
            .query_row("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'", [], |row| row.get(0))
            .optional()
            .map_err(sql)?;
        Ok(seq.unwrap_or(0).max(0) as u64)
    }

    fn fetch(&mut self, after: u64, limit: usize) -> Result<Vec<(u64, Value)>, String> {
        let mut statement =
            self.conn().prepare("SELECT seq, body FROM outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2").map_err(sql)?;
        let rows = statement
            .query_map(params![after as i64, limit as i64], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)))
            .map_err(sql)?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, body) = row.map_err(sql)?;
            // A row is written by this agent as JSON; one that is not is sent as a string
            // rather than blocking the rows after it.
            let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
            out.push((seq as u64, body));
        }
        Ok(out)
    }

    fn delete(&mut self, delete: Delete) -> Result<(), String> {
        let (query, seq) = match delete {
            Delete::Through(seq) => ("DELETE FROM outbox WHERE seq <= ?1", seq),
            Delete::Only(seq) => ("DELETE FROM outbox WHERE seq = ?1", seq),
        };
        self.conn().execute(query, [seq as i64]).map_err(sql)?;
        Ok(())
    }

    fn renumber_above(&mut self, floor: u64) -> Result<(), String> {
        let floor = floor as i64;
        let tx = self.write().map_err(sql)?;
        // Every row moves up by the same amount, so the order holds and no two collide (floor
        // is above every seq this outbox ever numbered).
        tx.execute("UPDATE outbox SET seq = seq + ?1", [floor]).map_err(sql)?;
        let top: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM outbox", [], |r| r.get(0)).map_err(sql)?;
        tx.execute("DELETE FROM sqlite_sequence WHERE name = 'outbox'", []).map_err(sql)?;
        tx.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('outbox', ?1)", [top.max(floor)]).map_err(sql)?;
        tx.commit().map_err(sql)
    }

    fn last_applied_desired(&mut self) -> Result<u64, String> {
        let seq: i64 = self.conn().query_row("SELECT desired_seq FROM link", [], |row| row.get(0)).map_err(sql)?;
        Ok(seq.max(0) as u64)
    }

    fn held(&mut self) -> Result<(BTreeSet<String>, BTreeSet<String>), String> {
        let keys = |kind: &str| -> Result<BTreeSet<String>, String> {
            let mut statement = self.conn().prepare("SELECT key FROM desired WHERE kind = ?1").map_err(sql)?;
            let rows = statement.query_map([kind], |row| row.get(0)).map_err(sql)?;
            rows.collect::<Result<_, _>>().map_err(sql)
        };
        Ok((keys("job")?, keys("dataset")?))
    }

    fn apply_desired(&mut self, changes: &Changes) -> Result<(), String> {
        let tx = self.write().map_err(sql)?;
        for (key, object) in &changes.datasets {
            tx.execute(
                "INSERT OR REPLACE INTO desired (kind, key, body) VALUES ('dataset', ?1, ?2)",
                params![key, object.to_string()],
            )
            .map_err(sql)?;
        }
        for (key, object) in &changes.jobs {
            // A job the edge cannot read is left out (and said), not allowed to stop the others.
            let job = match node_job(key, object) {
                Ok(job) => job,
                Err(err) => {
                    tracing::error!("desired state {}: {err}; the job is not run here", changes.seq);
                    continue;
                }
            };
            tx.execute(
                "INSERT OR REPLACE INTO desired (kind, key, body) VALUES ('job', ?1, ?2)",
                params![key, kept_form(object).to_string()],
            )
            .map_err(sql)?;
            register_in(&tx, key, &job.metadata.uid, &job.config.spec).map_err(sql)?;
            if let Some(notice) = &job.notice {
                apply_notice_in(&tx, key, notice).map_err(sql)?;
            }
            for worker in &job.workers {
                // A name already known keeps what it reported.
                tx.execute(
                    "INSERT OR IGNORE INTO workers (name, job, round, stage) VALUES (?1, ?2, ?3, ?4)",
                    params![worker.name, key, worker.round, worker.stage.report_kind()],
                )
                .map_err(sql)?;
                // A report the worker sent before its name reached this agent is taken now.
                for refused in crate::worker_api::release_held(&tx, &worker.name).map_err(sql)? {
                    tracing::warn!(job = key, "{refused}");
                }
            }
        }
        for key in &changes.removed_jobs {
            tx.execute("DELETE FROM desired WHERE kind = 'job' AND key = ?1", [key]).map_err(sql)?;
            forget(&tx, key).map_err(sql)?;
        }
        for key in &changes.removed_datasets {
            tx.execute("DELETE FROM desired WHERE kind = 'dataset' AND key = ?1", [key]).map_err(sql)?;
        }
        tx.execute("UPDATE link SET desired_seq = ?1", [changes.seq as i64]).map_err(sql)?;
        tx.commit().map_err(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_kept_without_its_registry_logins() {
        let login = serde_json::json!({"secret": "ml/regcred", "username": "ann", "password": "pw-9"});
        let object = serde_json::json!({"metadata": {"name": "j"}, "config": {
            "name": "ml/j", "registryAuth": {"logins": {"127.0.0.1:5000": login}}}});
        let kept = kept_form(&object).to_string();
        assert!(!kept.contains("pw-9") && !kept.contains("ann"), "{kept}");
        // Which Secret it was, so that a copy kept by digest serves only a pull as that Secret.
        assert_eq!(
            kept_form(&object)["config"]["registryAuth"],
            serde_json::json!({"withheld": ["127.0.0.1:5000"], "withheldFrom": {"127.0.0.1:5000": "ml/regcred"}})
        );
        assert!(kept.contains("ml/j"), "{kept}");
        let plain = serde_json::json!({"config": {"name": "ml/j"}});
        assert!(matches!(kept_form(&plain), std::borrow::Cow::Borrowed(_)), "no copy when there is nothing to strip");
    }
}
