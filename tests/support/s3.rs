//! A real S3 protocol server (s3s + s3s-fs) on 127.0.0.1, started by the tests themselves.
//! Shared by several test binaries; each uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use perennial_storage::S3Credentials;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub const ACCESS_KEY: &str = "perennial-test-access";
pub const SECRET_KEY: &str = "perennial-test-secret";

pub struct S3Server {
    pub address: SocketAddr,
    /// Each folder here is a bucket.
    pub root: tempfile::TempDir,
    access_key: &'static str,
    secret_key: &'static str,
    task: tokio::task::JoinHandle<()>,
}

impl S3Server {
    /// Starts a server on an ephemeral port of 127.0.0.1, on the current tokio runtime.
    pub async fn start() -> S3Server {
        S3Server::start_with_keys(ACCESS_KEY, SECRET_KEY).await
    }

    /// The same, accepting only the given keys (a second owner's server).
    pub async fn start_with_keys(access_key: &'static str, secret_key: &'static str) -> S3Server {
        let root = tempfile::tempdir().expect("temp dir");
        let fs = s3s_fs::FileSystem::new(root.path()).expect("s3s-fs over the temp dir");
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(access_key, secret_key));
        let service = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let address = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            while let Ok((socket, _)) = listener.accept().await {
                let connection = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
        });
        S3Server { address, root, access_key, secret_key, task }
    }

    pub fn credentials(&self) -> S3Credentials {
        S3Credentials {
            endpoint: self.address.to_string(),
            use_https: false,
            access_key_id: self.access_key.into(),
            secret_access_key: self.secret_key.into(),
        }
    }

    /// Creates `bucket` and writes `key` into it.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> PathBuf {
        let path = self.root.path().join(bucket).join(key);
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/"))).expect("bucket folder");
        std::fs::write(&path, bytes).expect("write object");
        path
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
