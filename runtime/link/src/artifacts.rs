//! The edge's artifact downloads: files the operator prepared for this node (policies compiled
//! for its platform, a few KB to ~25 MB), each named by the hex SHA-256 of its bytes, fetched
//! over the link in chunks, resumed after a cut (or a restart of the agent), and verified by
//! their digest. What an artifact means, and its signature, are the caller's; this moves bytes.
//!
//! On disk, in the downloads directory: `<sha256>.bin` for a complete artifact (its digest is
//! checked again on every read: a file altered on disk is deleted and fetched again) and
//! `<sha256>.part` for one in progress (its length is where the next request starts, also after
//! a restart of the agent).
//!
//! [`Downloads::get`] queues a download, or joins the one in progress, and waits for it. The
//! link's session drives them (one chunk in flight per download): it writes each queued request
//! as an `artifactGet`, hands every `artifactChunk` and `artifactMissing` back here, and says
//! when it connects (every download in progress is asked again from its file's length) and
//! disconnects. A download outlives a `get` that stopped waiting: a later `get` joins it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, oneshot};

use super::messages::{ARTIFACT_CHUNK_BYTES, check_sha256};

/// Why an artifact was not had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DownloadError {
    /// The operator answered that it cannot send it.
    #[error("artifact {sha256}: the operator cannot send it: {reason}")]
    Missing { sha256: String, reason: String },
    /// The bytes received are another artifact's (nothing of them is kept).
    #[error("artifact {expected}: the bytes received have SHA-256 {actual} instead; they were discarded")]
    Digest { expected: String, actual: String },
    #[error("artifact {sha256} is {total} bytes, over the {size} bytes expected of it")]
    TooLarge { sha256: String, total: u64, size: u64 },
    /// The wait ended first; the download goes on, and a later `get` joins it.
    #[error("artifact {sha256} not received in {waited:?}: is the link to the operator up?")]
    Timeout { sha256: String, waited: Duration },
    #[error("artifact {sha256}: {message}")]
    Io { sha256: String, message: String },
    /// The operator's answers broke the protocol (or the name asked for is no digest).
    #[error("artifact {sha256}: {message}")]
    Protocol { sha256: String, message: String },
}

/// What the link's session asks the operator for next: `sha256` from byte `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ArtifactRequest {
    pub sha256: String,
    pub offset: u64,
}

type Outcome = Result<Arc<Vec<u8>>, DownloadError>;

/// A `get` waiting for a download, and the most it accepts.
struct Waiter {
    size: u64,
    done: oneshot::Sender<Outcome>,
}

struct Download {
    /// The bytes in its `.part` file.
    have: u64,
    /// The most any of its waiters accepts.
    size: u64,
    /// The artifact's length, once a chunk said it.
    total: Option<u64>,
    /// The offset asked for in this session (queued or sent) and not answered yet.
    asked: Option<u64>,
    waiters: Vec<Waiter>,
}

#[derive(Default)]
struct State {
    downloads: HashMap<String, Download>,
    /// Requests for the session to write, in order.
    requests: VecDeque<ArtifactRequest>,
    /// Whether a session that fetches artifacts is up.
    connected: bool,
    /// The shas whose `.bin` was found altered (said once each).
    warned: HashSet<String>,
}

/// The node's artifact downloads, in one directory. Shared by the callers of [`Downloads::get`]
/// and by the one link session that fetches them.
pub struct Downloads {
    dir: PathBuf,
    state: Mutex<State>,
    requested: Notify,
}

/// What reading a complete artifact found.
enum Stored {
    Absent,
    Good(Vec<u8>),
    /// Deleted, for this reason.
    Bad(String),
}

impl Downloads {
    /// Downloads into `dir` (created if need be).
    pub fn new(dir: PathBuf) -> std::io::Result<Arc<Downloads>> {
        std::fs::create_dir_all(&dir)?;
        Ok(Arc::new(Downloads { dir, state: Mutex::default(), requested: Notify::new() }))
    }

