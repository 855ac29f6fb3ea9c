//! Storage through OpenDAL: a URL becomes an operator and a path.
//!
//! A path without a scheme is the node's filesystem; `s3://bucket/key` is S3 with credentials
//! in Sedna's format; `https://host/path` is read-only HTTP.

use std::path::Path;
use std::time::Duration;

use opendal::{Operator, services};

/// S3 credentials, as Sedna's credential Secret carries them (annotations `s3-endpoint`,
/// `s3-usehttps`; keys `ACCESS_KEY_ID`, `SECRET_ACCESS_KEY`).
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    /// `host[:port]`, no scheme.
    pub endpoint: String,
    pub use_https: bool,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Credentials {
    // Never print the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("endpoint", &self.endpoint)
            .field("use_https", &self.use_https)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl S3Credentials {
    /// From the environment the way Sedna gives it to workers: `S3_ENDPOINT_URL`
    /// (`http(s)://host[:port]`), `ACCESS_KEY_ID`, `SECRET_ACCESS_KEY`. `None` when unset.
    pub fn from_env() -> Option<S3Credentials> {
        S3Credentials::from_env_prefixed("")
    }

    /// As [`from_env`](Self::from_env) with every name prefixed: `"DATASET_"` reads
    /// `DATASET_S3_ENDPOINT_URL`, `DATASET_ACCESS_KEY_ID` and `DATASET_SECRET_ACCESS_KEY`, the
    /// dataset's credential that `perennial fetch` is given beside the job's.
    pub fn from_env_prefixed(prefix: &str) -> Option<S3Credentials> {
        let var = |name: &str| std::env::var(format!("{prefix}{name}"));
        let url = var("S3_ENDPOINT_URL").ok()?;
        let (use_https, endpoint) = match url.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some((_, rest)) => (true, rest),
            None => (true, url.as_str()),
        };
        Some(S3Credentials {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            use_https,
            access_key_id: var("ACCESS_KEY_ID").unwrap_or_default(),
            secret_access_key: var("SECRET_ACCESS_KEY").unwrap_or_default(),
        })
    }

    /// The env Sedna gives a worker that reads or writes S3 (`S3_ENDPOINT_URL`, `ACCESS_KEY_ID`,
    /// `SECRET_ACCESS_KEY`).
    pub fn worker_env(&self) -> Vec<(String, String)> {
        let scheme = if self.use_https { "https" } else { "http" };
        vec![
            ("S3_ENDPOINT_URL".into(), format!("{scheme}://{}", self.endpoint)),
            ("ACCESS_KEY_ID".into(), self.access_key_id.clone()),
            ("SECRET_ACCESS_KEY".into(), self.secret_access_key.clone()),
        ]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{url}: unsupported scheme `{scheme}` (use a path, s3:// or https://)")]
    Scheme { url: String, scheme: String },
    #[error("{url}: {message}")]
    Invalid { url: String, message: String },
    #[error(
        "{url}: S3 needs credentials (a credential Secret, or S3_ENDPOINT_URL, ACCESS_KEY_ID and SECRET_ACCESS_KEY)"
    )]
    NoCredentials { url: String },
    #[error("{url}: {source}")]
    Io { url: String, source: opendal::Error },
    #[error("{url}: {size} bytes, over the {limit}-byte limit")]
    TooLarge { url: String, size: u64, limit: u64 },
    #[error("{url}: not read within {limit:?}")]
    Timeout { url: String, limit: Duration },
}

/// An operator and the path inside it that `url` names.
pub fn locate(url: &str, s3: Option<&S3Credentials>) -> Result<(Operator, String), StorageError> {
    // The HTTP transport (reqwest with rustls) that the S3 and HTTP services use.
    perennial_tls::install_crypto_provider();
    opendal::install_default();
    opendal_http_transport_reqwest::install_default();
    let invalid = |message: &str| StorageError::Invalid { url: url.to_owned(), message: message.to_owned() };
    let io = |source| StorageError::Io { url: url.to_owned(), source };
    match url.split_once("://") {
        None => {
            let op = Operator::new(services::Fs::default().root("/")).map_err(io)?;
            Ok((op, url.to_owned()))
        }
        Some(("file", path)) => {
            if !path.starts_with('/') {
                return Err(invalid("a file:// URL needs an absolute path (file:///path)"));
            }
            let op = Operator::new(services::Fs::default().root("/")).map_err(io)?;
            Ok((op, path.to_owned()))
        }
        Some(("s3", rest)) => {
            let (bucket, key) = rest.split_once('/').ok_or_else(|| invalid("expected s3://bucket/key"))?;
            if bucket.is_empty() || key.is_empty() {
                return Err(invalid("expected s3://bucket/key"));
            }
            Ok((s3_operator(url, bucket, "/", s3)?, key.to_owned()))
        }
        Some(("https", rest)) => {
            let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(invalid("expected https://host/path"));
            }
            let op = Operator::new(services::Http::default().endpoint(&format!("https://{host}"))).map_err(io)?;
            Ok((op, format!("/{path}")))
        }
        Some((scheme, _)) => Err(StorageError::Scheme { url: url.to_owned(), scheme: scheme.to_owned() }),
    }
}

