//! `perennial fetch`: downloads a worker pod's remote inputs before its workers start.
//!
//! The operator puts it in the `storage-initializer` init container (`Mounts::initializer` in
//! `workers/pod.rs`), in place of Sedna's `download.py` (`reference/sedna.md` §2.4), so that Sedna
//! worker images find their S3 and HTTP(S) inputs as plain files under the `/downloads` volume, at
//! the paths the pod builder put in their env:
//!
//! ```text
//! perennial fetch --job SRC DST [--job SRC DST ...] --dataset SRC DST [...] --dataset-index SRC DST [...]
//! ```
//!
//! - A `--job` source is read with the job's credential (`S3_ENDPOINT_URL`, `ACCESS_KEY_ID`,
//!   `SECRET_ACCESS_KEY`), a `--dataset` source with the dataset's (`DATASET_S3_ENDPOINT_URL`,
//!   `DATASET_ACCESS_KEY_ID`, `DATASET_SECRET_ACCESS_KEY`). Sedna merges the Secrets of all
//!   downloads into one set, so a job and a dataset with different keys cannot both be read; here
//!   every file is read with the credential of the flag it was given under, and nothing else.
//! - SRC is `s3://bucket/key`, `http://...` or `https://...`. Everything is saved under DST at its
//!   path relative to SRC's parent folder: one object `.../f.txt` becomes `DST/f.txt`; a folder
//!   `.../dir` (objects under `dir/`) becomes `DST/dir/...`; a folder `.../dir/` becomes `DST/...`.
//!   That is where the pod builder's env values (`/downloads/<bucket>/<key>`) point.
//! - DST starting with `INDIRECT_URL_MARK` (default `@`) makes SRC an *indirect* index, the
//!   `dataIndex.txt` the edge writes for a remote txt dataset, in Sedna's format: blank lines and
//!   lines starting with `#` are skipped, the first other line is the base URI, and each further
//!   line is a file (or folder) name relative to it. Each one is fetched from `<base>/<name>` to
//!   `DST/<name>`, so sample paths resolve against the index's folder. Unlike Sedna, the index
//!   itself is also saved as `DST/<index name>`, so the worker's `ORIGINAL_DATASET_URL` names a
//!   file that exists; a name that is absolute, a URL, or climbs out of DST (`..`) is an error.
//!   The index, its base URI and its files are all read with the credential of the index's flag.
//! - `--dataset-index SRC DST` is always indirect, for the index the edge writes into the job's
//!   output (a remote dataset's round samples, `ORIGINAL_DATASET_URL`): the index is read with the
//!   job's credential, the files it names with the dataset's. (Sedna reads both with one set.)
//! - Unlike Sedna, `.tar`, `.tar.gz` and `.zip` downloads are saved as they are, not extracted.
//!
//! Each file is written to a temporary name beside its destination and renamed into place, so a
//! worker never sees half a file, and a rerun of the init container simply replaces them. One log
//! line per object says source, destination and size. Any failure (a missing object, a refused
//! key, an unset credential) names the URL and stops the command with a non-zero exit, so the pod
//! never starts on partial inputs; Sedna only warns about files of an index it cannot find.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, anyhow, bail};
use opendal::{ErrorKind, Operator};
use perennial_storage::{self as storage, S3Credentials};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinSet;

/// Bytes asked for per ranged read: a large object streams to disk, never whole in memory.
const CHUNK: u64 = 8 << 20;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("downloads").required(true).multiple(true).args(["job", "dataset", "dataset_index"]))]
pub struct FetchArgs {
    /// Downloads SRC into the folder DST with the job's credential (S3_ENDPOINT_URL,
    /// ACCESS_KEY_ID, SECRET_ACCESS_KEY). Repeatable.
    #[arg(long, num_args = 2, value_names = ["SRC", "DST"], action = clap::ArgAction::Append)]
    job: Vec<String>,

