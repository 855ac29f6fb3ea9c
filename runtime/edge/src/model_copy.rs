//! Deploying a model: the copy of a model a worker reported into the job's output directory,
//! streamed through a fixed buffer (a model may be gigabytes; an edge node's memory is not).
//!
//! The source is a local file inside the job's output or dataset folder, or an object on S3 (or
//! HTTPS). The destination is the local output directory (a temporary file in `.perennial-tmp`,
//! synced, then renamed over the old one: a reader sees the old model or the new one, never part
//! of one) or S3 (a streamed multipart upload, which appears only when complete). Local to local,
//! only the source's data extents are copied: a sparse model stays sparse.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use opendal::{Buffer, Operator, Writer};
use perennial_storage::{ReadLimit, S3Credentials, StorageError};

use crate::output::{TMP_DIR, remote_operator};

/// Largest model the agent copies when deploying.
pub const MAX_MODEL_BYTES: u64 = 4 << 30;

/// A deploy's bounds: at most [`MAX_MODEL_BYTES`], copied within the 10 minutes any whole
/// object gets.
pub const DEPLOY_LIMIT: ReadLimit = ReadLimit { max_bytes: MAX_MODEL_BYTES, ..ReadLimit::DEFAULT };

/// The copy's buffer: what a deploy holds of the model at once (local source or destination).
const BUFFER: usize = 1 << 20;

/// Part size of an upload to S3 (at least S3's 5 MiB minimum part): what the writer holds.
const PART: usize = 8 << 20;

/// How long an interrupted upload gets to be aborted (its parts deleted).
const ABORT_TIME: Duration = Duration::from_secs(30);

/// Copies a model a worker reported to a path inside the job's output directory:
/// `copy(model_url, path_in_output_dir)`, giving the bytes copied.
pub type ModelCopier = Box<dyn Fn(&str, &str) -> Result<u64, String> + Send>;

/// The copier of one job: the models it accepts (local ones inside `roots`: its output directory
/// and dataset folder), where it writes (`output_dir`, a path or `s3://bucket/prefix`), within
/// [`DEPLOY_LIMIT`]. Called from a thread outside the async runtime.
pub fn model_copier(
    runtime: tokio::runtime::Handle,
    s3: Option<S3Credentials>,
    output_dir: String,
    roots: Vec<String>,
) -> ModelCopier {
    let copy = ModelCopy { runtime, s3, output_dir, roots, limit: DEPLOY_LIMIT };
    Box::new(move |model_url, dest| copy.copy(model_url, dest))
}

/// A job's model copy, its parts named (see [`model_copier`]).
pub struct ModelCopy {
    /// Runs the S3 and HTTPS transfers.
    pub runtime: tokio::runtime::Handle,
    pub s3: Option<S3Credentials>,
    /// `spec.outputDir` as this process sees it: a path or `s3://bucket/prefix`.
    pub output_dir: String,
    /// Where a local model must resolve, symlinks followed: a worker cannot make the agent
    /// deploy any other file of the node.
    pub roots: Vec<String>,
    pub limit: ReadLimit,
}

impl ModelCopy {
    /// Copies the model at `model_url` to `dest` inside the output directory; returns its size.
    /// On failure nothing is left at `dest` but what was there before.
    pub fn copy(&self, model_url: &str, dest: &str) -> Result<u64, String> {
        let deadline = Deadline { at: Instant::now() + self.limit.timeout, limit: self.limit.timeout };
        let parts = Path::new(dest).components();
        if dest.is_empty() || !parts.into_iter().all(|part| matches!(part, Component::Normal(_))) {
            return Err(format!("{dest}: not a path inside the output directory"));
        }
        let source = self.open_source(model_url, &deadline)?;
        match remote_operator(&self.output_dir, self.s3.as_ref()).map_err(|err| err.to_string())? {
            Some(op) => self.upload(source, &op, dest, &deadline),
            None => self.write_local(source, dest, &deadline),
        }
    }

