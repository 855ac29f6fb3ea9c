//! The embedded mode's job store (`control.db`), in place of the API server: the applied
//! manifests, each job's status, and the last edge report applied (so that a report is applied
//! once even when its acknowledgement was lost to a crash).

use std::path::{Path, PathBuf};

use rusqlite::{OptionalExtension, params};

use perennial_api::{Dataset, LifelongLearningJob, LifelongLearningJobStatus};
use perennial_edge::sqlite::{Store, StoreError};

const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE objects (
        kind TEXT NOT NULL,        -- Dataset, LifelongLearningJob, Pod
        key TEXT NOT NULL,         -- namespace/name
        uid TEXT NOT NULL,
        body TEXT NOT NULL,        -- the manifest as JSON
        dir TEXT NOT NULL,         -- the manifest's folder (relative paths in templates)
        PRIMARY KEY (kind, key)
    );
    CREATE TABLE status (
        job TEXT PRIMARY KEY,
        body TEXT NOT NULL
    );
    CREATE TABLE dataset_status (
        dataset TEXT PRIMARY KEY,
        samples INTEGER NOT NULL,
        updated INTEGER NOT NULL
    );
    CREATE TABLE link (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        applied_seq INTEGER NOT NULL
    );
    INSERT INTO link (id, applied_seq) VALUES (1, 0);
",
    perennial_edge::sqlite::STORE_ID_MIGRATION,
];

/// Opens the job store in `state_dir`.
pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
    Store::open_with(&state_dir.join("control.db"), MIGRATIONS)
}

/// A stored object and the folder of its manifest.
#[derive(Clone, Debug)]
pub struct Stored<T> {
    pub object: T,
    pub uid: String,
    pub dir: PathBuf,
}

/// One object to store: its kind, `namespace/name`, the manifest as JSON and its folder.
pub struct Applied<'a> {
    pub kind: &'a str,
    pub key: &'a str,
    pub body: &'a serde_json::Value,
    pub dir: &'a Path,
}

/// What an object was before [`apply_all`] stored over it (`None`: it was new), so that a run
/// that fails to start can take back what it stored.
#[derive(Clone, Debug, Default)]
pub struct Undo {
    /// Each object stored: its kind, its key, and what it was.
    previous: Vec<(String, String, Option<Row>)>,
}

/// A stored object's uid, body and folder, as its row holds them.
type Row = (String, String, String);

impl Undo {
    /// Whether nothing was stored.
    pub fn is_empty(&self) -> bool {
        self.previous.is_empty()
    }

    /// The keys of the objects that were new.
    pub fn new_keys(&self, kind: &str) -> Vec<String> {
        self.previous.iter().filter(|(k, _, was)| k == kind && was.is_none()).map(|(_, key, _)| key.clone()).collect()
    }
}

/// Stores objects (create or update, as `kubectl apply`) in one transaction: all or none. A new
/// one gets a uid, an updated one keeps its uid and status.
pub fn apply_all(store: &mut Store, objects: &[Applied<'_>]) -> rusqlite::Result<Undo> {
    let tx = store.write()?;
    let mut undo = Undo::default();
    for object in objects {
        let known: Option<Row> = tx
            .query_row(
                "SELECT uid, body, dir FROM objects WHERE kind = ?1 AND key = ?2",
                params![object.kind, object.key],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let uid = match &known {
            Some((uid, _, _)) => uid.clone(),
            None => new_uid().map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?,
        };
        tx.execute(
            "INSERT INTO objects (kind, key, uid, body, dir) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (kind, key) DO UPDATE SET body = excluded.body, dir = excluded.dir",
            params![object.kind, object.key, uid, object.body.to_string(), object.dir.display().to_string()],
        )?;
        undo.previous.push((object.kind.to_owned(), object.key.to_owned(), known));
    }
    tx.commit()?;
    Ok(undo)
}

/// Puts back what [`apply_all`] replaced and removes what it added (with any status a new job
/// got since), in one transaction.
pub fn take_back(store: &mut Store, undo: &Undo) -> rusqlite::Result<()> {
    let tx = store.write()?;
    for (kind, key, was) in undo.previous.iter().rev() {
        match was {
            Some((uid, body, dir)) => tx.execute(
                "UPDATE objects SET uid = ?3, body = ?4, dir = ?5 WHERE kind = ?1 AND key = ?2",
                params![kind, key, uid, body, dir],
            )?,
            None => {
                if kind == "LifelongLearningJob" {
                    tx.execute("DELETE FROM status WHERE job = ?1", [key])?;
                }
                tx.execute("DELETE FROM objects WHERE kind = ?1 AND key = ?2", params![kind, key])?
            }
        };
    }
    tx.commit()
}

fn new_uid() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    // The shape of a Kubernetes uid (a v4 UUID).
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    Ok(format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]))
}

