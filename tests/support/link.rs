//! The link's test parts: a CA made here, and a cloud side applying reports to its own SQLite
//! file (the operator keeps them in job status) and serving artifacts from memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use perennial_link::PolicyPlatform;
use perennial_link::cloud_server::{Applied, ArtifactPiece, CloudSide, NodeDesired};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use tokio::sync::watch;

pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA, and a certificate it signed for localhost and 127.0.0.1.
pub fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("CA");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("params");
    let cert = params.signed_by(&key, &ca).expect("certificate");
    Pki { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
}

/// The cloud's durable side for the tests: every applied report, and each node's watermark, in
/// one SQLite file (the operator keeps them in job status); and the artifacts it serves, with
/// what was asked of it.
pub struct TestCloud {
    path: PathBuf,
    pub desired: watch::Sender<Arc<NodeDesired>>,
    /// The artifacts served, by the sha they are asked for (their bytes need not have it).
    pub artifacts: Mutex<HashMap<String, Vec<u8>>>,
    /// How long each chunk takes to read (a slow store).
    pub artifact_delay: Mutex<Duration>,
    /// Each accepted connection's node and policy platform, in order.
    pub platforms: Mutex<Vec<(String, Option<PolicyPlatform>)>>,
    /// Each chunk asked for: (sha256, offset, bytes served, the connection asking: its index in
    /// `platforms`).
    pub artifact_gets: Mutex<Vec<(String, u64, usize, usize)>>,
    /// How long each report takes to apply (a slow status write).
    pub apply_delay: Mutex<Duration>,
    /// The seqs offered before their turn (`CloudSide::queued`), in order.
    pub offered: Mutex<Vec<u64>>,
    /// Chunks being read now, and the most read at once.
    reading: AtomicUsize,
    pub most_read_at_once: AtomicUsize,
}

impl TestCloud {
    pub fn new(path: &Path, desired: NodeDesired) -> TestCloud {
        let conn = rusqlite::Connection::open(path).expect("cloud db");
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS applied (node TEXT, seq INTEGER, body TEXT, PRIMARY KEY (node, seq));
             CREATE TABLE IF NOT EXISTS watermark (node TEXT PRIMARY KEY, seq INTEGER);",
        )
        .expect("schema");
        TestCloud {
            path: path.to_owned(),
            desired: watch::channel(Arc::new(desired)).0,
            artifacts: Mutex::default(),
            artifact_delay: Mutex::default(),
            platforms: Mutex::default(),
            artifact_gets: Mutex::default(),
            apply_delay: Mutex::default(),
            offered: Mutex::default(),
            reading: AtomicUsize::new(0),
            most_read_at_once: AtomicUsize::new(0),
        }
    }

    pub fn applied(&self) -> Vec<(u64, Value)> {
        let conn = rusqlite::Connection::open(&self.path).expect("cloud db");
        let mut statement = conn.prepare("SELECT seq, body FROM applied ORDER BY rowid").expect("query");
        statement
            .query_map([], |row| Ok((row.get::<_, i64>(0)? as u64, row.get::<_, String>(1)?)))
            .expect("rows")
            .map(|row| {
                let (seq, body) = row.expect("row");
                (seq, serde_json::from_str(&body).expect("json"))
            })
            .collect()
    }
}

impl CloudSide for TestCloud {
    async fn last_applied_report(&self, node: &str) -> Result<u64, String> {
        let conn = rusqlite::Connection::open(&self.path).map_err(|e| e.to_string())?;
        let seq: Option<i64> = conn
            .query_row("SELECT seq FROM watermark WHERE node = ?1", [node], |r| r.get(0))
            .optional()
            .map_err(|e| e.to_string())?;
        Ok(seq.unwrap_or(0) as u64)
    }

    async fn apply(&self, node: &str, seq: u64, body: Value) -> Applied {
        let delay = *self.apply_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let mut conn = rusqlite::Connection::open(&self.path).expect("cloud db");
        let tx = conn.transaction().expect("tx");
        let watermark: i64 =
            tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM watermark WHERE node = ?1", [node], |r| r.get(0)).unwrap();
        if seq as i64 <= watermark {
            return Applied::Applied;
        }
        tx.execute(
            "INSERT INTO applied (node, seq, body) VALUES (?1, ?2, ?3)",
            params![node, seq as i64, body.to_string()],
        )
        .expect("insert");
        tx.execute("INSERT OR REPLACE INTO watermark (node, seq) VALUES (?1, ?2)", params![node, seq as i64])
            .expect("watermark");
        tx.commit().expect("commit");
        Applied::Applied
    }

    fn queued(&self, _node: &str, seq: u64, _body: &Value) {
        self.offered.lock().unwrap().push(seq);
    }

    fn desired(&self, _node: &str) -> watch::Receiver<Arc<NodeDesired>> {
        self.desired.subscribe()
    }

    fn node_platform(&self, node: &str, platform: Option<&PolicyPlatform>) {
        self.platforms.lock().unwrap().push((node.to_owned(), platform.cloned()));
    }

    async fn artifact_chunk(
        &self,
        _node: &str,
        sha256: &str,
        offset: u64,
        max: usize,
    ) -> Result<ArtifactPiece, String> {
        let connection = self.platforms.lock().unwrap().len().saturating_sub(1);
        let delay = *self.artifact_delay.lock().unwrap();
        let now = self.reading.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_read_at_once.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(delay).await;
        self.reading.fetch_sub(1, Ordering::SeqCst);
        let piece = self.artifacts.lock().unwrap().get(sha256).map(|bytes| {
            let from = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
            let to = from.saturating_add(max).min(bytes.len());
            ArtifactPiece { total: bytes.len() as u64, data: bytes[from..to].to_vec() }
        });
        let served = piece.as_ref().map_or(0, |piece| piece.data.len());
        self.artifact_gets.lock().unwrap().push((sha256.to_owned(), offset, served, connection));
        piece.ok_or_else(|| format!("no artifact {sha256} here"))
    }
}