    /// The model, checked before a byte is copied: a local one inside the roots, a regular
    /// file outside procfs, sysfs and the other kernel filesystems; any one at most the limit's
    /// size.
    fn open_source(&self, url: &str, deadline: &Deadline) -> Result<Source, String> {
        let local = if url.contains("://") { url.strip_prefix("file://") } else { Some(url) };
        let Some(path) = local else {
            let (op, path) = perennial_storage::locate(url, self.s3.as_ref()).map_err(|err| err.to_string())?;
            // The timer is made inside the runtime, which it needs.
            let stat =
                self.runtime.block_on(async { tokio::time::timeout(deadline.remaining(), op.stat(&path)).await });
            let size =
                stat.map_err(|_| deadline.expired(url))?.map_err(|err| format!("{url}: {err}"))?.content_length();
            if size > self.limit.max_bytes {
                return Err(
                    StorageError::TooLarge { url: url.to_owned(), size, limit: self.limit.max_bytes }.to_string()
                );
            }
            return Ok(Source::Remote { op, path, size, url: url.to_owned() });
        };
        if url.starts_with("file://") && !path.starts_with('/') {
            return Err(format!("{url}: a file:// URL needs an absolute path (file:///path)"));
        }
        let real = std::fs::canonicalize(path).map_err(|err| format!("{url}: {err}"))?;
        self.inside_roots(url, &real)?;
        let (file, size) =
            perennial_storage::open_regular(url, &real, self.limit.max_bytes).map_err(|err| err.to_string())?;
        // A folder on the way may have been swapped for a link since the path was resolved: what
        // was opened is what must be inside.
        if let Ok(opened) = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            self.inside_roots(url, &opened)?;
        }
        Ok(Source::Local { file, size, url: url.to_owned() })
    }

    fn inside_roots(&self, url: &str, real: &Path) -> Result<(), String> {
        let inside = self
            .roots
            .iter()
            .filter(|root| !root.is_empty() && !root.contains("://"))
            .filter_map(|root| std::fs::canonicalize(root).ok())
            .any(|root| real.starts_with(root));
        if inside {
            Ok(())
        } else {
            Err(format!("{url} resolves to {}, outside the job's output and dataset", real.display()))
        }
    }

    /// To the local output directory: a temporary file in its `.perennial-tmp`, synced, then
    /// renamed to `dest`; removed if anything fails.
    fn write_local(&self, source: Source, dest: &str, deadline: &Deadline) -> Result<u64, String> {
        let output = Path::new(&self.output_dir);
        let target = output.join(dest);
        real_folders(output, &output.join(TMP_DIR))?;
        let (mut temp, temp_path) = create_temporary(&output.join(TMP_DIR), dest)?;
        let written = (|| {
            let named = |err: std::io::Error| format!("{}: {err}", temp_path.display());
            let size = match &source {
                Source::Local { file, size, url } => copy_extents(file, url, &temp, &temp_path, *size, deadline)?,
                Source::Remote { op, path, size, url } => {
                    let copy = self.download(op, path, *size, url, &mut temp, &temp_path);
                    let done = self.runtime.block_on(async { tokio::time::timeout(deadline.remaining(), copy).await });
                    done.map_err(|_| deadline.expired(url))??
                }
            };
            temp.sync_all().map_err(named)?;
            let folder = target.parent().unwrap_or(output);
            std::fs::create_dir_all(folder).map_err(|err| format!("{}: {err}", folder.display()))?;
            real_folders(output, folder)?;
            std::fs::rename(&temp_path, &target).map_err(|err| format!("{}: {err}", target.display()))?;
            // The rename itself lasts only once its folder is synced.
            if let Err(err) = File::open(folder).and_then(|folder| folder.sync_all()) {
                tracing::warn!("{}: not synced after the deploy: {err}", folder.display());
            }
            Ok(size)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp_path);
        }
        written
    }

    /// An S3 (or HTTPS) object into the local file `temp`, as its body arrives.
    async fn download(
        &self,
        op: &Operator,
        path: &str,
        size: u64,
        url: &str,
        temp: &mut File,
        temp_path: &Path,
    ) -> Result<u64, String> {
        use std::io::Write;

        if size == 0 {
            return Ok(0);
        }
        let from = |err: opendal::Error| format!("{url}: {err}");
        // Exactly the size stated: an object that grows meanwhile cannot make the copy longer.
        let mut body = op.reader(path).await.map_err(from)?.into_stream(0..size).await.map_err(from)?;
        let mut written = 0u64;
        while let Some(buffer) = body.try_next().await.map_err(from)? {
            for bytes in buffer {
                temp.write_all(&bytes).map_err(|err| format!("{}: {err}", temp_path.display()))?;
                written += bytes.len() as u64;
            }
        }
        if written != size {
            return Err(shrank(url, written, size));
        }
        Ok(written)
    }

    /// To the S3 output directory: a streamed upload of `PART`-sized parts, completed only
    /// when the whole model is sent; aborted otherwise.
    fn upload(&self, source: Source, op: &Operator, dest: &str, deadline: &Deadline) -> Result<u64, String> {
        let target = crate::output::url_in(&self.output_dir, dest);
        let to = |err: opendal::Error| format!("{target}: {err}");
        self.runtime.block_on(async {
            let writer = op.writer_with(dest).chunk(PART);
            let mut writer = tokio::time::timeout(deadline.remaining(), writer)
                .await
                .map_err(|_| deadline.expired(&target))?
                .map_err(to)?;
            let sent = tokio::time::timeout(deadline.remaining(), async {
                let size = send(&source, &mut writer, &target, deadline).await?;
                writer.close().await.map_err(to)?;
                Ok::<u64, String>(size)
            })
            .await
            .unwrap_or_else(|_| Err(deadline.expired(source.url())));
            if sent.is_err() {
                // Best effort: the parts sent so far would otherwise be kept (and billed).
                let _ = tokio::time::timeout(ABORT_TIME, writer.abort()).await;
            }
            sent
        })
    }
}

