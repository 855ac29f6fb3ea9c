//! Admission of manifests into the job store. Everything `perennial run` would meet later is
//! checked first — the resources' rules, each object given once, the local commands of the
//! templates and Pods, the job's Dataset, an output folder of the job's own, its policies
//! fetched, compiled and configured — and only then is anything stored, all of it in one
//! transaction. A refused file or live edit leaves the store as it was, so a later run never
//! meets it.

use std::path::{Path, PathBuf};

use perennial_api::manifest::{self, Manifest, Object};
use perennial_api::{self as resources, Dataset};
use perennial_edge::agent::{self, JobConfig, JobPolicies};
use perennial_edge::sqlite::Store;
use perennial_policy::PolicyHost;

use super::RunError;
use super::state::{self, Applied, Stored};

/// What was stored: the keys of the jobs and of the Pods the manifests hold.
#[derive(Default)]
pub struct Admitted {
    pub jobs: Vec<String>,
    pub pods: Vec<String>,
    /// Each admitted job's policies as loaded to check them, with the config they were loaded
    /// for: a run starts with them rather than load them again.
    pub policies: Vec<(JobConfig, JobPolicies)>,
    /// What storing them replaced, to take it back if the run does not start.
    pub undo: state::Undo,
}

/// Reads, checks and stores the manifests at `paths`; nothing is stored unless all pass.
pub async fn admit(
    control: &mut Store,
    state_dir: &Path,
    paths: &[PathBuf],
    host: &PolicyHost,
) -> Result<Admitted, RunError> {
    let manifests = manifest::load(paths)?;
    manifest::refuse_duplicates(&manifests)?;
    let stored_datasets = state::datasets(control)?;
    check_resources(&manifests, &stored_datasets)?;

    // The datasets and jobs as they will be once stored: the given ones over the stored ones.
    let mut datasets = stored_datasets;
    let mut jobs = Vec::new();
    let mut errors = Vec::new();
    for m in &manifests {
        let dir = folder_of(&m.file);
        match &m.object {
            Object::Dataset(d) => {
                let key = resources::key(&d.metadata);
                datasets.retain(|(k, _)| *k != key);
                datasets.push((key, Stored { object: (**d).clone(), uid: String::new(), dir }));
            }
            Object::Job(j) => {
                jobs.push((m, resources::key(&j.metadata), Stored { object: (**j).clone(), uid: String::new(), dir }))
            }
            Object::Pod(p) => {
                let stored = Stored { object: (**p).clone(), uid: String::new(), dir };
                if let Err(err) = super::pod_command(&resources::key(&p.metadata), &stored) {
                    errors.push(format!("{}: {err}", m.origin()));
                }
            }
        }
    }
    let mut prepared = Vec::new();
    let s3 = perennial_storage::S3Credentials::from_env();
    for (m, key, stored) in &jobs {
        match super::prepare_job(state_dir, key, stored, &datasets) {
            Ok(job) => {
                let output_dir = &job.edge_spec.output_dir;
                if let Err(err) = perennial_edge::output::check(output_dir, s3.as_ref()) {
                    errors.push(format!("{}: LifelongLearningJob {key}: spec.outputDir: {err}", m.origin()));
                } else if !output_dir.contains("://") && state_dir.starts_with(Path::new(output_dir)) {
                    errors.push(format!(
                        "{}: LifelongLearningJob {key}: spec.outputDir: {output_dir} holds the state dir {} (workers \
                         may report models under the output folder); give the job a folder inside it or elsewhere",
                        m.origin(),
                        state_dir.display()
                    ));
                }
                if let Err(err) = check_index(&job.edge_spec.dataset_url, s3.as_ref()) {
                    errors.push(format!(
                        "{}: LifelongLearningJob {key}: the index of Dataset {} (spec.url {}): {err}",
                        m.origin(),
                        job.edge_spec.dataset,
                        job.edge_spec.dataset_url
                    ));
                }
                prepared.push((*m, key, stored, job));
            }
            Err(err) => errors.push(format!("{}: {err}", m.origin())),
        }
    }
    let given: Vec<(String, String, String)> = prepared
        .iter()
        .map(|(m, key, _, job)| ((*key).clone(), job.edge_spec.output_dir.clone(), m.origin()))
        .collect();
    let others: Vec<(String, String)> = state::jobs(control)?
        .into_iter()
        .filter(|(key, _)| !given.iter().any(|(k, _, _)| k == key))
        .map(|(key, stored)| (key, super::resolve(state_dir, &stored.object.spec.output_dir)))
        .collect();
    errors.extend(shared_output_dirs(&given, &others));
    if !errors.is_empty() {
        return Err(RunError::Refused(errors));
    }

    let mut policies = Vec::new();
    for (m, key, stored, job) in &prepared {
        let config = super::job_config(key, stored, job.edge_spec.clone());
        match agent::load_policies(host, &config).await {
            Ok(loaded) => {
                loaded.release();
                policies.push((config, loaded));
            }
            Err(err) => {
                let (kind, reason) = (err.kind, err.to_string());
                return Err(RunError::Policy { origin: m.origin(), job: (*key).clone(), kind, reason });
            }
        }
    }
    let mut admitted = store(control, &manifests)?;
    admitted.policies = policies;
    Ok(admitted)
}