    /// Downloads SRC into the folder DST with the dataset's credential (DATASET_S3_ENDPOINT_URL,
    /// DATASET_ACCESS_KEY_ID, DATASET_SECRET_ACCESS_KEY). Repeatable.
    #[arg(long, num_args = 2, value_names = ["SRC", "DST"], action = clap::ArgAction::Append)]
    dataset: Vec<String>,

    /// Downloads the index SRC (a round's sample list, written by the edge into the job's output)
    /// with the job's credential into DST, then each file it names with the dataset's
    /// credential. Repeatable.
    #[arg(long, num_args = 2, value_names = ["SRC", "DST"], action = clap::ArgAction::Append)]
    dataset_index: Vec<String>,

    /// A DST starting with this mark is indirect: SRC is an index file whose lines name the files
    /// to download (Sedna's storage initializer). Empty: no DST is indirect.
    #[arg(long, env = "INDIRECT_URL_MARK", default_value = "@")]
    indirect_mark: String,

    /// Most object reads in flight at once.
    #[arg(long, env = "PERENNIAL_FETCH_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    concurrency: u16,
}

pub async fn run(args: FetchArgs) -> anyhow::Result<()> {
    let job = Arc::new(Credential::from_env(Owner::Job));
    let dataset = Arc::new(Credential::from_env(Owner::Dataset));
    // (flag, the index's credential, the files' credential, pairs); `--dataset-index` is always
    // indirect, the others when DST carries the mark.
    let flags = [
        ("--job", &job, &job, &args.job),
        ("--dataset", &dataset, &dataset, &args.dataset),
        ("--dataset-index", &job, &dataset, &args.dataset_index),
    ];
    let mut requests = Vec::new();
    for (flag, index_credential, credential, values) in flags {
        for pair in values.chunks(2) {
            let [source, destination] = pair else {
                bail!("{flag} takes SRC and DST");
            };
            let (marked, folder) = match destination.strip_prefix(args.indirect_mark.as_str()) {
                Some(rest) if !args.indirect_mark.is_empty() => (true, rest),
                _ => (false, destination.as_str()),
            };
            if folder.is_empty() {
                bail!("{source} ({flag}): the destination folder is empty");
            }
            // A missing credential fails before anything is downloaded.
            if source.starts_with("s3://") {
                index_credential.s3(source)?;
            }
            let indirect = marked || flag == "--dataset-index";
            let request = (index_credential.clone(), credential.clone(), source.clone(), PathBuf::from(folder));
            requests.push((request, indirect));
        }
    }

    let fetcher = Arc::new(Fetcher {
        slots: Semaphore::new(args.concurrency.into()),
        failed: AtomicBool::new(false),
        partial: AtomicU64::new(0),
    });
    let mut tasks = JoinSet::new();
    for ((index_credential, credential, source, folder), indirect) in requests {
        let fetcher = fetcher.clone();
        tasks.spawn(async move {
            if indirect {
                fetcher.indirect(&index_credential, &credential, &source, &folder).await
            } else {
                fetcher.source(&credential, &source, &folder).await
            }
        });
    }
    let total = fetcher.join_all(tasks).await?;
    tracing::info!("fetched {} objects, {} bytes", total.objects, total.bytes);
    Ok(())
}

/// Which flag a source came under, and so which credential reads it.
#[derive(Clone, Copy)]
enum Owner {
    Job,
    Dataset,
}

impl Owner {
    fn flag(self) -> &'static str {
        match self {
            Owner::Job => "--job",
            Owner::Dataset => "--dataset",
        }
    }

    fn env_prefix(self) -> &'static str {
        match self {
            Owner::Job => "",
            Owner::Dataset => "DATASET_",
        }
    }

    fn env_names(self) -> [String; 3] {
        ["S3_ENDPOINT_URL", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY"].map(|name| format!("{}{name}", self.env_prefix()))
    }
}

/// One flag's S3 credential as the environment gives it, or which of its variables are unset.
struct Credential {
    owner: Owner,
    s3: Option<S3Credentials>,
    missing: Vec<String>,
}