/// A model to copy, opened and its size known (at most the limit).
enum Source {
    /// An open regular file.
    Local { file: File, size: u64, url: String },
    /// An object through OpenDAL (S3, HTTPS).
    Remote { op: Operator, path: String, size: u64, url: String },
}

impl Source {
    fn url(&self) -> &str {
        match self {
            Source::Local { url, .. } | Source::Remote { url, .. } => url,
        }
    }
}

/// The source's bytes into `writer` (to `target`), a buffer at a time.
async fn send(source: &Source, writer: &mut Writer, target: &str, deadline: &Deadline) -> Result<u64, String> {
    let to = |err: opendal::Error| format!("{target}: {err}");
    match source {
        Source::Local { file, size, url } => {
            let mut offset = 0;
            while offset < *size {
                deadline.check(url)?;
                let mut chunk = vec![0; BUFFER.min((size - offset) as usize)];
                let read = file.read_at(&mut chunk, offset).map_err(|err| format!("{url}: {err}"))?;
                if read == 0 {
                    return Err(shrank(url, offset, *size));
                }
                chunk.truncate(read);
                writer.write(Buffer::from(chunk)).await.map_err(to)?;
                offset += read as u64;
            }
            Ok(offset)
        }
        Source::Remote { op, path, size, url } => {
            if *size == 0 {
                return Ok(0);
            }
            let from = |err: opendal::Error| format!("{url}: {err}");
            let mut body = op.reader(path).await.map_err(from)?.into_stream(0..*size).await.map_err(from)?;
            let mut sent = 0u64;
            while let Some(buffer) = body.try_next().await.map_err(from)? {
                sent += buffer.len() as u64;
                writer.write(buffer).await.map_err(to)?;
            }
            if sent != *size {
                return Err(shrank(url, sent, *size));
            }
            Ok(sent)
        }
    }
}

/// Refuses a folder between `output` and `folder` that is a symlink: workers write in the output
/// directory, and one that turned `deploy/` or `.perennial-tmp` into a link would have the agent
/// write (or rename) the model wherever it points.
fn real_folders(output: &Path, folder: &Path) -> Result<(), String> {
    let Ok(relative) = folder.strip_prefix(output) else { return Ok(()) };
    let mut at = output.to_path_buf();
    for part in relative.components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|meta| meta.file_type().is_symlink()) {
            return Err(format!(
                "{} is a symlink: the model is written only into the output directory's own folders",
                at.display()
            ));
        }
    }
    Ok(())
}

/// A new file in `folder` (created if missing) for `dest`'s bytes, under a name no other copy
/// uses.
fn create_temporary(folder: &Path, dest: &str) -> Result<(File, PathBuf), String> {
    std::fs::create_dir_all(folder).map_err(|err| format!("{}: {err}", folder.display()))?;
    let unique = getrandom::u64().map_err(|err| format!("no random name for a temporary file: {err}"))?;
    let path = folder.join(format!("{}.{unique:016x}", dest.replace('/', "_")));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|err| format!("{}: {err}", path.display()))?;
    Ok((file, path))
}