    /// The directory the artifacts are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The artifact `sha256` (64 lower-case hex digits), at most `size` bytes: from the disk if
    /// it is there and intact, else fetched over the link (waiting at most `wait` for it).
    pub async fn get(&self, sha256: &str, size: u64, wait: Duration) -> Result<Vec<u8>, DownloadError> {
        check_sha256(sha256)
            .map_err(|message| DownloadError::Protocol { sha256: sha256.chars().take(80).collect(), message })?;
        let done = match self.join(sha256, size)? {
            Some(done) => done,
            None => {
                if let Some(bytes) = self.read_complete(sha256, size).await? {
                    return Ok(bytes);
                }
                let have = self.part_length(sha256, size).await?;
                self.start(sha256, size, have)?
            }
        };
        match tokio::time::timeout(wait, done).await {
            Ok(Ok(outcome)) => outcome.map(Arc::unwrap_or_clone),
            Ok(Err(_)) => Err(DownloadError::Protocol {
                sha256: sha256.to_owned(),
                message: "the download ended without an outcome".into(),
            }),
            Err(_) => Err(DownloadError::Timeout { sha256: sha256.to_owned(), waited: wait }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn path(&self, sha256: &str, extension: &str) -> PathBuf {
        self.dir.join(format!("{sha256}.{extension}"))
    }

    /// Joins the download of `sha256` in progress, if there is one.
    fn join(&self, sha256: &str, size: u64) -> Result<Option<oneshot::Receiver<Outcome>>, DownloadError> {
        let mut state = self.lock();
        let Some(download) = state.downloads.get_mut(sha256) else { return Ok(None) };
        if let Some(total) = download.total.filter(|total| *total > size) {
            return Err(DownloadError::TooLarge { sha256: sha256.to_owned(), total, size });
        }
        Ok(Some(download.wait(size)))
    }

    /// Starts the download of `sha256` from `have` bytes (or joins one started meanwhile).
    fn start(&self, sha256: &str, size: u64, have: u64) -> Result<oneshot::Receiver<Outcome>, DownloadError> {
        if let Some(done) = self.join(sha256, size)? {
            return Ok(done);
        }
        let mut state = self.lock();
        let mut download = Download { have, size, total: None, asked: None, waiters: Vec::new() };
        let done = download.wait(size);
        if state.connected {
            download.asked = Some(have);
            state.requests.push_back(ArtifactRequest { sha256: sha256.to_owned(), offset: have });
            self.requested.notify_one();
        }
        state.downloads.insert(sha256.to_owned(), download);
        Ok(done)
    }

    /// The complete artifact on disk, if it is there, no larger than `size` and its digest is
    /// `sha256`; else it is deleted (said once per sha) and `None`.
    async fn read_complete(&self, sha256: &str, size: u64) -> Result<Option<Vec<u8>>, DownloadError> {
        let path = self.path(sha256, "bin");
        let (at, expected) = (path.clone(), sha256.to_owned());
        let stored = blocking(sha256, move || {
            let file = match std::fs::File::open(&at) {
                Ok(file) => file,
                Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Stored::Absent),
                Err(err) => return Err(format!("{}: {err}", at.display())),
            };
            let mut bytes = Vec::new();
            file.take(size.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(|err| format!("{}: {err}", at.display()))?;
            let why = if bytes.len() as u64 > size {
                format!("it is over the {size} bytes expected")
            } else {
                let actual = hex(&Sha256::digest(&bytes));
                if actual == expected {
                    return Ok(Stored::Good(bytes));
                }
                format!("its SHA-256 is now {actual}")
            };
            match std::fs::remove_file(&at) {
                Ok(()) => Ok(Stored::Bad(why)),
                Err(err) if err.kind() == ErrorKind::NotFound => Ok(Stored::Bad(why)),
                Err(err) => Err(format!("{} ({why}) cannot be deleted: {err}", at.display())),
            }
        })
        .await?;
        match stored {
            Stored::Absent => Ok(None),
            Stored::Good(bytes) => Ok(Some(bytes)),
            Stored::Bad(why) => {
                if self.lock().warned.insert(sha256.to_owned()) {
                    tracing::warn!(
                        sha256,
                        path = %path.display(),
                        "a downloaded artifact changed on disk ({why}): deleted, and fetched again"
                    );
                }
                Ok(None)
            }
        }
    }

    /// The length of the `.part` of `sha256` (0 if none). One over `size` is deleted: it cannot
    /// become what is asked for.
    async fn part_length(&self, sha256: &str, size: u64) -> Result<u64, DownloadError> {
        let path = self.path(sha256, "part");
        let io = |err: std::io::Error| DownloadError::Io {
            sha256: sha256.to_owned(),
            message: format!("{}: {err}", path.display()),
        };
        match tokio::fs::metadata(&path).await {
            Ok(meta) if meta.len() <= size => Ok(meta.len()),
            Ok(_) => {
                tokio::fs::remove_file(&path).await.map_err(io)?;
                Ok(0)
            }
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(0),
            Err(err) => Err(io(err)),
        }
    }

    /// The session's next request to write; waits until there is one.
    pub(crate) async fn next_request(&self) -> ArtifactRequest {
        loop {
            // Made before looking, so that a request queued meanwhile wakes it.
            let queued = self.requested.notified();
            if let Some(request) = self.lock().requests.pop_front() {
                return request;
            }
            queued.await;
        }
    }

    /// A session that fetches artifacts is up: every download in progress is asked from its
    /// file's length.
    pub(crate) fn connected(&self) {
        let mut state = self.lock();
        let state = &mut *state;
        state.connected = true;
        state.requests.clear();
        for (sha256, download) in &mut state.downloads {
            download.asked = Some(download.have);
            state.requests.push_back(ArtifactRequest { sha256: sha256.clone(), offset: download.have });
        }
        if !state.requests.is_empty() {
            self.requested.notify_one();
        }
    }

    /// The session ended: what was asked in it will not be answered.
    pub(crate) fn disconnected(&self) {
        let mut state = self.lock();
        state.connected = false;
        state.requests.clear();
        for download in state.downloads.values_mut() {
            download.asked = None;
        }
    }

    /// The operator's `artifactMissing`: the download fails with its reason (and its partial
    /// file goes: it could not be finished).
    pub(crate) async fn missing(&self, sha256: &str, reason: &str) {
        if !self.lock().downloads.contains_key(sha256) {
            return not_fetching(sha256, "artifactMissing");
        }
        self.fail(sha256, DownloadError::Missing { sha256: sha256.to_owned(), reason: reason.to_owned() }).await;
    }

    /// The operator's `artifactChunk`: written to the download's file, then the next chunk is
    /// asked for, or the download is verified and completed. A chunk that breaks the protocol
    /// fails its download (not the link).
    pub(crate) async fn chunk(&self, sha256: &str, offset: u64, total: u64, data: &str) {
        let decoded = base64::engine::general_purpose::STANDARD.decode(data);
        let checked = {
            let mut state = self.lock();
            let Some(download) = state.downloads.get_mut(sha256) else {
                return not_fetching(sha256, "artifactChunk");
            };
            download.check(sha256, offset, total, decoded)
        };
        let bytes = match checked {
            Ok(bytes) => bytes,
            Err(err) => return self.fail(sha256, err).await,
        };
        let part = self.path(sha256, "part");
        let have = offset + bytes.len() as u64;
        if let Err(err) = blocking(sha256, move || append(&part, offset, &bytes)).await {
            return self.fail(sha256, err).await;
        }
        if have < total {
            let mut state = self.lock();
            let state = &mut *state;
            if let Some(download) = state.downloads.get_mut(sha256) {
                download.have = have;
                if state.connected {
                    download.asked = Some(have);
                    state.requests.push_back(ArtifactRequest { sha256: sha256.to_owned(), offset: have });
                    self.requested.notify_one();
                }
            }
            return;
        }
        match self.finish(sha256, total).await {
            Ok(bytes) => {
                let Some(download) = self.lock().downloads.remove(sha256) else { return };
                tracing::info!(sha256, bytes = total, "artifact downloaded");
                let bytes = Arc::new(bytes);
                for waiter in download.waiters {
                    let outcome = if total > waiter.size {
                        Err(DownloadError::TooLarge { sha256: sha256.to_owned(), total, size: waiter.size })
                    } else {
                        Ok(bytes.clone())
                    };
                    let _ = waiter.done.send(outcome);
                }
            }
            Err(err) => self.fail(sha256, err).await,
        }
    }

    /// Syncs the complete `.part`, checks its digest and renames it to `.bin`; its bytes. A
    /// digest other than `sha256` deletes it.
    async fn finish(&self, sha256: &str, total: u64) -> Result<Vec<u8>, DownloadError> {
        let (part, bin, dir, expected) =
            (self.path(sha256, "part"), self.path(sha256, "bin"), self.dir.clone(), sha256.to_owned());
        // Inside: the bytes, or the digest they have instead; outside: an I/O error.
        let read = blocking(sha256, move || {
            let shown = |err: std::io::Error| format!("{}: {err}", part.display());
            let file = std::fs::File::open(&part).map_err(shown)?;
            file.sync_all().map_err(shown)?;
            let mut bytes = Vec::new();
            file.take(total.saturating_add(1)).read_to_end(&mut bytes).map_err(shown)?;
            if bytes.len() as u64 != total {
                return Err(format!("{} holds {} bytes, not the {total} received", part.display(), bytes.len()));
            }
            let actual = hex(&Sha256::digest(&bytes));
            if actual != expected {
                return Ok(Err(actual));
            }
            std::fs::rename(&part, &bin).map_err(|err| format!("{} → {}: {err}", part.display(), bin.display()))?;
            std::fs::File::open(&dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|err| format!("{}: {err}", dir.display()))?;
            Ok(Ok(bytes))
        })
        .await?;
        read.map_err(|actual| DownloadError::Digest { expected: sha256.to_owned(), actual })
    }

    /// Ends the download of `sha256` with `err`: its partial file is deleted and every waiter
    /// told (a later `get` starts over).
    async fn fail(&self, sha256: &str, err: DownloadError) {
        let Some(download) = self.lock().downloads.remove(sha256) else { return };
        tracing::warn!(sha256, "artifact download failed: {err}");
        let part = self.path(sha256, "part");
        match tokio::fs::remove_file(&part).await {
            Ok(()) => {}
            Err(gone) if gone.kind() == ErrorKind::NotFound => {}
            Err(left) => tracing::warn!(sha256, "{} cannot be deleted: {left}", part.display()),
        }
        for waiter in download.waiters {
            let told = match &err {
                DownloadError::TooLarge { sha256, total, .. } => {
                    DownloadError::TooLarge { sha256: sha256.clone(), total: *total, size: waiter.size }
                }
                other => other.clone(),
            };
            let _ = waiter.done.send(Err(told));
        }
    }
}

impl Download {
    /// A new waiter (the ones that stopped waiting are dropped).
    fn wait(&mut self, size: u64) -> oneshot::Receiver<Outcome> {
        let (done, outcome) = oneshot::channel();
        self.waiters.retain(|waiter| !waiter.done.is_closed());
        self.waiters.push(Waiter { size, done });
        self.size = self.size.max(size);
        outcome
    }

    /// Whether a chunk is the answer to what was asked, and fits: its bytes.
    fn check(
        &mut self,
        sha256: &str,
        offset: u64,
        total: u64,
        decoded: Result<Vec<u8>, base64::DecodeError>,
    ) -> Result<Vec<u8>, DownloadError> {
        let protocol = |message: String| DownloadError::Protocol { sha256: sha256.to_owned(), message };
        match self.asked {
            Some(asked) if asked == offset => {}
            Some(asked) => {
                return Err(protocol(format!(
                    "the operator sent bytes from offset {offset} where {asked} was asked for"
                )));
            }
            None => {
                return Err(protocol(format!(
                    "the operator sent bytes from offset {offset}, which were not asked for"
                )));
            }
        }
        if let Some(known) = self.total.filter(|known| *known != total) {
            return Err(protocol(format!("its length changed from {known} to {total} bytes mid-download")));
        }
        if total > self.size {
            return Err(DownloadError::TooLarge { sha256: sha256.to_owned(), total, size: self.size });
        }
        let bytes = decoded.map_err(|err| protocol(format!("a chunk's data is not base64: {err}")))?;
        let end = offset.checked_add(bytes.len() as u64).filter(|end| *end <= total);
        if bytes.len() > ARTIFACT_CHUNK_BYTES || end.is_none() {
            return Err(protocol(format!(
                "a chunk of {} bytes from offset {offset} does not fit its length of {total} bytes \
                 (or the {ARTIFACT_CHUNK_BYTES}-byte chunk limit)",
                bytes.len()
            )));
        }
        if bytes.is_empty() && offset < total {
            return Err(protocol(format!("an empty chunk at offset {offset} of {total} bytes")));
        }
        self.total = Some(total);
        self.asked = None;
        Ok(bytes)
    }
}

/// An answer for no download: one that ended meanwhile (ignored), or a name that is no digest
/// (the operator broke the protocol: said, and ignored).
fn not_fetching(sha256: &str, kind: &str) {
    match check_sha256(sha256) {
        Ok(()) => tracing::debug!(sha256, "an {kind} frame for an artifact this node is not fetching: ignored"),
        Err(err) => tracing::warn!("the operator sent an {kind} frame for {err}: ignored"),
    }
}

/// Appends `bytes` to the partial file `part`, which must hold `offset` bytes.
fn append(part: &Path, offset: u64, bytes: &[u8]) -> Result<(), String> {
    let shown = |err: std::io::Error| format!("{}: {err}", part.display());
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(part).map_err(shown)?;
    let length = file.metadata().map_err(shown)?.len();
    if length != offset {
        return Err(format!("{} holds {length} bytes where {offset} were expected", part.display()));
    }
    file.write_all(bytes).map_err(shown)
}

/// Runs file work off the async threads; its error (a message naming the file) is an I/O error
/// of the artifact.
async fn blocking<T: Send + 'static>(
    sha256: &str,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, DownloadError> {
    let io = |message: String| DownloadError::Io { sha256: sha256.to_owned(), message };
    tokio::task::spawn_blocking(work).await.map_err(|err| io(err.to_string()))?.map_err(io)
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The SHA-256 of `bytes`, as artifacts are named.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// `len` bytes that are not all alike, and their name.
    fn artifact(len: usize, seed: u8) -> (String, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        (sha256_hex(&bytes), bytes)
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A `get` running beside the test, which plays the operator.
    fn get(
        downloads: &Arc<Downloads>,
        sha256: &str,
        size: u64,
    ) -> tokio::task::JoinHandle<Result<Vec<u8>, DownloadError>> {
        let (downloads, sha256) = (downloads.clone(), sha256.to_owned());
        tokio::spawn(async move { downloads.get(&sha256, size, WAIT).await })
    }

    async fn next(downloads: &Downloads) -> ArtifactRequest {
        tokio::time::timeout(WAIT, downloads.next_request()).await.expect("a request for the operator")
    }

    /// Answers the next request as the operator would, from `bytes`, `chunk` bytes at a time.
    async fn answer(downloads: &Downloads, bytes: &[u8], chunk: usize) -> ArtifactRequest {
        let request = next(downloads).await;
        let from = request.offset as usize;
        let to = (from + chunk).min(bytes.len());
        downloads.chunk(&request.sha256, request.offset, bytes.len() as u64, &STANDARD.encode(&bytes[from..to])).await;
        request
    }

    async fn no_request(downloads: &Downloads) {
        let asked = tokio::time::timeout(Duration::from_millis(100), downloads.next_request()).await;
        assert!(asked.is_err(), "nothing should be asked of the operator: {asked:?}");
    }

    #[tokio::test]
    async fn an_artifact_arrives_in_chunks_and_is_then_read_from_the_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let downloads = Downloads::new(dir.path().join("artifacts")).expect("downloads");
        downloads.connected();
        let (sha, bytes) = artifact(2500, 1);
        let got = get(&downloads, &sha, 4096);
        for offset in [0, 1000, 2000] {
            assert_eq!(answer(&downloads, &bytes, 1000).await.offset, offset, "one chunk at a time, in order");
        }
        assert_eq!(got.await.expect("join").expect("downloaded"), bytes);
        assert_eq!(files(downloads.dir()), [format!("{sha}.bin")]);
        // Read again from the disk, checked, without asking the operator.
        assert_eq!(downloads.get(&sha, 4096, WAIT).await.expect("from disk"), bytes);
        no_request(&downloads).await;
    }

    #[tokio::test]
    async fn a_complete_file_altered_on_disk_is_refused_deleted_and_fetched_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let downloads = Downloads::new(dir.path().to_owned()).expect("downloads");
        downloads.connected();
        let (sha, bytes) = artifact(3000, 2);
        let bin = dir.path().join(format!("{sha}.bin"));
        std::fs::write(&bin, &bytes).expect("write");
        assert_eq!(downloads.get(&sha, 3000, WAIT).await.expect("from disk"), bytes);
        no_request(&downloads).await;
        // One byte changes on disk: the next read refuses it, deletes it and fetches it again.
        let mut altered = bytes.clone();
        altered[1234] ^= 0x40;
        std::fs::write(&bin, &altered).expect("alter");
        let got = get(&downloads, &sha, 3000);
        let request = next(&downloads).await;
        assert_eq!((request.sha256.as_str(), request.offset), (sha.as_str(), 0));
        assert!(files(dir.path()).is_empty(), "the altered file is deleted: {:?}", files(dir.path()));
        downloads.chunk(&sha, 0, 3000, &STANDARD.encode(&bytes)).await;
        assert_eq!(got.await.expect("join").expect("fetched again"), bytes);
        assert_eq!(std::fs::read(&bin).expect("read"), bytes);
        // A file over the size asked for is refused alike (it cannot be the artifact asked for).
        std::fs::write(&bin, [bytes.as_slice(), b"more"].concat()).expect("grow");
        let got = get(&downloads, &sha, 3000);
        assert_eq!(next(&downloads).await.offset, 0);
        assert!(!bin.exists(), "the overlong file is deleted");
        downloads.chunk(&sha, 0, 3000, &STANDARD.encode(&bytes)).await;
        assert_eq!(got.await.expect("join").expect("fetched again"), bytes);
    }

    #[tokio::test]
    async fn a_partial_file_resumes_from_its_length_after_a_restart_and_after_a_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sha, bytes) = artifact(5000, 3);
        // A previous run of the agent left 1200 bytes.
        std::fs::write(dir.path().join(format!("{sha}.part")), &bytes[..1200]).expect("part");
        let downloads = Downloads::new(dir.path().to_owned()).expect("downloads");
        let got = get(&downloads, &sha, 5000);
        // Nothing is asked while no session is up; the session asks on connecting.
        no_request(&downloads).await;
        downloads.connected();
        assert_eq!(answer(&downloads, &bytes, 1000).await.offset, 1200);
        // The link is cut with a request in flight; the next session asks from the file's length.
        assert_eq!(next(&downloads).await.offset, 2200);
        downloads.disconnected();
        downloads.connected();
        for offset in [2200, 3200, 4200] {
            assert_eq!(answer(&downloads, &bytes, 1000).await.offset, offset);
        }
        assert_eq!(got.await.expect("join").expect("resumed"), bytes);
        assert_eq!(files(dir.path()), [format!("{sha}.bin")]);
    }

