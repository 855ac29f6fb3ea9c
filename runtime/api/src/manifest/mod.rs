//! Reads manifests: YAML (or JSON) files with one or more documents, or folders of them (not
//! recursive). Each document is a `sedna.io/v1alpha1` Dataset or LifelongLearningJob, or a `v1`
//! Pod (which the embedded mode runs as a local process, e.g. a data generator). An error names
//! the file, the document and the field.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;

use super::{Dataset, LifelongLearningJob};

mod fields;
mod json;

/// One object read from a manifest.
#[derive(Clone, Debug)]
pub enum Object {
    Dataset(Box<Dataset>),
    Job(Box<LifelongLearningJob>),
    Pod(Box<Pod>),
}

/// An object and where it came from.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub object: Object,
    /// The file it was read from.
    pub file: PathBuf,
    /// Its document in that file, from 1.
    pub document: usize,
}

impl Manifest {
    /// `file (document N)`, for messages.
    pub fn origin(&self) -> String {
        format!("{} (document {})", self.file.display(), self.document)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: no .yaml, .yml or .json files in this folder")]
    EmptyFolder { path: String },
    #[error("{path} (document {document}): {message}")]
    Document { path: String, document: usize, message: String },
}

/// Reads every object from `paths` (files or folders), in order: a folder's files by name.
pub fn load(paths: &[PathBuf]) -> Result<Vec<Manifest>, ManifestError> {
    let mut out = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| read_error(path, source))?;
        if meta.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| read_error(path, source))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && is_manifest(p))
                .collect();
            if files.is_empty() {
                return Err(ManifestError::EmptyFolder { path: path.display().to_string() });
            }
            files.sort();
            for file in files {
                out.extend(load_file(&file)?);
            }
        } else {
            out.extend(load_file(path)?);
        }
    }
    Ok(out)
}

fn is_manifest(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

fn read_error(path: &Path, source: std::io::Error) -> ManifestError {
    ManifestError::Read { path: path.display().to_string(), source }
}

/// A manifest file larger than this is refused before it is read: the API server takes at most
/// 3 MiB in one request, and a job's manifest is a few KB.
pub const MAX_FILE_BYTES: u64 = 3 * 1024 * 1024;
/// Nesting deeper than this is refused (a Pod template is about 12 levels deep).
pub const MAX_DEPTH: usize = 64;

/// Reads every document of one file: a regular file of at most [`MAX_FILE_BYTES`].
pub fn load_file(path: &Path) -> Result<Vec<Manifest>, ManifestError> {
    let refused = |message: String| ManifestError::Read {
        path: path.display().to_string(),
        source: std::io::Error::other(message),
    };
    // Checked before the open, which would wait for a writer on a FIFO.
    let meta = std::fs::metadata(path).map_err(|source| read_error(path, source))?;
    if !meta.is_file() {
        return Err(refused("not a regular file".into()));
    }
    if perennial_types::files::kernel_file(path) {
        return Err(refused("not a data file (a file of the kernel's: procfs, sysfs or the like)".into()));
    }
    let file = std::fs::File::open(path).map_err(|source| read_error(path, source))?;
    let meta = file.metadata().map_err(|source| read_error(path, source))?;
    if !meta.is_file() {
        return Err(refused("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(refused(format!("{} bytes; a manifest file may hold at most {MAX_FILE_BYTES}", meta.len())));
    }
    let mut text = String::new();
    // The size was checked; `take` also bounds a file that grows while it is read.
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_FILE_BYTES + 1), &mut text)
        .map_err(|source| read_error(path, source))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(refused(format!("grew past {MAX_FILE_BYTES} bytes while it was read")));
    }
    parse(&text, path)
}

