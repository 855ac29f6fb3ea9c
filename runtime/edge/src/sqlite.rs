//! The edge's durable state: one SQLite file, WAL mode, `synchronous=FULL`, a busy timeout,
//! write transactions begun immediately, and versioned migrations.
//!
//! Every state change that matters is one transaction, so a kill at any moment loses nothing
//! that was committed and leaves nothing half-written.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior};

use crate::decisions::{Record, Recorder};

/// The schema, one migration per version; a database is brought up to the last one on open.
const MIGRATIONS: &[&str] = &[
    // 1: jobs with their sample cursor, committed batches of assignments.
    r#"
    CREATE TABLE jobs (
        name          TEXT PRIMARY KEY,        -- namespace/name
        uid           TEXT NOT NULL,
        spec          TEXT NOT NULL,           -- JSON
        cursor_offset INTEGER NOT NULL DEFAULT 0,
        cursor_lines  INTEGER NOT NULL DEFAULT 0,
        cursor_samples INTEGER NOT NULL DEFAULT 0,
        cursor_skipping INTEGER,
        file_len      INTEGER NOT NULL DEFAULT 0,
        file_id       TEXT,
        header        TEXT,
        refused       INTEGER NOT NULL DEFAULT 0,
        batches       INTEGER NOT NULL DEFAULT 0,
        round         INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE batches (
        job          TEXT NOT NULL,
        batch        INTEGER NOT NULL,
        first_seq    INTEGER NOT NULL,
        start        INTEGER NOT NULL,         -- byte range of the batch in the index file
        end          INTEGER NOT NULL,
        assignments  BLOB NOT NULL,            -- one byte per sample: 0 train, 1 eval, 2 skip
        train_round  INTEGER,                  -- the round whose train file took its train samples
        PRIMARY KEY (job, batch)
    ) WITHOUT ROWID;
    "#,
    // 2: the job's stage as the control plane sees it, what the edge already did for it, results
    // reported by workers, the deployed model, and the outbox of reports to the control plane.
    r#"
    ALTER TABLE jobs ADD COLUMN stage TEXT NOT NULL DEFAULT 'Train';
    ALTER TABLE jobs ADD COLUMN phase TEXT NOT NULL DEFAULT 'Waiting';
    ALTER TABLE jobs ADD COLUMN round_started_at INTEGER;
    ALTER TABLE jobs ADD COLUMN acted TEXT;              -- '<round>/<stage>' already reported on
    ALTER TABLE jobs ADD COLUMN deployed TEXT;           -- JSON of the deployed model
    ALTER TABLE batches ADD COLUMN train_count INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE batches ADD COLUMN eval_count INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE results (
        job    TEXT NOT NULL,
        round  INTEGER NOT NULL,
        stage  TEXT NOT NULL,                            -- 'train' or 'eval'
        body   TEXT NOT NULL,                            -- JSON: the worker's models
        PRIMARY KEY (job, round, stage)
    ) WITHOUT ROWID;
    CREATE TABLE outbox (
        seq     INTEGER PRIMARY KEY AUTOINCREMENT,
        job     TEXT NOT NULL,
        body    TEXT NOT NULL,                           -- JSON report
        created INTEGER NOT NULL
    );
    "#,
    // 3: worker names the edge issued, so that only its own workers may report.
    r#"
    CREATE TABLE workers (
        name   TEXT PRIMARY KEY,
        job    TEXT NOT NULL,
        round  INTEGER NOT NULL,
        stage  TEXT NOT NULL                             -- 'train', 'eval' or 'deploy'
    ) WITHOUT ROWID;
    "#,
    // 4: the samples counted in each dataset (Dataset.status.numberOfSamples), a level that the
    // control plane is sent when it changes.
    r#"
    CREATE TABLE dataset_status (
        dataset  TEXT PRIMARY KEY,                       -- namespace/name
        samples  INTEGER NOT NULL,
        reported INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    "#,
    // 5: a worker's last relayed report (status and results), so that only a repeat is
    // dropped; each batch's checksum, so that round files never take bytes that changed.
    r#"
    ALTER TABLE workers ADD COLUMN last_report TEXT;
    ALTER TABLE batches ADD COLUMN checksum BLOB;
    "#,
    // 6: each policy's health (its last call failed, and why), for the job's status.
    r#"
    CREATE TABLE policy_health (
        job     TEXT NOT NULL,
        kind    TEXT NOT NULL,                           -- 'trigger', 'splitter', 'selector'
        failing INTEGER NOT NULL,
        message TEXT,
        since   INTEGER NOT NULL,
        PRIMARY KEY (job, kind)
    ) WITHOUT ROWID;
    "#,
    // 7: why the job waits on the edge (the trigger's reason, a missing train result, a held
    // policy), for the job's status.
    r#"
    ALTER TABLE jobs ADD COLUMN waiting TEXT;
    "#,
    // 8: the policy serving after a hot swap (plugin, digest), and a rejected one with why.
    r#"
    ALTER TABLE policy_health ADD COLUMN plugin TEXT;
    ALTER TABLE policy_health ADD COLUMN digest TEXT;
    ALTER TABLE policy_health ADD COLUMN rejected TEXT;
    "#,
    // 9: the node's desired state from the cloud link (jobs and datasets as sent), and the seq
    // of the last one committed, so that the agent runs on from it while the cloud is away.
    r#"
    CREATE TABLE desired (
        kind  TEXT NOT NULL,                             -- 'job' or 'dataset'
        key   TEXT NOT NULL,                             -- namespace/name
        body  TEXT NOT NULL,                             -- JSON, as the cloud sent it
        PRIMARY KEY (kind, key)
    ) WITHOUT ROWID;
    CREATE TABLE link (
        id           INTEGER PRIMARY KEY CHECK (id = 1),
        desired_seq  INTEGER NOT NULL
    );
    INSERT INTO link (id, desired_seq) VALUES (1, 0);
    "#,
    // 10: for authors: the serving policy's config (a short digest), and its last decision
    // that acted (train, deploy, keep) with its reason and time.
    r#"
    ALTER TABLE policy_health ADD COLUMN config TEXT;
    ALTER TABLE policy_health ADD COLUMN decision TEXT;
    ALTER TABLE policy_health ADD COLUMN reason TEXT;
    ALTER TABLE policy_health ADD COLUMN decided_at INTEGER;
    "#,
    // 11: every policy decision with what the policy saw (decisions.rs), for authors to read
    // and replay candidates on.
    r#"
    CREATE TABLE decisions (
        id          INTEGER PRIMARY KEY,                 -- only the oldest are deleted: ids grow
        job         TEXT NOT NULL,
        kind        TEXT NOT NULL,                       -- 'trigger', 'splitter', 'selector'
        at_ms       INTEGER NOT NULL,
        last_ms     INTEGER NOT NULL,                    -- a run of identical waits: the last
        repeats     INTEGER NOT NULL,
        plugin      TEXT NOT NULL,
        digest      TEXT NOT NULL,
        config      TEXT NOT NULL,
        round       INTEGER NOT NULL,
        input       TEXT NOT NULL,                       -- JSON
        answer      TEXT NOT NULL,                       -- JSON
        reason      TEXT NOT NULL,
        micros      INTEGER NOT NULL                     -- a split's assignments: its batch's row
    );
    CREATE INDEX decisions_by_job ON decisions (job, id);
    CREATE TABLE shadows (
        job               TEXT NOT NULL,
        kind              TEXT NOT NULL,
        plugin            TEXT NOT NULL,
        digest            TEXT NOT NULL,                 -- '' when it could not be loaded
        config            TEXT NOT NULL,
        calls             INTEGER NOT NULL DEFAULT 0,
        agreed            INTEGER NOT NULL DEFAULT 0,
        disagreed         INTEGER NOT NULL DEFAULT 0,
        failed            INTEGER NOT NULL DEFAULT 0,
        skipped           INTEGER NOT NULL DEFAULT 0,
        message           TEXT,
        last_disagreement TEXT,                          -- JSON
        PRIMARY KEY (job, kind)
    ) WITHOUT ROWID;
    "#,
    // 12: an error that repeats, with its count and first time (faults.rs), for the status.
    "ALTER TABLE jobs ADD COLUMN fault TEXT;",
    // 13: a trigger's differing waits written together as one row (decisions.rs): `runs` says
    // how many records it holds (its `input` is then their list).
    r#"
    ALTER TABLE decisions ADD COLUMN runs INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX decisions_packed ON decisions (job, id) WHERE runs > 1;
    "#,
    // 14: the store's identity, made when it is created, so that a state dir's two stores can
    // tell that they belong together (a lost, emptied or foreign store is refused, not reset).
    STORE_ID_MIGRATION,
    // 15: why the edge will not run a job whose history it lacks (the control plane has it at a
    // round the edge never started: its edge.db was lost or replaced).
    "ALTER TABLE jobs ADD COLUMN lost TEXT;",
    // 16: reports from workers the control plane has not named to a linked agent yet (held until
    // it does, or until they expire: worker_api.rs).
    r#"
    CREATE TABLE held_reports (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        worker   TEXT NOT NULL,
        job      TEXT NOT NULL,
        body     TEXT NOT NULL,                          -- JSON: the checked report
        expires  INTEGER NOT NULL                        -- unix seconds
    );
    CREATE INDEX held_reports_by_worker ON held_reports (worker);
    "#,
    // 17: a policy being loaded to replace the serving one (its status shows it until it serves
    // or is rejected).
    r#"
    ALTER TABLE policy_health ADD COLUMN loading TEXT;
    ALTER TABLE policy_health ADD COLUMN loading_digest TEXT;
    ALTER TABLE policy_health ADD COLUMN loading_since INTEGER;
    "#,
];

/// Gives a store its identity (a random id), as a migration of each schema that has one.
pub const STORE_ID_MIGRATION: &str = r#"
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    INSERT INTO meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))));
"#;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path}: {cause}")]
    Open { path: String, cause: rusqlite::Error },
    #[error("state database {path} is {kind}, not a database file; move it away (a new store is made where none is)")]
    NotAFile { path: String, kind: &'static str },
    #[error("state database {path} has schema version {found}, newer than this binary's {known}; upgrade perennial")]
    TooNew { path: String, found: i64, known: i64 },
    #[error(
        "state database {path} is corrupt ({detail}); nothing was changed. Restore it from a backup (with its -wal \
         file), or move it away to start its jobs over"
    )]
    Corrupt { path: String, detail: String },
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
}