impl Credential {
    fn from_env(owner: Owner) -> Credential {
        let missing: Vec<String> = owner
            .env_names()
            .into_iter()
            .filter(|name| std::env::var_os(name).is_none_or(|value| value.is_empty()))
            .collect();
        let s3 = if missing.is_empty() { S3Credentials::from_env_prefixed(owner.env_prefix()) } else { None };
        Credential { owner, s3, missing }
    }

    /// The credential for the S3 `url`, or an error that says which variables to set.
    fn s3(&self, url: &str) -> anyhow::Result<&S3Credentials> {
        self.s3.as_ref().ok_or_else(|| {
            let [endpoint, key, secret] = self.owner.env_names();
            anyhow!(
                "{url} ({}): no S3 credential: set {endpoint}, {key} and {secret} (unset: {})",
                self.owner.flag(),
                self.missing.join(", ")
            )
        })
    }

    /// `url: what went wrong`, in words for the common cases, naming the credential when it was
    /// refused. Never the secret.
    fn describe(&self, url: &str, err: opendal::Error) -> anyhow::Error {
        match err.kind() {
            ErrorKind::NotFound => anyhow!("{url} ({}): not found", self.owner.flag()),
            ErrorKind::PermissionDenied => {
                let [endpoint, key, secret] = self.owner.env_names();
                let detail = if err.message().is_empty() { String::new() } else { format!(": {}", err.message()) };
                anyhow!(
                    "{url} ({}): access denied for the credential in {key}/{secret} at {endpoint}{detail}",
                    self.owner.flag()
                )
            }
            _ => anyhow!("{url} ({}): {err}", self.owner.flag()),
        }
    }
}

/// What a source URL names: an operator, the path in it, and the URL text before that path.
struct Source {
    op: Operator,
    key: String,
    url_prefix: String,
}

impl Source {
    fn open(url: &str, credential: &Credential) -> anyhow::Result<Source> {
        let (op, key) = match url.split_once("://") {
            Some(("s3", _)) => storage::locate(url, Some(credential.s3(url)?))?,
            Some(("https", _)) => storage::locate(url, None)?,
            Some(("http", rest)) => {
                let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
                if host.is_empty() {
                    bail!("{url}: expected http://host/path");
                }
                opendal::install_default();
                let op = Operator::new(opendal::services::Http::default().endpoint(&format!("http://{host}")))
                    .map_err(|err| anyhow!("{url}: {err}"))?;
                (op, format!("/{path}"))
            }
            _ => bail!("{url} ({}): expected s3://bucket/key, http:// or https://", credential.owner.flag()),
        };
        let url_prefix = url.strip_suffix(key.as_str()).unwrap_or(url).to_owned();
        Ok(Source { op, key, url_prefix })
    }

    fn url(&self, key: &str) -> String {
        format!("{}{key}", self.url_prefix)
    }
}

#[derive(Clone, Copy, Default)]
struct Totals {
    objects: u64,
    bytes: u64,
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, other: Totals) {
        self.objects += other.objects;
        self.bytes += other.bytes;
    }
}

/// The error of a download that stopped because another one failed.
#[derive(Debug)]
struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cancelled: another download failed")
    }
}

impl std::error::Error for Cancelled {}

struct Fetcher {
    /// Bounds the object reads (stat, list, get) in flight.
    slots: Semaphore,
    /// Set by the first failure: what has not started does not start, what runs stops at its next
    /// chunk and removes its temporary file. Tasks are never aborted, so none is cut short
    /// between creating a file and cleaning it up.
    failed: AtomicBool,
    /// Numbers the temporary files.
    partial: AtomicU64,
}