/// Copies the first `size` bytes of `source` to `dest`, only its data extents where the
/// filesystem tells them (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes; the whole range
/// otherwise. `dest` ends `size` long. Returns `size`.
fn copy_extents(
    source: &File,
    url: &str,
    dest: &File,
    dest_path: &Path,
    size: u64,
    deadline: &Deadline,
) -> Result<u64, String> {
    let mut buffer = vec![0; BUFFER];
    let mut offset = 0;
    while offset < size {
        let (start, end) = match next_extent(source, offset, size) {
            Extent::Data { start, end } => (start, end),
            Extent::NoMore => break,
            Extent::Unknown => (offset, size),
        };
        let mut at = start;
        while at < end {
            deadline.check(url)?;
            let want = BUFFER.min((end - at) as usize);
            let read = source.read_at(&mut buffer[..want], at).map_err(|err| format!("{url}: {err}"))?;
            if read == 0 {
                return Err(shrank(url, at, size));
            }
            dest.write_all_at(&buffer[..read], at).map_err(|err| format!("{}: {err}", dest_path.display()))?;
            at += read as u64;
        }
        offset = end;
    }
    // A trailing hole: the length, with no block written.
    dest.set_len(size).map_err(|err| format!("{}: {err}", dest_path.display()))?;
    Ok(size)
}

enum Extent {
    /// Bytes `start..end` may hold data (a hole follows, or the end).
    Data { start: u64, end: u64 },
    /// Only a hole from here to the end.
    NoMore,
    /// The filesystem does not say: copy the rest whole.
    Unknown,
}

/// The next data extent of `file` at or after `offset`, within its first `size` bytes.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn next_extent(file: &File, offset: u64, size: u64) -> Extent {
    // An offset off_t cannot hold (a 32-bit off_t past 2 GiB): the rest is copied whole.
    let Ok(from) = libc::off_t::try_from(offset) else { return Extent::Unknown };
    // SAFETY: lseek(2) on a descriptor we own; it moves only the file offset, which the
    // positioned reads here do not use.
    let data = unsafe { libc::lseek(file.as_raw_fd(), from, libc::SEEK_DATA) };
    if data < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENXIO) => Extent::NoMore,
            _ => Extent::Unknown,
        };
    }
    let start = data as u64;
    if start >= size {
        return Extent::NoMore;
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(file.as_raw_fd(), data, libc::SEEK_HOLE) };
    let end = if hole < 0 { size } else { (hole as u64).min(size) };
    Extent::Data { start, end }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn next_extent(_file: &File, _offset: u64, _size: u64) -> Extent {
    Extent::Unknown
}

fn shrank(url: &str, at: u64, size: u64) -> String {
    format!("{url}: ended at byte {at} of the {size} stated (it shrank while copied)")
}