impl StoreError {
    /// Another connection holds the lock it needed.
    fn is_busy(&self) -> bool {
        let (StoreError::Open { cause: source, .. } | StoreError::Sql(source)) = self else { return false };
        matches!(source.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
    }
}

/// The edge store as the job loop, the worker API, the link and the shadows' thread share it.
/// A step locks it to read and to commit, never across a policy call, a file read or a model
/// copy, so that none of the others waits behind those. A panic while it was held left no
/// transaction open (a dropped one rolls back), so a poisoned lock is taken as it is.
pub fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How long a connection waits for another's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Store {
    conn: Connection,
    /// Decision records not yet written (a trigger's waits).
    pub recorder: Recorder,
    /// The datasets' sample counts travel in the outbox (over the link): a round's Train Ready
    /// report is queued right behind its dataset's count, so that the cloud writes the count
    /// before the job's status moves (the embedded mode reads the counts from the store).
    pub counts_in_outbox: bool,
}

impl Store {
    /// Opens (creating if needed) the edge's state database at `path` and migrates it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, MIGRATIONS)
    }

    /// Opens (creating if needed) a state database with its own schema, and migrates it.
    pub fn open_with(path: &Path, migrations: &'static [&'static str]) -> Result<Store, StoreError> {
        // A new database that another process is setting up (its switch to WAL) can refuse a
        // connection at once, without waiting for the busy timeout: tried again for as long.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match Store::open_once(path, migrations) {
                Err(err) if err.is_busy() && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                opened => return opened,
            }
        }
    }

    fn open_once(path: &Path, migrations: &'static [&'static str]) -> Result<Store, StoreError> {
        let shown = path.display().to_string();
        let open_error = |cause| StoreError::Open { path: shown.clone(), cause };
        // A folder, a FIFO or a device where the file is: said as such (SQLite would say only
        // "unable to open", or wait on a FIFO, or write a journal beside /dev/null).
        if let Ok(meta) = std::fs::metadata(path)
            && !meta.is_file()
        {
            let kind = if meta.is_dir() { "a folder" } else { "a FIFO, socket or device" };
            return Err(StoreError::NotAFile { path: shown, kind });
        }
        let mut conn = Connection::open(path).map_err(open_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
        check_integrity(&mut conn, &shown)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_error)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(open_error)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(open_error)?;
        // Each job's turn reads its row and its pending counts, a hundred jobs once a second:
        // statements parsed once, not on every read (rusqlite keeps 16 by default).
        conn.set_prepared_statement_cache_capacity(64);
        let mut store = Store { conn, recorder: Recorder::default(), counts_in_outbox: false };
        store.migrate(&shown, migrations)?;
        Ok(store)
    }

    fn migrate(&mut self, path: &str, migrations: &[&str]) -> Result<(), StoreError> {
        let known = migrations.len() as i64;
        if user_version(&self.conn)? == known {
            return Ok(()); // up to date: no write lock taken
        }
        // The version is read again under the write lock: another process opening the same
        // database at the same moment (`perennial status` while `perennial run` starts) waits
        // for this one and then finds it migrated, instead of migrating it a second time.
        let tx = self.write()?;
        let found = user_version(&tx)?;
        if found > known {
            return Err(StoreError::TooNew { path: path.to_owned(), found, known });
        }
        for migration in migrations.iter().skip(found as usize) {
            tx.execute_batch(migration)?;
        }
        tx.pragma_update(None, "user_version", known)?;
        tx.commit()?;
        Ok(())
    }

    /// A write transaction, begun immediately so that it never fails half-way on a lock.
    /// Unwritten decision records go with it.
    pub fn write(&mut self) -> Result<Transaction<'_>, rusqlite::Error> {
        self.write_recording(&[])
    }

    /// [`Store::write`], with the records of the decisions that the transaction acts on.
    pub fn write_recording(&mut self, records: &[Record]) -> Result<Transaction<'_>, rusqlite::Error> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        self.recorder.flush(&tx);
        for record in records {
            self.recorder.record(&tx, record)?;
        }
        Ok(tx)
    }

    /// Writes the decision records held in memory, if they have waited long enough.
    pub fn flush_records_if_due(&mut self) -> Result<(), rusqlite::Error> {
        if self.recorder.flush_due() {
            self.write()?.commit()?;
        }
        Ok(())
    }

    /// Writes the decision records held in memory (at the end of a run).
    pub fn flush_records(&mut self) -> Result<(), rusqlite::Error> {
        self.write()?.commit()
    }

    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The schema version in force.
    pub fn version(&self) -> Result<i64, rusqlite::Error> {
        user_version(&self.conn)
    }
}