/// An operator on `bucket` of the S3 endpoint in `s3`, rooted at `root` (a key prefix). `url` is
/// only for messages. Credentials come from Sedna's Secret format, never from the environment
/// of the process or instance metadata.
pub fn s3_operator(url: &str, bucket: &str, root: &str, s3: Option<&S3Credentials>) -> Result<Operator, StorageError> {
    perennial_tls::install_crypto_provider();
    opendal::install_default();
    opendal_http_transport_reqwest::install_default();
    let creds = s3.ok_or_else(|| StorageError::NoCredentials { url: url.to_owned() })?;
    let scheme = if creds.use_https { "https" } else { "http" };
    let builder = services::S3::default()
        .bucket(bucket)
        .root(root)
        .endpoint(&format!("{scheme}://{}", creds.endpoint))
        .region("us-east-1")
        .access_key_id(&creds.access_key_id)
        .secret_access_key(&creds.secret_access_key)
        .disable_config_load()
        .disable_ec2_metadata();
    Operator::new(builder).map_err(|source| StorageError::Io { url: url.to_owned(), source })
}

/// How much one read may take, in bytes and in time: every read from outside is bounded.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimit {
    pub max_bytes: u64,
    pub timeout: Duration,
}

impl ReadLimit {
    /// For a whole object of unknown purpose (a model, an input): 4 GiB in 10 minutes.
    pub const DEFAULT: ReadLimit = ReadLimit { max_bytes: 4 << 30, timeout: Duration::from_secs(600) };
}

/// Reads the whole object at `url`, within [`ReadLimit::DEFAULT`].
pub async fn read(url: &str, s3: Option<&S3Credentials>) -> Result<Vec<u8>, StorageError> {
    read_limited(url, s3, ReadLimit::DEFAULT).await
}

