//! The link's test parts: a CA made here, and a cloud side applying reports to its own SQLite
//! file (the operator keeps them in job status).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use perennial_link::cloud_server::{Applied, CloudSide, NodeDesired};
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
/// one SQLite file (the operator keeps them in job status).
pub struct TestCloud {
    path: PathBuf,
    pub desired: watch::Sender<Arc<NodeDesired>>,
}

impl TestCloud {
    pub fn new(path: &Path, desired: NodeDesired) -> TestCloud {
        let conn = rusqlite::Connection::open(path).expect("cloud db");
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS applied (node TEXT, seq INTEGER, body TEXT, PRIMARY KEY (node, seq));
             CREATE TABLE IF NOT EXISTS watermark (node TEXT PRIMARY KEY, seq INTEGER);",
        )
        .expect("schema");
        TestCloud { path: path.to_owned(), desired: watch::channel(Arc::new(desired)).0 }
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

    fn desired(&self, _node: &str) -> watch::Receiver<Arc<NodeDesired>> {
        self.desired.subscribe()
    }
}
