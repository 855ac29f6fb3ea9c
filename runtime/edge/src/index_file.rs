//! Reading a dataset index that grows: its size and identity, and byte ranges of it.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// What a look at the index file found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub len: u64,
    /// Changes when the file is replaced (a new inode), even at the same path.
    pub id: String,
}

/// An index file that can be looked at and read from an offset.
pub trait IndexFile {
    /// `None` when the file does not exist (yet).
    fn stat(&mut self) -> std::io::Result<Option<FileStat>>;
    /// Up to `max` bytes from `offset`.
    fn read_at(&mut self, offset: u64, max: usize) -> std::io::Result<Vec<u8>>;
    /// Like `read_at`, from the same file as `expected` describes, or an error.
    fn read_at_checked(&mut self, offset: u64, max: usize, _expected: &FileStat) -> std::io::Result<Vec<u8>> {
        self.read_at(offset, max)
    }
    /// How to name the file in messages.
    fn name(&self) -> String;
    /// The file's path, if it is on this node's filesystem (then a change notification can
    /// wake its job).
    fn local_path(&self) -> Option<&Path> {
        None
    }
}

/// An index file on the node's filesystem.
pub struct LocalFile {
    pub path: PathBuf,
}

impl LocalFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LocalFile { path: path.into() }
    }
}

impl IndexFile for LocalFile {
    fn stat(&mut self) -> std::io::Result<Option<FileStat>> {
        match std::fs::metadata(&self.path) {
            // A folder or a FIFO where the index was: never opened (a FIFO would block the job).
            Ok(meta) if !meta.is_file() => Err(std::io::Error::other(if meta.is_dir() {
                "not a regular file (a folder)"
            } else {
                "not a regular file (a FIFO, socket or device)"
            })),
            // A file of the kernel's (procfs, sysfs: `/proc/self/mem` reads as an empty regular
            // file) is no index either: taken for one, it would look like a replaced index, and
            // the real one put back would be read again from its first byte.
            Ok(_) if perennial_types::files::kernel_file(&self.path) => Err(std::io::Error::other(
                "not a data file (a file of the kernel's: procfs, sysfs or the like); the index is left where it was read to",
            )),
            Ok(meta) => Ok(Some(FileStat { len: meta.len(), id: file_id(&meta) })),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    fn read_at(&mut self, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
        read_from(std::fs::File::open(&self.path)?, offset, max)
    }

    fn read_at_checked(&mut self, offset: u64, max: usize, expected: &FileStat) -> std::io::Result<Vec<u8>> {
        // The file that is read must be the file that was looked at: a rename in between
        // would commit the new file's bytes under the old one's identity.
        let file = std::fs::File::open(&self.path)?;
        if file_id(&file.metadata()?) != expected.id {
            return Err(std::io::Error::other("the index was replaced while it was being read"));
        }
        read_from(file, offset, max)
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn local_path(&self) -> Option<&Path> {
        Some(&self.path)
    }
}

/// Whether a local dataset index may be read as one, checked once at admission: not a special
/// file (a device, FIFO, socket, folder, or a file of the kernel's) where it stands now, nor in
/// the kernel's folders where it may appear later.
pub fn check_local_index(path: &Path) -> Result<(), String> {
    const KERNEL_FOLDERS: &[&str] = &["/proc", "/sys", "/dev"];
    let under_kernel = |p: &Path| KERNEL_FOLDERS.iter().any(|folder| p.starts_with(folder));
    if under_kernel(path) || path.canonicalize().is_ok_and(|real| under_kernel(&real)) {
        return Err("is in /proc, /sys or /dev: a dataset index is a file of data".into());
    }
    // Workers may report models under the dataset's folder: not one that holds the system.
    let folder = path.parent().unwrap_or(Path::new("/"));
    let real = folder.canonicalize().unwrap_or_else(|_| folder.to_owned());
    if crate::output::system_folder(folder) || crate::output::system_folder(&real) {
        return Err(format!(
            "its folder {} is the filesystem's root, a system folder or one all share (workers may report models \
             under a dataset's folder); keep the dataset in a folder of its own",
            folder.display()
        ));
    }
    LocalFile::new(path).stat().map(drop).map_err(|err| err.to_string())
}

fn read_from(mut file: std::fs::File, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(max.min(1 << 24));
    file.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(unix)]
fn file_id(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!("{}:{}", meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_id(meta: &std::fs::Metadata) -> String {
    format!("{:?}", meta.created().ok())
}

/// An index object on S3, read by ranged GETs from the last offset. S3 replaces an object
/// whole on every write, so its identity cannot tell an append from a replacement: only a
/// shrink is detected.
pub struct S3Index {
    pub op: opendal::blocking::Operator,
    /// The key inside the operator's bucket.
    pub key: String,
    /// `s3://bucket/key`, for messages.
    pub url: String,
}

impl S3Index {
    /// Opens `s3://bucket/key` with `s3`'s credentials. Call within a tokio runtime context.
    pub fn open(
        url: &str,
        s3: Option<&perennial_storage::S3Credentials>,
    ) -> Result<Self, perennial_storage::StorageError> {
        let (op, key) = perennial_storage::locate(url, s3)?;
        let op = opendal::blocking::Operator::new(op)
            .map_err(|source| perennial_storage::StorageError::Io { url: url.to_owned(), source })?;
        Ok(S3Index { op, key, url: url.to_owned() })
    }
}

impl IndexFile for S3Index {
    fn stat(&mut self) -> std::io::Result<Option<FileStat>> {
        match self.op.stat(&self.key) {
            Ok(meta) => Ok(Some(FileStat { len: meta.content_length(), id: "s3".into() })),
            Err(err) if err.kind() == opendal::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(std::io::Error::other(err)),
        }
    }

    fn read_at(&mut self, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
        let options =
            opendal::options::ReadOptions { range: (offset..offset + max as u64).into(), ..Default::default() };
        match self.op.read_options(&self.key, options) {
            Ok(buffer) => Ok(buffer.to_vec()),
            Err(err) if err.kind() == opendal::ErrorKind::RangeNotSatisfied => Ok(Vec::new()),
            Err(err) => Err(std::io::Error::other(err)),
        }
    }

    fn name(&self) -> String {
        self.url.clone()
    }
}