/// Every stored object of `kind`, by key.
pub fn list<T: serde::de::DeserializeOwned>(store: &Store, kind: &str) -> rusqlite::Result<Vec<(String, Stored<T>)>> {
    let mut statement = store.conn().prepare("SELECT key, uid, body, dir FROM objects WHERE kind = ?1 ORDER BY key")?;
    let rows = statement.query_map([kind], |r| {
        let body: String = r.get(2)?;
        let object = serde_json::from_str(&body)
            .map_err(|err| rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(err)))?;
        Ok((r.get(0)?, Stored { object, uid: r.get(1)?, dir: PathBuf::from(r.get::<_, String>(3)?) }))
    })?;
    rows.collect()
}

pub fn datasets(store: &Store) -> rusqlite::Result<Vec<(String, Stored<Dataset>)>> {
    list(store, "Dataset")
}

pub fn jobs(store: &Store) -> rusqlite::Result<Vec<(String, Stored<LifelongLearningJob>)>> {
    list(store, "LifelongLearningJob")
}

/// The job's status; the default (no stage yet) for a new job.
pub fn status(store: &Store, job: &str) -> rusqlite::Result<LifelongLearningJobStatus> {
    let body: Option<String> =
        store.conn().query_row("SELECT body FROM status WHERE job = ?1", [job], |r| r.get(0)).optional()?;
    Ok(body.and_then(|b| serde_json::from_str(&b).ok()).unwrap_or_default())
}

/// The last edge report applied.
pub fn applied_seq(store: &Store) -> rusqlite::Result<i64> {
    store.conn().query_row("SELECT applied_seq FROM link WHERE id = 1", [], |r| r.get(0))
}

/// Saves statuses and the last applied report in one transaction.
pub fn save(
    store: &mut Store,
    statuses: &[(&str, &LifelongLearningJobStatus)],
    applied_seq: i64,
    datasets: &[(String, u64)],
    now: i64,
) -> rusqlite::Result<()> {
    let tx = store.write()?;
    for (job, status) in statuses {
        let body =
            serde_json::to_string(status).map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
        tx.execute(
            "INSERT INTO status (job, body) VALUES (?1, ?2) ON CONFLICT (job) DO UPDATE SET body = excluded.body",
            params![job, body],
        )?;
    }
    for (dataset, samples) in datasets {
        tx.execute(
            "INSERT INTO dataset_status (dataset, samples, updated) VALUES (?1, ?2, ?3)
             ON CONFLICT (dataset) DO UPDATE SET samples = excluded.samples, updated = excluded.updated",
            params![dataset, *samples as i64, now],
        )?;
    }
    tx.execute("UPDATE link SET applied_seq = MAX(applied_seq, ?1) WHERE id = 1", [applied_seq])?;
    tx.commit()
}

/// The dataset's sample count as last reported by the edge.
pub fn dataset_samples(store: &Store, dataset: &str) -> rusqlite::Result<Option<u64>> {
    store
        .conn()
        .query_row("SELECT samples FROM dataset_status WHERE dataset = ?1", [dataset], |r| r.get::<_, i64>(0))
        .optional()
        .map(|n| n.map(|n| n as u64))
}

/// The keys of the stored jobs.
pub fn job_keys(store: &Store) -> rusqlite::Result<Vec<String>> {
    let mut statement = store.conn().prepare_cached("SELECT key FROM objects WHERE kind = 'LifelongLearningJob'")?;
    let rows = statement.query_map([], |r| r.get(0))?;
    rows.collect()
}

/// Deletes a job and its status; returns whether it was there.
pub fn delete_job(store: &mut Store, key: &str) -> rusqlite::Result<bool> {
    let tx = store.write()?;
    let gone = tx.execute("DELETE FROM objects WHERE kind = 'LifelongLearningJob' AND key = ?1", [key])?;
    tx.execute("DELETE FROM status WHERE job = ?1", [key])?;
    tx.commit()?;
    Ok(gone > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(store: &Store) -> Vec<(String, String, String)> {
        let mut statement = store.conn().prepare("SELECT kind, key, body FROM objects ORDER BY kind, key").unwrap();
        statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
    }

    #[test]
    fn what_a_run_stored_is_taken_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path()).unwrap();
        let (old, new) = (serde_json::json!({"v": 1}), serde_json::json!({"v": 2}));
        let object = |kind, key, body| Applied { kind, key, body, dir: Path::new("/m") };
        apply_all(
            &mut store,
            &[object("Dataset", "default/d", &old), object("LifelongLearningJob", "default/a", &old)],
        )
        .unwrap();
        let before = stored(&store);
        let undo = apply_all(
            &mut store,
            &[object("LifelongLearningJob", "default/a", &new), object("LifelongLearningJob", "default/b", &new)],
        )
        .unwrap();
        assert_eq!(undo.new_keys("LifelongLearningJob"), ["default/b"]);
        save(&mut store, &[("default/b", &LifelongLearningJobStatus::default())], 0, &[], 0).unwrap();
        take_back(&mut store, &undo).unwrap();
        assert_eq!(stored(&store), before);
        assert!(
            store
                .conn()
                .query_row("SELECT count(*) FROM status WHERE job = 'default/b'", [], |r| r.get::<_, i64>(0))
                .unwrap()
                == 0
        );
    }
}