    #[tokio::test]
    async fn concurrent_gets_share_one_download_and_a_wrong_digest_fails_them_all_leaving_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let downloads = Downloads::new(dir.path().to_owned()).expect("downloads");
        downloads.connected();
        let (sha, _) = artifact(4000, 4);
        let (other, wrong) = artifact(4000, 5);
        let (first, second) = (get(&downloads, &sha, 4000), get(&downloads, &sha, 4000));
        while downloads.lock().downloads.get(&sha).map_or(0, |download| download.waiters.len()) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for offset in [0, 2500] {
            assert_eq!(answer(&downloads, &wrong, 2500).await.offset, offset);
        }
        let expected = DownloadError::Digest { expected: sha.clone(), actual: other.clone() };
        assert_eq!(first.await.expect("join"), Err(expected.clone()));
        assert_eq!(second.await.expect("join"), Err(expected.clone()));
        assert_eq!(
            expected.to_string(),
            format!("artifact {sha}: the bytes received have SHA-256 {other} instead; they were discarded")
        );
        assert!(files(dir.path()).is_empty(), "nothing kept: {:?}", files(dir.path()));
        // The next get fetches it again, from the start.
        let again = get(&downloads, &sha, 4000);
        assert_eq!(next(&downloads).await.offset, 0);
        drop(again);
    }

    #[tokio::test]
    async fn an_artifact_over_the_size_asked_for_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let downloads = Downloads::new(dir.path().to_owned()).expect("downloads");
        downloads.connected();
        let (sha, bytes) = artifact(3000, 6);
        let got = get(&downloads, &sha, 1000);
        answer(&downloads, &bytes, 1000).await;
        let err = got.await.expect("join").expect_err("too large");
        assert_eq!(err, DownloadError::TooLarge { sha256: sha.clone(), total: 3000, size: 1000 });
        assert_eq!(err.to_string(), format!("artifact {sha} is 3000 bytes, over the 1000 bytes expected of it"));
        assert!(files(dir.path()).is_empty(), "nothing written: {:?}", files(dir.path()));
    }

    #[tokio::test]
    async fn a_chunk_that_breaks_the_protocol_fails_its_download_and_drops_its_file() {
        let (sha, bytes) = artifact(3000, 7);
        let good = STANDARD.encode(&bytes[1000..2000]);
        // The second answer, after a good first chunk of 1000 bytes: (offset, total, data), said.
        let cases = [
            (1500, 3000, good.clone(), "the operator sent bytes from offset 1500 where 1000 was asked for"),
            (1000, 3000, "not base64!".to_owned(), "a chunk's data is not base64"),
            (1000, 2999, good, "its length changed from 3000 to 2999 bytes mid-download"),
            (
                1000,
                3000,
                STANDARD.encode([0u8; 2500]),
                "a chunk of 2500 bytes from offset 1000 does not fit its length of 3000 bytes",
            ),
            (1000, 3000, String::new(), "an empty chunk at offset 1000 of 3000 bytes"),
        ];
        for (offset, total, data, said) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            let downloads = Downloads::new(dir.path().to_owned()).expect("downloads");
            downloads.connected();
            let got = get(&downloads, &sha, 3000);
            answer(&downloads, &bytes, 1000).await;
            assert_eq!(next(&downloads).await.offset, 1000);
            downloads.chunk(&sha, offset, total, &data).await;
            let err = got.await.expect("join").expect_err(said);
            assert!(matches!(err, DownloadError::Protocol { .. }), "{err:?}");
            assert!(err.to_string().starts_with(&format!("artifact {sha}: ")), "{err}");
            assert!(err.to_string().contains(said), "{err}");
            assert!(files(dir.path()).is_empty(), "{said}: the partial file is dropped");
            // The next get starts over.
            let again = get(&downloads, &sha, 3000);
            answer(&downloads, &bytes, 3000).await;
            assert_eq!(again.await.expect("join").expect("fetched"), bytes);
        }
    }

    #[tokio::test]
    async fn missing_timeout_and_a_bad_name_say_what_happened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let downloads = Downloads::new(dir.path().to_owned()).expect("downloads");
        downloads.connected();
        let (sha, _) = artifact(10, 8);
        let got = get(&downloads, &sha, 10);
        let request = next(&downloads).await;
        downloads.missing(&request.sha256, "no policy compiled for pulley32 has this digest").await;
        let err = got.await.expect("join").expect_err("missing");
        assert_eq!(
            err.to_string(),
            format!("artifact {sha}: the operator cannot send it: no policy compiled for pulley32 has this digest")
        );
        // No session: the wait ends, saying where to look; the download stays queued.
        downloads.disconnected();
        let err = downloads.get(&sha, 10, Duration::from_millis(50)).await.expect_err("timeout");
        assert_eq!(err.to_string(), format!("artifact {sha} not received in 50ms: is the link to the operator up?"));
        downloads.connected();
        assert_eq!(next(&downloads).await.offset, 0);
        let err = downloads.get("../etc/passwd", 10, WAIT).await.expect_err("no digest");
        assert_eq!(
            err.to_string(),
            "artifact ../etc/passwd: `../etc/passwd` is not a SHA-256 digest (64 lower-case hex digits)"
        );
        assert!(files(dir.path()).is_empty());
    }
}