/// When the whole copy must be done.
struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    fn check(&self, url: &str) -> Result<(), String> {
        if Instant::now() >= self.at { Err(self.expired(url)) } else { Ok(()) }
    }

    fn expired(&self, url: &str) -> String {
        format!("{url}: not copied within {:?}", self.limit)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    use super::*;

    const DEST: &str = "deploy/index.pkl";

    /// A job's output directory with a dataset folder beside it, and its copier.
    struct Job {
        dir: tempfile::TempDir,
        runtime: tokio::runtime::Runtime,
    }

    impl Job {
        fn new() -> Job {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("output/eval/1")).unwrap();
            std::fs::create_dir_all(dir.path().join("dataset")).unwrap();
            Job { dir, runtime: tokio::runtime::Runtime::new().unwrap() }
        }

        fn output(&self) -> PathBuf {
            self.dir.path().join("output")
        }

        fn copier(&self, roots: Vec<String>, limit: ReadLimit) -> ModelCopy {
            let output_dir = self.output().display().to_string();
            ModelCopy { runtime: self.runtime.handle().clone(), s3: None, output_dir, roots, limit }
        }

        fn copy(&self, model: &Path) -> Result<u64, String> {
            let roots =
                vec![self.output().display().to_string(), self.dir.path().join("dataset").display().to_string()];
            self.copier(roots, DEPLOY_LIMIT).copy(&model.display().to_string(), DEST)
        }

        fn deployed(&self) -> PathBuf {
            self.output().join(DEST)
        }

        /// What the temporary folder holds: nothing once a copy is done, whatever its outcome.
        fn temporary(&self) -> Vec<String> {
            let entries = std::fs::read_dir(self.output().join(TMP_DIR)).into_iter().flatten().flatten();
            entries.map(|entry| entry.file_name().to_string_lossy().into_owned()).collect()
        }
    }

    /// A worker that turned `deploy/` into a link to another folder does not get the model
    /// written there.
    #[test]
    fn a_deploy_folder_turned_into_a_symlink_is_refused() {
        let job = Job::new();
        let model = job.output().join("eval/1/index.pkl");
        std::fs::write(&model, b"model").unwrap();
        let elsewhere = job.dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, job.output().join("deploy")).unwrap();
        let err = job.copy(&model).unwrap_err();
        assert!(err.contains("deploy is a symlink"), "{err}");
        assert!(!elsewhere.join("index.pkl").exists(), "written through the link");
        assert!(job.temporary().is_empty(), "{:?}", job.temporary());
    }

    /// A 2 GiB model that is mostly a hole, as an eval worker may leave it: deployed whole (same
    /// length, same bytes where written, zeros elsewhere) and still sparse, in well under the
    /// time a dense copy would take.
    #[test]
    fn a_sparse_2_gib_model_is_deployed_whole_and_stays_sparse() {
        let job = Job::new();
        let model = job.output().join("eval/1/index.pkl");
        let file = File::create(&model).unwrap();
        let size = 2u64 << 30;
        file.set_len(size).unwrap();
        let written: [(u64, &[u8]); 4] =
            [(0, b"header"), (1 << 30, b"middle"), ((1 << 30) + (3 << 20), b"past a buffer"), (size - 4, b"tail")];
        for (offset, bytes) in written {
            file.write_all_at(bytes, offset).unwrap();
        }
        file.sync_all().unwrap();
        drop(file);
        assert!(std::fs::metadata(&model).unwrap().blocks() < 4096, "the source is sparse on this filesystem");

        let started = Instant::now();
        assert_eq!(job.copy(&model).unwrap(), size);
        let took = started.elapsed();
        let deployed = File::open(job.deployed()).unwrap();
        let metadata = deployed.metadata().unwrap();
        assert_eq!(metadata.len(), size);
        for (offset, bytes) in written {
            let mut read = vec![0; bytes.len()];
            deployed.read_exact_at(&mut read, offset).unwrap();
            assert_eq!(read, bytes, "at {offset}");
        }
        let mut hole = vec![1; 4096];
        deployed.read_exact_at(&mut hole, 1 << 29).unwrap();
        assert!(hole.iter().all(|&b| b == 0), "a hole reads as zeros");
        // 512-byte blocks: the written extents only (a few filesystem blocks each), not 2 GiB.
        assert!(metadata.blocks() < 4096, "{} blocks allocated: the copy is dense", metadata.blocks());
        assert!(took < Duration::from_secs(20), "took {took:?}");
        assert!(job.temporary().is_empty(), "{:?}", job.temporary());
    }

    /// A dense model over several buffers, and an empty one, arrive byte for byte.
    #[test]
    fn a_dense_model_is_copied_byte_for_byte() {
        let job = Job::new();
        let model = job.dir.path().join("dataset/model.bin");
        let bytes: Vec<u8> = (0..(3 * BUFFER + 12345)).map(|i| (i * 7 + i / 1000) as u8).collect();
        std::fs::write(&model, &bytes).unwrap();
        assert_eq!(job.copy(&model).unwrap(), bytes.len() as u64);
        assert_eq!(std::fs::read(job.deployed()).unwrap(), bytes);
        let empty = job.output().join("eval/1/empty.pkl");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(job.copy(&empty).unwrap(), 0);
        assert_eq!(std::fs::read(job.deployed()).unwrap(), b"");
    }

    /// What may not be deployed is refused before a byte is copied, with the file and the reason
    /// named; nothing is left at the destination or in the temporary folder.
    #[test]
    fn what_may_not_be_deployed_is_refused_by_name() {
        let job = Job::new();
        let eval = job.output().join("eval/1");
        let fifo = eval.join("fifo.pkl");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let secret = job.dir.path().join("secret.db");
        std::fs::write(&secret, b"not for workers").unwrap();
        let link = eval.join("link.pkl");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let zero = eval.join("zero.pkl");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let huge = eval.join("huge.pkl");
        File::create(&huge).unwrap().set_len(MAX_MODEL_BYTES + 1).unwrap();

        let started = Instant::now();
        let refused = |model: &Path, reason: &str| {
            let err = job.copy(model).unwrap_err();
            assert!(err.starts_with(&model.display().to_string()), "names the file: {err}");
            assert!(err.contains(reason), "{err}");
        };
        refused(&fifo, "not a regular file");
        refused(&zero, "outside the job's output and dataset");
        refused(&link, &format!("resolves to {}, outside the job's output and dataset", secret.display()));
        refused(&huge, &format!("{} bytes, over the {MAX_MODEL_BYTES}-byte limit", MAX_MODEL_BYTES + 1));
        refused(&eval.join("missing.pkl"), "No such file");
        let err = job.copy(Path::new("file:///etc/hostname")).unwrap_err();
        assert!(err.starts_with("file:///etc/hostname resolves to /etc/hostname, outside"), "{err}");
        // A dataset at the root folder puts every file inside the roots: procfs is refused still.
        let everywhere = job.copier(vec!["/".into()], DEPLOY_LIMIT);
        let err = everywhere.copy("/proc/self/status", DEST).unwrap_err();
        assert!(err.starts_with("/proc/self/status: a file of procfs"), "{err}");
        assert!(everywhere.copy(&secret.display().to_string(), "../escape.pkl").is_err());
        assert!(started.elapsed() < Duration::from_secs(5), "refused at once");
        assert!(!job.deployed().exists(), "nothing deployed");
        assert!(job.temporary().is_empty(), "{:?}", job.temporary());
    }

    /// The deployed model is replaced by a rename: a reader opening it meanwhile reads the old
    /// model or the new one, whole; a copy that fails midway leaves the old one as it was.
    #[test]
    fn the_deployed_model_is_replaced_whole_or_not_at_all() {
        let job = Job::new();
        let size = 4 * BUFFER;
        let models = b"ab".map(|fill| {
            let path = job.output().join(format!("eval/1/{}.pkl", fill as char));
            std::fs::write(&path, vec![fill; size]).unwrap();
            path
        });
        job.copy(&models[0]).unwrap();

        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let bytes = std::fs::read(job.deployed()).unwrap();
                    assert_eq!(bytes.len(), size, "a partial model was read");
                    assert!(bytes.iter().all(|&b| b == bytes[0]), "a mixed model was read");
                    reads += 1;
                }
                reads
            });
            for round in 0..20 {
                job.copy(&models[round % 2]).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0);
        });
        assert_eq!(std::fs::read(job.deployed()).unwrap(), vec![b'b'; size]);

        // Out of time once the temporary file exists: it is removed, the deployed model stays.
        let output = job.output().display().to_string();
        let no_time = job.copier(vec![output], ReadLimit { timeout: Duration::ZERO, ..DEPLOY_LIMIT });
        let err = no_time.copy(&models[0].display().to_string(), DEST).unwrap_err();
        assert!(err.ends_with("a.pkl: not copied within 0ns"), "{err}");
        assert_eq!(std::fs::read(job.deployed()).unwrap(), vec![b'b'; size]);
        assert!(job.temporary().is_empty(), "{:?}", job.temporary());
    }

    #[test]
    fn a_leftover_temporary_file_does_not_stop_a_copy() {
        let job = Job::new();
        std::fs::create_dir_all(job.output().join(TMP_DIR)).unwrap();
        let mut leftover = File::create(job.output().join(TMP_DIR).join("deploy_index.pkl.0")).unwrap();
        leftover.write_all(b"half").unwrap();
        let model = job.output().join("eval/1/index.pkl");
        std::fs::write(&model, b"model").unwrap();
        assert_eq!(job.copy(&model).unwrap(), 5);
        assert_eq!(std::fs::read(job.deployed()).unwrap(), b"model");
    }
}