/// Whether the job's dataset index can be read as one: credentials for an S3 index, and a local
/// one that is no special file, nor in the kernel's folders.
fn check_index(url: &str, s3: Option<&perennial_storage::S3Credentials>) -> Result<(), String> {
    if url.starts_with("s3://") {
        return perennial_storage::locate(url, s3).map(drop).map_err(|err| err.to_string());
    }
    perennial_edge::index_file::check_local_index(Path::new(url))
}

/// The folder of a manifest file: what relative paths in its templates are under.
fn folder_of(file: &Path) -> PathBuf {
    let dir = file.parent().map(Path::to_owned).unwrap_or_default();
    let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
    dir.canonicalize().unwrap_or(dir)
}

/// The resources' own rules (fields, names, a job's Dataset given or stored).
fn check_resources(manifests: &[Manifest], stored_datasets: &[(String, Stored<Dataset>)]) -> Result<(), RunError> {
    let given_datasets: Vec<String> = manifests
        .iter()
        .filter_map(|m| match &m.object {
            Object::Dataset(d) => Some(resources::key(&d.metadata)),
            _ => None,
        })
        .collect();
    let exists = |key: &str| given_datasets.iter().any(|k| k == key) || stored_datasets.iter().any(|(k, _)| k == key);
    let mut errors = Vec::new();
    for m in manifests {
        let checked = match &m.object {
            Object::Dataset(d) => resources::validate_dataset(d),
            Object::Job(j) => resources::validate_job(j, &exists),
            Object::Pod(p) => resources::validate_pod(p),
        };
        if let Err(mut err) = checked {
            err.object = format!("{}: {}", m.origin(), err.object);
            errors.push(err);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(RunError::Invalid(errors)) }
}

/// Two jobs writing in one folder (or one inside the other's) would overwrite each other's
/// rounds and deployed model while each status claims its own: refused, naming both.
fn shared_output_dirs(given: &[(String, String, String)], others: &[(String, String)]) -> Vec<String> {
    let mut errors = Vec::new();
    for (i, (key, dir, origin)) in given.iter().enumerate() {
        let earlier = given[..i].iter().map(|(k, d, _)| (k, d));
        let stored = others.iter().map(|(k, d)| (k, d));
        if let Some((other, other_dir)) = earlier.chain(stored).find(|(_, d)| overlaps(dir, d)) {
            errors.push(format!(
                "{origin}: LifelongLearningJob {key}: spec.outputDir: {dir} is also where job {other} writes \
                 ({other_dir}); give each job an output folder of its own"
            ));
        }
    }
    errors
}

/// Whether two output locations are the same or one holds the other.
fn overlaps(a: &str, b: &str) -> bool {
    match (a.strip_prefix("s3://"), b.strip_prefix("s3://")) {
        (Some(a), Some(b)) => {
            let (a, b) = (a.trim_end_matches('/'), b.trim_end_matches('/'));
            a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
        }
        (None, None) => {
            // Components compare `a//b/./c/` as `a/b/c`.
            let (a, b): (PathBuf, PathBuf) = (Path::new(a).components().collect(), Path::new(b).components().collect());
            a.starts_with(&b) || b.starts_with(&a)
        }
        _ => false,
    }
}

/// Stores every manifest in one transaction.
fn store(control: &mut Store, manifests: &[Manifest]) -> Result<Admitted, RunError> {
    let mut admitted = Admitted::default();
    let mut rows = Vec::new();
    for m in manifests {
        let (kind, key) = manifest::identity(&m.object);
        let body = match &m.object {
            Object::Dataset(d) => serde_json::to_value(d),
            Object::Job(j) => serde_json::to_value(j),
            Object::Pod(p) => serde_json::to_value(p),
        }
        .map_err(|err| RunError::Job(format!("{}: {err}", m.origin())))?;
        match m.object {
            Object::Job(_) => admitted.jobs.push(key.clone()),
            Object::Pod(_) => admitted.pods.push(key.clone()),
            Object::Dataset(_) => {}
        }
        rows.push((kind, key, body, folder_of(&m.file)));
    }
    let applied: Vec<Applied<'_>> =
        rows.iter().map(|(kind, key, body, dir)| Applied { kind, key, body, dir }).collect();
    admitted.undo = state::apply_all(control, &applied)?;
    Ok(admitted)
}

#[cfg(test)]
mod tests {
    use super::overlaps;

    #[test]
    fn output_folders_overlap_when_equal_or_nested() {
        assert!(overlaps("/s/out", "/s/out/"));
        assert!(overlaps("/s/out", "/s//out/./a"));
        assert!(!overlaps("/s/out", "/s/output"));
        assert!(overlaps("s3://b/jobs/a", "s3://b/jobs/a/x"));
        assert!(!overlaps("s3://b/jobs/a", "s3://b/jobs/ab"));
        assert!(!overlaps("s3://b/jobs/a", "/b/jobs/a"));
    }
}