impl Fetcher {
    async fn slot(&self) -> anyhow::Result<SemaphorePermit<'_>> {
        self.go_on()?;
        let slot = self.slots.acquire().await.expect("the semaphore is never closed");
        self.go_on()?;
        Ok(slot)
    }

    fn go_on(&self) -> anyhow::Result<()> {
        if self.failed.load(Ordering::Relaxed) { Err(Cancelled.into()) } else { Ok(()) }
    }

    /// Waits for every task. After a failure the others wind down; the first real error (not a
    /// [`Cancelled`]) is returned.
    async fn join_all(&self, mut tasks: JoinSet<anyhow::Result<Totals>>) -> anyhow::Result<Totals> {
        let mut total = Totals::default();
        let mut first: Option<anyhow::Error> = None;
        while let Some(joined) = tasks.join_next().await {
            match joined.map_err(|err| anyhow!("a download task failed: {err}")).and_then(|result| result) {
                Ok(done) => total += done,
                Err(err) => {
                    self.failed.store(true, Ordering::Relaxed);
                    if first.as_ref().is_none_or(|first| first.is::<Cancelled>()) {
                        first = Some(err);
                    }
                }
            }
        }
        first.map_or(Ok(total), Err)
    }

    /// Downloads the object or folder at `url` under `folder` (see the module doc for where).
    async fn source(
        self: &Arc<Self>,
        credential: &Arc<Credential>,
        url: &str,
        folder: &Path,
    ) -> anyhow::Result<Totals> {
        let source = Arc::new(Source::open(url, credential)?);
        let objects = self.resolve(credential, url, &source).await?;
        // Paths are kept relative to the source's parent folder.
        let parent = &source.key[..source.key.rfind('/').map_or(0, |i| i + 1)];
        let mut tasks = JoinSet::new();
        for (key, size) in objects {
            let relative = key.strip_prefix(parent).unwrap_or(&key);
            let destination = safe_join(folder, relative)
                .map_err(|why| anyhow!("{} ({}): {why}", source.url(&key), credential.owner.flag()))?;
            let (fetcher, credential, source) = (self.clone(), credential.clone(), source.clone());
            tasks.spawn(async move { fetcher.download(&credential, &source, &key, size, &destination).await });
        }
        self.join_all(tasks).await
    }

    /// The objects (key, size) that `source` names: itself, or everything under it as a folder.
    async fn resolve(&self, credential: &Credential, url: &str, source: &Source) -> anyhow::Result<Vec<(String, u64)>> {
        let mut stat_error = None;
        if !source.key.ends_with('/') {
            let _slot = self.slot().await?;
            match source.op.stat(&source.key).await {
                Ok(meta) if meta.is_file() => return Ok(vec![(source.key.clone(), meta.content_length())]),
                Ok(_) => {}
                Err(err) => stat_error = Some(err),
            }
        }
        let folder = if source.key.ends_with('/') { source.key.clone() } else { format!("{}/", source.key) };
        let listed = {
            let _slot = self.slot().await?;
            source.op.list_with(&folder).recursive(true).await
        };
        match listed {
            Ok(entries) => {
                let mut files: Vec<(String, u64)> = entries
                    .into_iter()
                    .filter(|entry| entry.metadata().is_file())
                    .map(|entry| (entry.path().to_owned(), entry.metadata().content_length()))
                    .collect();
                if !files.is_empty() {
                    files.sort();
                    return Ok(files);
                }
            }
            // A folder that cannot be listed: say why, unless the object was already refused.
            Err(err) if stat_error.is_none() && err.kind() == ErrorKind::Unsupported => {
                bail!("{url} ({}): a folder cannot be listed over this protocol; name a file", credential.owner.flag())
            }
            Err(err) if stat_error.is_none() => return Err(credential.describe(url, err)),
            Err(_) => {}
        }
        Err(match stat_error {
            Some(err) => credential.describe(url, err),
            None => anyhow!("{url} ({}): not found (no objects under it)", credential.owner.flag()),
        })
    }

    /// Saves the index at `url` (read with `index_credential`) as `folder/<its name>`, then each
    /// file it names with `credential` (module doc).
    async fn indirect(
        self: &Arc<Self>,
        index_credential: &Arc<Credential>,
        credential: &Arc<Credential>,
        url: &str,
        folder: &Path,
    ) -> anyhow::Result<Totals> {
        let source = Source::open(url, index_credential)?;
        let name = source.key.rsplit('/').next().unwrap_or_default();
        if name.is_empty() {
            bail!("{url} ({}): an indirect source must be an index file, not a folder", index_credential.owner.flag());
        }
        let bytes = {
            let _slot = self.slot().await?;
            source.op.read(&source.key).await.map_err(|err| index_credential.describe(url, err))?.to_vec()
        };
        let destination = folder.join(name);
        self.write_atomically(url, &destination, &bytes).await?;
        tracing::info!(bytes = bytes.len(), "{url} → {}", destination.display());
        let mut total = Totals { objects: 1, bytes: bytes.len() as u64 };

        let text = std::str::from_utf8(&bytes).map_err(|err| anyhow!("{url}: the index is not UTF-8 text: {err}"))?;
        let index = parse_index(text).map_err(|why| anyhow!("{url}: {why}"))?;
        let Some(base) = index.base else {
            tracing::info!("{url}: the index names no files");
            return Ok(total);
        };
        let base = base.trim_end_matches('/');
        if !["s3://", "http://", "https://"].iter().any(|scheme| base.starts_with(scheme)) {
            bail!("{url}: line {}: the base URI `{base}` is not s3://, http:// or https://", index.base_line);
        }
        let mut tasks = JoinSet::new();
        for (line, name) in index.files {
            // `a/b.png` lands in `folder/a/`, a folder `a/` in `folder/a/`, as `source` places them.
            let parent = &name[..name.rfind('/').map_or(0, |i| i + 1)];
            let file_folder = folder.join(parent);
            let file_url = format!("{base}/{name}");
            let (fetcher, credential, index_url) = (self.clone(), credential.clone(), url.to_owned());
            tasks.spawn(async move {
                let fetched = fetcher.source(&credential, &file_url, &file_folder).await;
                fetched.with_context(|| format!("{index_url}: line {line}"))
            });
        }
        total += self.join_all(tasks).await?;
        Ok(total)
    }

    /// Streams one object to `destination` (ranged reads of `CHUNK`), atomically.
    async fn download(
        &self,
        credential: &Credential,
        source: &Source,
        key: &str,
        size: u64,
        destination: &Path,
    ) -> anyhow::Result<Totals> {
        let url = source.url(key);
        let _slot = self.slot().await?;
        let (partial, mut file) = self.create_partial(&url, destination).await?;
        let write_error = |err: std::io::Error| anyhow!("{url}: cannot write {}: {err}", partial.0.display());
        let mut written = 0u64;
        if size == 0 {
            // Empty, or a size the server did not say: one plain read.
            let buffer = source.op.read(key).await.map_err(|err| credential.describe(&url, err))?;
            for bytes in buffer {
                file.write_all(&bytes).await.map_err(write_error)?;
                written += bytes.len() as u64;
            }
        } else {
            let reader = source.op.reader(key).await.map_err(|err| credential.describe(&url, err))?;
            while written < size {
                self.go_on()?;
                let end = (written + CHUNK).min(size);
                let buffer = reader.read(written..end).await.map_err(|err| credential.describe(&url, err))?;
                if buffer.len() as u64 != end - written {
                    bail!("{url}: the object changed while it was read (it was {size} bytes)");
                }
                for bytes in buffer {
                    file.write_all(&bytes).await.map_err(write_error)?;
                }
                written = end;
            }
        }
        file.flush().await.map_err(write_error)?;
        drop(file);
        partial.commit(&url, destination).await?;
        tracing::info!(bytes = written, "{url} → {}", destination.display());
        Ok(Totals { objects: 1, bytes: written })
    }

    async fn write_atomically(&self, url: &str, destination: &Path, bytes: &[u8]) -> anyhow::Result<()> {
        let (partial, mut file) = self.create_partial(url, destination).await?;
        let write_error = |err: std::io::Error| anyhow!("{url}: cannot write {}: {err}", partial.0.display());
        file.write_all(bytes).await.map_err(write_error)?;
        file.flush().await.map_err(write_error)?;
        drop(file);
        partial.commit(url, destination).await
    }

    /// A new temporary file beside `destination` (its folders created), removed unless committed.
    async fn create_partial(&self, url: &str, destination: &Path) -> anyhow::Result<(Partial, tokio::fs::File)> {
        let folder = destination.parent().unwrap_or(Path::new("."));
        tokio::fs::create_dir_all(folder)
            .await
            .map_err(|err| anyhow!("{url}: cannot create the folder {}: {err}", folder.display()))?;
        let name = destination.file_name().unwrap_or_default().to_string_lossy();
        let n = self.partial.fetch_add(1, Ordering::Relaxed);
        let partial = Partial(folder.join(format!(".{name}.partial-{}-{n}", std::process::id())));
        let file = tokio::fs::File::create(&partial.0)
            .await
            .map_err(|err| anyhow!("{url}: cannot create {}: {err}", partial.0.display()))?;
        Ok((partial, file))
    }
}

