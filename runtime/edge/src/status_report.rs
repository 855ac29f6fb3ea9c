//! What the edge tells the cloud besides stage reports, queued in the outbox when it changes:
//! each dataset's sample count (`Dataset.status.numberOfSamples`) and each job's policies (the
//! plugin and digest serving, a rejected swap, a failing call). The embedded mode reads both
//! from the store directly; over the link they travel, in order, with the stage reports.

use std::collections::{BTreeMap, HashMap};

use rusqlite::{OptionalExtension, params};
use serde_json::json;

use super::health;
use crate::sqlite::Store;

/// The policies and the repeating error last queued per job (name and uid: a job re-created
/// under its name is another job, whose policies are sent afresh), so that only a change is sent
/// (after a restart each job's are sent once again).
pub type SentPolicies = HashMap<(String, String), (perennial_types::PolicyStatuses, Option<String>)>;

/// Queues what changed, in one transaction; returns how many reports were queued.
pub fn queue_changes(store: &mut Store, sent: &mut SentPolicies, now: u64) -> Result<usize, rusqlite::Error> {
    let healths = health::all(store)?;
    let jobs: Vec<(String, String)> = {
        let mut statement = store.conn().prepare("SELECT name, uid FROM jobs ORDER BY name")?;
        statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?
    };
    let tx = store.write()?;
    let mut queued = 0;
    let counts: Vec<(String, i64)> = {
        let mut statement = tx.prepare("SELECT dataset, samples FROM dataset_status WHERE reported = 0")?;
        statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?
    };
    for (dataset, samples) in counts {
        queue_count(&tx, &dataset, samples, now)?;
        queued += 1;
    }
    let faults: HashMap<String, String> = crate::rounds::faults(&tx)?.into_iter().collect();
    let mut next = SentPolicies::new();
    for (job, uid) in jobs {
        let mut policies = BTreeMap::new();
        health::apply_job(&mut policies, &healths, &job);
        let fault = faults.get(&job).cloned();
        let now_sent = (policies, fault);
        let id = (job, uid);
        let last_fault = sent.get(&id).and_then(|(_, fault)| fault.as_ref());
        let worth = !now_sent.0.is_empty() || now_sent.1.as_ref() != last_fault;
        if sent.get(&id) != Some(&now_sent) && worth {
            let (job, uid) = &id;
            let (policies, fault) = &now_sent;
            let body = json!({"job": job, "jobUid": uid, "policies": policies, "fault": fault}).to_string();
            tx.execute("INSERT INTO outbox (job, body, created) VALUES (?1, ?2, ?3)", params![job, body, now as i64])?;
            queued += 1;
        }
        next.insert(id, now_sent);
    }
    tx.commit()?;
    *sent = next;
    Ok(queued)
}