/// How long the integrity check at open may take: a big store is checked as far as this allows
/// (the check is for the damage a crash or a bad disk leaves, not a full audit).
const INTEGRITY_CHECK_BUDGET: Duration = Duration::from_secs(2);

/// `PRAGMA quick_check`, bounded in time: a corrupt store is refused with what was found, before
/// anything is written to it.
fn check_integrity(conn: &mut Connection, path: &str) -> Result<(), StoreError> {
    let deadline = Instant::now() + INTEGRITY_CHECK_BUDGET;
    let open_error = |cause| StoreError::Open { path: path.to_owned(), cause };
    conn.progress_handler(10_000, Some(move || Instant::now() > deadline)).map_err(open_error)?;
    let found: Result<Vec<String>, rusqlite::Error> = conn
        .prepare("PRAGMA quick_check(5)")
        .and_then(|mut statement| statement.query_map([], |row| row.get(0))?.collect());
    conn.progress_handler(0, None::<fn() -> bool>).map_err(open_error)?;
    match found {
        Ok(lines) if lines.iter().all(|line| line == "ok") => Ok(()),
        Ok(lines) => Err(StoreError::Corrupt { path: path.to_owned(), detail: lines.join("; ") }),
        // Out of time: a store too big to check at open is taken as it is.
        Err(err) if err.sqlite_error_code() == Some(ErrorCode::OperationInterrupted) => {
            tracing::warn!("state database {path}: its integrity check was cut short after {INTEGRITY_CHECK_BUDGET:?}");
            Ok(())
        }
        Err(err) if matches!(err.sqlite_error_code(), Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)) => {
            Err(StoreError::Corrupt { path: path.to_owned(), detail: err.to_string() })
        }
        Err(cause) => Err(StoreError::Open { path: path.to_owned(), cause }),
    }
}