/// A temporary file that is removed when dropped (an error, or a cancelled task) unless renamed.
struct Partial(PathBuf);

impl Partial {
    async fn commit(self, url: &str, destination: &Path) -> anyhow::Result<()> {
        tokio::fs::rename(&self.0, destination)
            .await
            .map_err(|err| anyhow!("{url}: cannot rename {} to {}: {err}", self.0.display(), destination.display()))
        // On success the drop finds nothing to remove.
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `folder/relative`, refusing a relative path that is absolute, empty or climbs out (`..`).
fn safe_join(folder: &Path, relative: &str) -> Result<PathBuf, String> {
    let trimmed = relative.strip_suffix('/').unwrap_or(relative);
    if trimmed.is_empty() || trimmed.starts_with('/') || trimmed.split('/').any(|part| matches!(part, "" | "." | ".."))
    {
        return Err(format!("`{relative}` is not a plain relative path (no leading /, empty, . or .. parts)"));
    }
    Ok(folder.join(trimmed))
}

/// An indirect index in Sedna's format.
#[derive(Debug, PartialEq)]
struct IndirectIndex<'a> {
    /// The first line that is neither blank nor a `#` comment.
    base: Option<&'a str>,
    base_line: usize,
    /// Each further such line once (line number, name), checked to stay inside the destination.
    files: Vec<(usize, &'a str)>,
}

fn parse_index(text: &str) -> Result<IndirectIndex<'_>, String> {
    let mut index = IndirectIndex { base: None, base_line: 0, files: Vec::new() };
    let mut seen = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if index.base.is_none() {
            index.base = Some(line);
            index.base_line = i + 1;
        } else if seen.insert(line) {
            if line.contains("://") {
                return Err(format!("line {}: `{line}` is a URL; entries are names relative to the base URI", i + 1));
            }
            safe_join(Path::new(""), line).map_err(|why| format!("line {}: {why}", i + 1))?;
            index.files.push((i + 1, line));
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_is_a_base_uri_then_names_comments_and_blanks_skipped_duplicates_once() {
        let text = "# made by the edge\n\n  s3://datasets/atcii/  \nimages/1.png\n#images/x.png\nimages/2.png\n\nimages/1.png\nlabels/\n";
        let index = parse_index(text).unwrap();
        assert_eq!(index.base, Some("s3://datasets/atcii/"));
        assert_eq!(index.base_line, 3);
        assert_eq!(index.files, [(4, "images/1.png"), (6, "images/2.png"), (9, "labels/")]);
        assert_eq!(parse_index("# nothing\n").unwrap().base, None);
    }

    #[test]
    fn names_that_leave_the_destination_are_refused() {
        for bad in ["../x.png", "a/../../x", "/etc/passwd", "a//b", "./a", "s3://other/x"] {
            let err = parse_index(&format!("s3://b/k\n{bad}\n")).unwrap_err();
            assert!(err.starts_with("line 2: "), "{bad}: {err}");
        }
        assert_eq!(safe_join(Path::new("/d"), "a/b.png").unwrap(), Path::new("/d/a/b.png"));
        assert_eq!(safe_join(Path::new("/d"), "a/").unwrap(), Path::new("/d/a"));
        assert!(safe_join(Path::new("/d"), "").is_err());
    }
}
