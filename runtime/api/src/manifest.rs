//! Reads manifests: YAML (or JSON) files with one or more documents, or folders of them (not
//! recursive). Each document is a `sedna.io/v1alpha1` Dataset or LifelongLearningJob, or a `v1`
//! Pod (which the embedded mode runs as a local process, e.g. a data generator). An error names
//! the file, the document and the field.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;

use super::{Dataset, LifelongLearningJob};

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

/// Reads every document of one file.
pub fn load_file(path: &Path) -> Result<Vec<Manifest>, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| read_error(path, source))?;
    parse(&text, path)
}

/// Parses the documents of `text`, read from `file`.
pub fn parse(text: &str, file: &Path) -> Result<Vec<Manifest>, ManifestError> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document_no = i + 1;
        let error = |message: String| ManifestError::Document {
            path: file.display().to_string(),
            document: document_no,
            message,
        };
        let value: serde_json::Value = serde::Deserialize::deserialize(document).map_err(|e| error(e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let object = match (api_version.as_str(), kind.as_str()) {
            ("sedna.io/v1alpha1", "Dataset") => Object::Dataset(Box::new(typed(value).map_err(error)?)),
            ("sedna.io/v1alpha1", "LifelongLearningJob") => Object::Job(Box::new(typed(value).map_err(error)?)),
            ("v1", "Pod") => Object::Pod(Box::new(typed(value).map_err(error)?)),
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

/// Deserializes with the path of a bad field in the error (`spec.dataset.trainProb: invalid type`).
fn typed<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        if path == "." { err.inner().to_string() } else { format!("{path}: {}", err.inner()) }
    })
}