/// The store's identity (see [`STORE_ID_MIGRATION`]), if its schema has one.
pub fn store_id(conn: &Connection) -> Result<Option<String>, rusqlite::Error> {
    let has_meta: bool =
        conn.query_row("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |r| {
            r.get(0)
        })?;
    if !has_meta {
        return Ok(None);
    }
    conn.query_row("SELECT value FROM meta WHERE key = 'store_id'", [], |r| r.get(0)).optional()
}

/// The schema version a database is at.
fn user_version(conn: &Connection) -> Result<i64, rusqlite::Error> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_opened_by_many_at_once_is_migrated_once() {
        // `perennial status` polling while `perennial run` creates its state: each opener finds
        // the database new, and only one may migrate it ("table already exists" before).
        for _ in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("state.db");
            let start = std::sync::Barrier::new(6);
            let opened: Vec<Result<i64, String>> = std::thread::scope(|scope| {
                let openers: Vec<_> = (0..6)
                    .map(|_| {
                        scope.spawn(|| {
                            start.wait();
                            let store = Store::open(&path).map_err(|err| err.to_string())?;
                            store.version().map_err(|err| err.to_string())
                        })
                    })
                    .collect();
                openers.into_iter().map(|opener| opener.join().unwrap()).collect()
            });
            for result in opened {
                assert_eq!(result, Ok(MIGRATIONS.len() as i64));
            }
        }
    }

    #[test]
    fn opens_in_wal_with_full_sync_and_migrates_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).unwrap();
        assert_eq!(store.version().unwrap(), MIGRATIONS.len() as i64);
        let mode: String = store.conn().pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = store.conn().pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap();
        assert_eq!(sync, 2, "FULL");
        drop(store);
        // Reopening keeps the data and runs no migration twice.
        let store = Store::open(&path).unwrap();
        assert_eq!(store.version().unwrap(), MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_corrupt_database_is_refused_naming_its_file_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.db");
        let store = Store::open(&path).unwrap();
        let rows: String = (0..2000).map(|i| format!("('j{i}', 'u', '{{}}'),")).collect();
        store
            .conn()
            .execute_batch(&format!("INSERT INTO jobs (name, uid, spec) VALUES {} ('last', 'u', '{{}}')", rows))
            .unwrap();
        store.conn().pragma_update(None, "wal_checkpoint", "TRUNCATE").unwrap();
        drop(store);
        // A page of the jobs table overwritten (a bad disk, a copy cut short).
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 5 * 4096, "{} bytes", bytes.len());
        bytes[3 * 4096..4 * 4096].fill(0x5a);
        std::fs::write(&path, &bytes).unwrap();
        let err = Store::open(&path).err().expect("refused").to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains("is corrupt"), "{err}");
        assert!(err.contains("backup"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "the refused store was written to");

        // Not a database at all.
        std::fs::write(&path, b"this is not a database, only a file with some text in it").unwrap();
        let err = Store::open(&path).err().expect("refused").to_string();
        assert!(err.contains("is corrupt") && err.contains("not a database"), "{err}");
    }

    #[test]
    fn a_folder_or_a_device_where_the_store_is_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("edge.db");
        std::fs::create_dir(&folder).unwrap();
        let err = Store::open(&folder).err().expect("refused").to_string();
        assert!(err.contains("is a folder, not a database file"), "{err}");
        let err = Store::open(Path::new("/dev/null")).err().expect("refused").to_string();
        assert!(err.contains("/dev/null is a FIFO, socket or device"), "{err}");
        assert!(!Path::new("/dev/null-journal").exists() && !Path::new("/dev/null-wal").exists());
    }

    #[test]
    fn a_newer_database_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).unwrap();
        store.conn().pragma_update(None, "user_version", 99).unwrap();
        drop(store);
        let err = Store::open(&path).err().unwrap().to_string();
        assert!(err.contains("has schema version 99, newer than this binary's"), "{err}");
    }
}