/// Queues the count of `job`'s dataset if it changed since it was last queued, inside the
/// caller's transaction (a Train Ready report's: the count goes just before it).
pub fn queue_job_count(tx: &rusqlite::Transaction<'_>, job: &str, now: u64) -> Result<(), rusqlite::Error> {
    let count = tx
        .query_row(
            "SELECT dataset_status.dataset, dataset_status.samples FROM dataset_status JOIN jobs
             ON dataset_status.dataset = json_extract(jobs.spec, '$.dataset')
             WHERE jobs.name = ?1 AND dataset_status.reported = 0",
            [job],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?;
    match count {
        Some((dataset, samples)) => queue_count(tx, &dataset, samples, now),
        None => Ok(()),
    }
}

fn queue_count(tx: &rusqlite::Transaction<'_>, dataset: &str, samples: i64, now: u64) -> Result<(), rusqlite::Error> {
    let body = json!({"dataset": dataset, "numberOfSamples": samples}).to_string();
    tx.execute("INSERT INTO outbox (job, body, created) VALUES (?1, ?2, ?3)", params![dataset, body, now as i64])?;
    tx.execute(
        "UPDATE dataset_status SET reported = 1 WHERE dataset = ?1 AND samples = ?2",
        params![dataset, samples],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSpec;

    fn outbox(store: &Store) -> Vec<serde_json::Value> {
        let mut statement = store.conn().prepare("SELECT body FROM outbox ORDER BY seq").unwrap();
        statement
            .query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(|body| serde_json::from_str(&body.unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn counts_and_policies_are_queued_when_they_change_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        crate::register_job(&mut store, "ml/a", "uid-a", &JobSpec::default()).unwrap();
        store
            .conn()
            .execute("INSERT INTO dataset_status (dataset, samples, reported) VALUES ('ml/d', 120, 0)", [])
            .unwrap();
        let serving = health::Serving { plugin: "builtin:threshold-trigger", digest: "abc", config: "44136fa355b3" };
        health::swapped(&mut store, "ml/a", "trigger", serving, 1).unwrap();
        let mut sent = SentPolicies::new();
        assert_eq!(queue_changes(&mut store, &mut sent, 5).unwrap(), 2);
        let queued = outbox(&store);
        assert_eq!(queued[0], json!({"dataset": "ml/d", "numberOfSamples": 120}));
        assert_eq!(
            queued[1],
            json!({"job": "ml/a", "jobUid": "uid-a", "fault": null, "policies": {"trigger": {
                "plugin": "builtin:threshold-trigger", "digest": "abc", "config": "44136fa355b3", "health": "Serving"}}})
        );
        // A decision that acted travels too, with the policy's reason.
        let tx = store.write().unwrap();
        health::decided(&tx, "ml/a", "trigger", "train", "num_of_samples 501 > 500", 1_780_000_000).unwrap();
        tx.commit().unwrap();
        assert_eq!(queue_changes(&mut store, &mut sent, 5).unwrap(), 1);
        let decision = &outbox(&store)[2]["policies"]["trigger"]["lastDecision"];
        assert_eq!(
            *decision,
            json!({"answer": "train", "reason": "num_of_samples 501 > 500", "time": "2026-05-28T20:26:40Z"})
        );
        // Nothing changed: nothing queued.
        assert_eq!(queue_changes(&mut store, &mut sent, 6).unwrap(), 0);
        // A rejected swap: the job's policies again, the previous digest serving.
        health::rejected(&mut store, "ml/a", "trigger", "x.wasm: configure refused", 7).unwrap();
        assert_eq!(queue_changes(&mut store, &mut sent, 8).unwrap(), 1);
        let policies = &outbox(&store)[3]["policies"]["trigger"];
        assert_eq!((policies["digest"].as_str(), policies["health"].as_str()), (Some("abc"), Some("LoadFailed")));
        // A repeating error travels with them, once while it lasts, and its end.
        let fault = "ingest: index.txt: not a regular file (a folder) (since 1970-01-01T00:00:09Z)";
        crate::rounds::set_fault(&mut store, "ml/a", Some(fault)).unwrap();
        assert_eq!(queue_changes(&mut store, &mut sent, 9).unwrap(), 1);
        assert_eq!(outbox(&store)[4]["fault"], fault);
        assert_eq!(queue_changes(&mut store, &mut sent, 10).unwrap(), 0);
        crate::rounds::set_fault(&mut store, "ml/a", None).unwrap();
        assert_eq!(queue_changes(&mut store, &mut sent, 11).unwrap(), 1);
        assert!(outbox(&store)[5]["fault"].is_null());
    }

    #[test]
    fn a_jobs_count_is_queued_with_its_report_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        let spec = JobSpec { dataset: "ml/d".into(), ..JobSpec::default() };
        crate::register_job(&mut store, "ml/a", "uid-a", &spec).unwrap();
        crate::register_job(&mut store, "ml/b", "uid-b", &JobSpec::default()).unwrap();
        store
            .conn()
            .execute("INSERT INTO dataset_status (dataset, samples, reported) VALUES ('ml/d', 120, 0)", [])
            .unwrap();
        let tx = store.write().unwrap();
        queue_job_count(&tx, "ml/b", 5).unwrap();
        queue_job_count(&tx, "ml/a", 5).unwrap();
        queue_job_count(&tx, "ml/a", 5).unwrap();
        tx.commit().unwrap();
        assert_eq!(outbox(&store), [json!({"dataset": "ml/d", "numberOfSamples": 120})], "once, and only its own");
        // Queued: the next round of changes does not send it again.
        assert_eq!(queue_changes(&mut store, &mut SentPolicies::new(), 6).unwrap(), 0);
    }

    #[test]
    fn a_job_made_again_under_its_name_inherits_nothing_and_is_reported_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
        crate::register_job(&mut store, "ml/a", "uid-1", &JobSpec::default()).unwrap();
        let serving = health::Serving { plugin: "builtin:threshold-trigger", digest: "abc", config: "44136fa355b3" };
        health::swapped(&mut store, "ml/a", "trigger", serving, 1).unwrap();
        let tx = store.write().unwrap();
        health::decided(&tx, "ml/a", "trigger", "train", "num_of_samples 501 > 500", 2).unwrap();
        tx.commit().unwrap();
        let mut sent = SentPolicies::new();
        assert_eq!(queue_changes(&mut store, &mut sent, 3).unwrap(), 1);
        store.conn().execute("DELETE FROM outbox", []).unwrap();

        // Deleted and made again while the edge was away: the desired state shows a new uid.
        crate::register_job(&mut store, "ml/a", "uid-2", &JobSpec::default()).unwrap();
        assert!(health::all(&store).unwrap().iter().all(|h| h.job != "ml/a"), "the old job's health is gone");
        health::swapped(&mut store, "ml/a", "trigger", serving, 4).unwrap();
        assert_eq!(queue_changes(&mut store, &mut sent, 5).unwrap(), 1, "the same policies, for another job");
        let queued = &outbox(&store)[0];
        assert_eq!(queued["jobUid"], "uid-2");
        assert!(queued["policies"]["trigger"].get("lastDecision").is_none(), "{queued}");
    }
}