/// Reads the whole object at `url`: a local path must be a regular file (never a FIFO, a device
/// or a folder, which could block or never end), and the object at most `limit.max_bytes`, read
/// within `limit.timeout`.
pub async fn read_limited(url: &str, s3: Option<&S3Credentials>, limit: ReadLimit) -> Result<Vec<u8>, StorageError> {
    let (op, path) = locate(url, s3)?;
    let too_large = |size: u64| StorageError::TooLarge { url: url.to_owned(), size, limit: limit.max_bytes };
    let io = |source| StorageError::Io { url: url.to_owned(), source };
    let read = async {
        let size = if !url.contains("://") || url.starts_with("file://") {
            // The checks only: the bytes are read through the operator, to the size stated.
            let (_, size) = open_regular(url, Path::new(&path), limit.max_bytes)?;
            size
        } else {
            op.stat(&path).await.map_err(io)?.content_length()
        };
        if size > limit.max_bytes {
            return Err(too_large(size));
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        // Exactly the size stated: a file that grows meanwhile (or a server that lies) cannot
        // make the read longer.
        let buffer = op.read_with(&path).range(0..size).await.map_err(io)?;
        Ok(buffer.to_vec())
    };
    tokio::time::timeout(limit.timeout, read)
        .await
        .map_err(|_| StorageError::Timeout { url: url.to_owned(), limit: limit.timeout })?
}

/// Opens the local file at `path` (links followed) to read it whole, within bounds: a regular
/// file, never a FIFO (a writer may never come), a device (a link to /dev/zero never ends) or a
/// folder; never a file of procfs, sysfs or another kernel filesystem (their stated size is not
/// what a read gives); at most `max_bytes`. Returns the file and its size. Errors name `url`,
/// the file as given.
pub fn open_regular(url: &str, path: &Path, max_bytes: u64) -> Result<(std::fs::File, u64), StorageError> {
    use std::os::unix::fs::OpenOptionsExt;

    let invalid = |message: String| StorageError::Invalid { url: url.to_owned(), message };
    // Looked at before the open too: opening a device can act on it (a tape rewinds).
    let metadata = std::fs::metadata(path).map_err(|err| invalid(err.to_string()))?;
    refuse_unless_regular(url, &metadata)?;
    // O_NONBLOCK: a file swapped for a FIFO meanwhile cannot make the open wait for a writer
    // (it has no effect on a regular file's reads).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|err| invalid(err.to_string()))?;
    // What was opened is what counts: the path may have changed since the look above.
    let metadata = file.metadata().map_err(|err| invalid(err.to_string()))?;
    refuse_unless_regular(url, &metadata)?;
    if let Some(kind) = perennial_types::files::kernel_filesystem_of(&file) {
        return Err(invalid(format!("a file of {kind}, whose size says nothing of its content")));
    }
    let size = metadata.len();
    if size > max_bytes {
        return Err(StorageError::TooLarge { url: url.to_owned(), size, limit: max_bytes });
    }
    Ok((file, size))
}

fn refuse_unless_regular(url: &str, metadata: &std::fs::Metadata) -> Result<(), StorageError> {
    if metadata.is_file() {
        return Ok(());
    }
    let kind = if metadata.is_dir() { "a folder" } else { "not a regular file (a FIFO, a device or a socket?)" };
    Err(StorageError::Invalid { url: url.to_owned(), message: kind.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_a_local_file_by_path_and_file_url() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.bin");
        std::fs::write(&file, b"hello").unwrap();
        let path = file.to_str().unwrap();
        assert_eq!(read(path, None).await.unwrap(), b"hello");
        assert_eq!(read(&format!("file://{path}"), None).await.unwrap(), b"hello");
        let missing = read(&format!("{path}.nope"), None).await.unwrap_err().to_string();
        assert!(missing.starts_with(&format!("{path}.nope: ")), "{missing}");
    }

    /// What could block or never end is refused before a byte is read: a FIFO (a writer may
    /// never come), a device (a link to /dev/zero never ends), a folder; and what is too big.
    #[tokio::test]
    async fn reads_are_bounded_to_regular_files_of_a_size() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.pkl");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let zero = dir.path().join("zero.wasm");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let started = std::time::Instant::now();
        for path in [&fifo, &zero] {
            let err = read(path.to_str().unwrap(), None).await.unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
        let err = read(dir.path().to_str().unwrap(), None).await.unwrap_err().to_string();
        assert!(err.ends_with(": a folder"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "refused at once");

        let big = dir.path().join("big.bin");
        std::fs::write(&big, vec![7u8; 1000]).unwrap();
        let limit = ReadLimit { max_bytes: 999, timeout: Duration::from_secs(5) };
        let err = read_limited(big.to_str().unwrap(), None, limit).await.unwrap_err().to_string();
        assert!(err.ends_with("1000 bytes, over the 999-byte limit"), "{err}");
        let fits = ReadLimit { max_bytes: 1000, ..limit };
        assert_eq!(read_limited(big.to_str().unwrap(), None, fits).await.unwrap().len(), 1000);
    }

    /// A file of procfs or sysfs states a size that says nothing of what a read gives (0 for
    /// /proc/self/status): it is refused, by name.
    #[cfg(target_os = "linux")]
    #[test]
    fn files_of_procfs_and_sysfs_are_refused() {
        let err = open_regular("/proc/self/status", Path::new("/proc/self/status"), 1 << 20).unwrap_err().to_string();
        assert!(err.starts_with("/proc/self/status: a file of procfs"), "{err}");
        let sys = "/sys/kernel/uevent_seqnum";
        if Path::new(sys).exists() {
            let err = open_regular(sys, Path::new(sys), 1 << 20).unwrap_err().to_string();
            assert!(err.starts_with("/sys/kernel/uevent_seqnum: a file of sysfs"), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.pkl");
        std::fs::write(&file, b"model").unwrap();
        let (_, size) = open_regular("model.pkl", &file, 5).unwrap();
        assert_eq!(size, 5);
    }

    #[test]
    fn bad_urls_are_named() {
        let err = locate("ftp://x/y", None).unwrap_err().to_string();
        assert_eq!(err, "ftp://x/y: unsupported scheme `ftp` (use a path, s3:// or https://)");
        assert!(locate("s3://bucket-only", None).unwrap_err().to_string().contains("expected s3://bucket/key"));
        assert!(locate("s3://b/k", None).unwrap_err().to_string().contains("needs credentials"));
        assert!(locate("file://relative", None).is_err());
    }

    #[test]
    fn credentials_never_print_the_secret() {
        let creds = S3Credentials {
            endpoint: "127.0.0.1:9000".into(),
            use_https: false,
            access_key_id: "AK".into(),
            secret_access_key: "very-secret".into(),
        };
        assert!(!format!("{creds:?}").contains("very-secret"));
    }
}