/// Parses the documents of `text`, read from `file`. Refused: duplicate keys, fields the resource does not have (with the likely intended one), NaN and infinities,
/// nesting deeper than [`MAX_DEPTH`].
pub fn parse(text: &str, file: &Path) -> Result<Vec<Manifest>, ManifestError> {
    if let Some((line, why)) = too_deep_flow(text) {
        // Before the YAML parser, which takes time quadratic in a flow's depth (minutes for
        // 200 KB of `[`).
        return Err(ManifestError::Document {
            path: file.display().to_string(),
            document: 1 + text.lines().take(line - 1).filter(|l| l.starts_with("---")).count(),
            message: format!("line {line}: {why}"),
        });
    }
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document_no = i + 1;
        let error = |message: String| ManifestError::Document {
            path: file.display().to_string(),
            document: document_no,
            message,
        };
        let value: serde_yaml_ng::Value =
            serde::Deserialize::deserialize(document).map_err(|e| error(e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        let value = json::from_yaml(value).map_err(error)?;
        let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let object = match (api_version.as_str(), kind.as_str()) {
            ("sedna.io/v1alpha1", "Dataset") => {
                Object::Dataset(Box::new(typed(value, fields::dataset).map_err(error)?))
            }
            ("sedna.io/v1alpha1", "LifelongLearningJob") => {
                let mut job: LifelongLearningJob = typed(value, fields::job).map_err(error)?;
                anchor_plugin_paths(&mut job, file);
                Object::Job(Box::new(job))
            }
            ("v1", "Pod") => Object::Pod(Box::new(typed(value, || None).map_err(error)?)),
            ("", _) => return Err(error("apiVersion: missing".into())),
            (_, "") => return Err(error("kind: missing".into())),
            (api_version, kind) => {
                return Err(error(format!(
                    "{kind} ({api_version}) is not something Perennial runs; expected sedna.io/v1alpha1 \
                     Dataset or LifelongLearningJob, or v1 Pod"
                )));
            }
        };
        out.push(Manifest { object, file: file.to_owned(), document: document_no });
    }
    Ok(out)
}

/// A job's policies given by a relative path are its manifest's folder's, not the working
/// folder's: the job means the same wherever `perennial run` is started.
fn anchor_plugin_paths(job: &mut LifelongLearningJob, manifest: &Path) {
    let Some(folder) = std::path::absolute(manifest).ok().and_then(|file| file.parent().map(Path::to_path_buf)) else {
        return;
    };
    let anchor = |plugin: &mut String| {
        if let Ok(perennial_types::Source::File(path)) = perennial_types::parse_source(plugin)
            && path.is_relative()
        {
            *plugin = folder.join(path).display().to_string();
        }
    };
    let spec = &mut job.spec;
    let policies = [
        spec.train_spec.trigger.as_mut().and_then(|trigger| trigger.policy.as_mut()),
        spec.dataset.split_policy.as_mut(),
        spec.deploy_spec.select_policy.as_mut(),
    ];
    for policy in policies.into_iter().flatten() {
        anchor(&mut policy.plugin);
        if let Some(shadow) = policy.shadow.as_mut() {
            anchor(&mut shadow.plugin);
        }
    }
}

/// More `[` and `{` than this in one file are refused whatever quotes seem to hide them: a
/// bound on any flow's depth that no slip of [`too_deep_flow`]'s reading of quotes can pass.
pub const MAX_BRACKETS: usize = 10_000;

/// The line where `[` and `{` (outside quotes and comments) first nest deeper than
/// [`MAX_DEPTH`], or where the file's [`MAX_BRACKETS`]th one is, and what was exceeded: an
/// upper bound on a flow's depth, read in one pass.
fn too_deep_flow(text: &str) -> Option<(usize, String)> {
    let (mut depth, mut opened, mut line) = (0usize, 0usize, 1usize);
    let mut quote: Option<u8> = None;
    let mut previous = b'\n';
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'[' || b == b'{' {
            opened += 1;
            if opened > MAX_BRACKETS {
                return Some((line, format!("more than {MAX_BRACKETS} brackets in one file")));
            }
        }
        match (quote, b) {
            (_, b'\n') => {
                line += 1;
                if quote == Some(b'#') {
                    quote = None;
                }
            }
            // An escaped character, a quote included (a newline still counts as a line).
            (Some(b'"'), b'\\') => line += usize::from(bytes.next() == Some(b'\n')),
            (Some(q), _) if q == b && q != b'#' => quote = None,
            (Some(_), _) => {}
            // A quoted scalar starts a value; a quote inside a plain one (`don't`) is a letter.
            (None, b'"' | b'\'') if previous.is_ascii_whitespace() || b"[{,".contains(&previous) => quote = Some(b),
            (None, b'#') if previous.is_ascii_whitespace() => quote = Some(b'#'),
            (None, b'[' | b'{') => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some((line, format!("brackets nested deeper than {MAX_DEPTH} levels")));
                }
            }
            (None, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        previous = b;
    }
    None
}

/// The kind and `namespace/name` of an object, for messages and to tell objects apart.
pub fn identity(object: &Object) -> (&'static str, String) {
    match object {
        Object::Dataset(d) => ("Dataset", super::key(&d.metadata)),
        Object::Job(j) => ("LifelongLearningJob", super::key(&j.metadata)),
        Object::Pod(p) => ("Pod", super::key(&p.metadata)),
    }
}

/// An object given twice (in one file or in two) is refused naming both places: which one
/// was meant cannot be guessed.
pub fn refuse_duplicates(manifests: &[Manifest]) -> Result<(), ManifestError> {
    let mut seen = std::collections::HashMap::new();
    for m in manifests {
        let (kind, key) = identity(&m.object);
        if let Some(first) = seen.insert((kind, key.clone()), m) {
            return Err(ManifestError::Document {
                path: m.file.display().to_string(),
                document: m.document,
                message: format!("{kind} {key} is also in {}; give each object once", first.origin()),
            });
        }
    }
    Ok(())
}

/// Deserializes with the path of a bad field in the error (`spec.dataset.trainProb: invalid
/// type`); a field the type does not have is refused, with the known field it most resembles
/// when `schema` (the resource's OpenAPI schema, made only then: it takes a while) has one.
fn typed<T: DeserializeOwned>(
    value: serde_json::Value,
    schema: fn() -> Option<&'static serde_json::Value>,
) -> Result<T, String> {
    let mut unknown: Option<Vec<fields::Segment>> = None;
    let mut on_unknown = |path: serde_ignored::Path<'_>| {
        let path = fields::segments(&path);
        // Read already, before the type was chosen (kube's derived types skip them).
        let type_field = matches!(path.as_slice(), [fields::Segment::Field(f)] if f == "apiVersion" || f == "kind");
        if unknown.is_none() && !type_field {
            unknown = Some(path);
        }
    };
    let ignored = serde_ignored::Deserializer::new(value, &mut on_unknown);
    let typed = serde_path_to_error::deserialize(ignored).map_err(|err| {
        let path = err.path().to_string();
        if path == "." { err.inner().to_string() } else { format!("{path}: {}", err.inner()) }
    })?;
    match unknown {
        None => Ok(typed),
        Some(path) => Err(fields::unknown_field(&path, schema())),
    }
}
