//! The pod builder: a pure function from (job, dataset, the stage machine's worker spec) to the
//! Pod the operator creates, reproducing Sedna's contract (`reference/sedna.md` §2.3–2.4) so that
//! Sedna's worker images run unchanged:
//!
//! - `generateName` `<job>-train-` / `-eval-` / `-inference-`, the three
//!   `lifelonglearningjob.sedna.io/` labels (and Perennial's round label), the controller owner
//!   reference, `hostNetwork` with `ClusterFirstWithHostNet`, OnFailure for train and eval;
//! - Sedna's env after the template's, in a fixed order;
//! - host paths mounted under `/home/data` (the parent folder, as Sedna does) with
//!   `DATA_PATH_PREFIX`; remote inputs pre-downloaded by an init container into a `/downloads`
//!   volume that the workers mount read-only.
//!
//! Unlike Sedna, S3 keys reach containers only through `secretKeyRef` (the builder never sees a
//! secret's data), and each download says which credential it needs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, Pod, PodSpec, SecretKeySelector,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::env::{WorkerContext, sedna_env};
use perennial_api::{Dataset, LifelongLearningJob, Stage};
use perennial_lifecycle::WorkerSpec;

/// Where host paths appear in workers (Sedna's `DATA_PATH_PREFIX`).
pub const DATA_PATH_PREFIX: &str = "/home/data";
/// Where remote inputs are downloaded to.
pub const DOWNLOADS: &str = "/downloads";
const DOWNLOADS_VOLUME: &str = "sedna-storage-initializer";
/// Label with the round a worker serves (Perennial's; Sedna parses pod names instead).
pub const ROUND_LABEL: &str = "perennial.io/round";
/// Label with the worker's kind and round (`train-3`, `inference-4`): one label selector can
/// then name pods of different kinds and rounds, so that a Deploy removes the inference pod it
/// replaces and the finished pods of past rounds in one request.
pub const WORKER_ROUND_LABEL: &str = "perennial.io/worker-round";

/// The [`WORKER_ROUND_LABEL`] value of a `kind` worker of `round`.
pub fn worker_round(kind: &str, round: u64) -> String {
    format!("{kind}-{round}")
}

/// An S3 credential Secret as the pod needs it: its name, and the endpoint from its annotations
/// (`s3-endpoint`, `s3-usehttps`), which is not secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    pub secret: String,
    /// `https://host[:port]` or `http://...`.
    pub endpoint_url: String,
}

/// What the pod is made from, beyond the worker spec.
#[derive(Clone, Debug)]
pub struct PodContext<'a> {
    pub job: &'a LifelongLearningJob,
    pub dataset: &'a Dataset,
    pub worker_name: &'a str,
    /// The edge agent's worker API as workers reach it (`http://localhost:9100`, host network).
    pub lc_server: &'a str,
    pub kb_server: &'a str,
    /// The operator's own image: its `perennial fetch` downloads remote inputs.
    pub fetch_image: &'a str,
    /// The job's `credentialName` Secret, resolved.
    pub job_credential: Option<Credential>,
    /// The dataset's `credentialName` Secret, resolved.
    pub dataset_credential: Option<Credential>,
}

/// Which credential a URL needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Job,
    Dataset,
}

/// One download of `perennial fetch`, by its flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fetch {
    Job,
    Dataset,
    /// A round's sample index, written by the edge into the job's output, naming the dataset's
    /// files: the index read with the job's credential, its files with the dataset's.
    DatasetIndex,
}

impl Fetch {
    fn flag(self) -> &'static str {
        match self {
            Fetch::Job => "--job",
            Fetch::Dataset => "--dataset",
            Fetch::DatasetIndex => "--dataset-index",
        }
    }

    /// The credentials the download reads with.
    fn credentials(self) -> &'static [Owner] {
        match self {
            Fetch::Job => &[Owner::Job],
            Fetch::Dataset => &[Owner::Dataset],
            Fetch::DatasetIndex => &[Owner::Job, Owner::Dataset],
        }
    }
}

/// How one env value that is a URL reaches the worker.
struct UrlEnv {
    name: &'static str,
    download: bool,
    owner: Owner,
}

/// The URL-valued env of each stage, in Sedna's terms (§2.3's tables). Unlike Sedna, the eval
/// set (`TEST_DATASET_URL`, written to the job's outputDir) is read with the job's credential.
/// `CLOUD_KB_INDEX` stays the raw path: Sedna's library joins `DATA_PATH_PREFIX` to it itself.
fn url_env(stage: Stage) -> &'static [UrlEnv] {
    const fn u(name: &'static str, download: bool, owner: Owner) -> UrlEnv {
        UrlEnv { name, download, owner }
    }
    const TRAIN: &[UrlEnv] = &[
        u("OUTPUT_URL", false, Owner::Job),
        u("TRAIN_DATASET_URL", true, Owner::Job),
        u("ORIGINAL_DATASET_URL", true, Owner::Dataset),
    ];
    const EVAL: &[UrlEnv] = &[
        u("MODEL_URLS", true, Owner::Job),
        u("OUTPUT_URL", false, Owner::Job),
        u("TEST_DATASET_URL", true, Owner::Job),
        u("ORIGINAL_DATASET_URL", true, Owner::Dataset),
    ];
    // The inference worker mounts only `<outputDir>/deploy` (its model); `OUTPUT_URL` is the raw
    // outputDir, as Sedna gives it, so that other jobs' outputs beside it stay out of the pod.
    const DEPLOY: &[UrlEnv] = &[u("MODEL_URLS", false, Owner::Job)];
    match stage {
        Stage::Train => TRAIN,
        Stage::Eval => EVAL,
        Stage::Deploy => DEPLOY,
    }
}

/// Builds the pod for `spec`'s stage and round.
pub fn build_pod(spec: &WorkerSpec, ctx: &PodContext<'_>) -> Pod {
    let job = ctx.job;
    let name = job.metadata.name.clone().unwrap_or_default();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let template = match spec.stage {
        Stage::Train => &job.spec.train_spec.template,
        Stage::Eval => &job.spec.eval_spec.template,
        Stage::Deploy => &job.spec.deploy_spec.template,
    };
    let kind = spec.stage.worker_kind();
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = template_meta.labels.clone().unwrap_or_default();
    labels.insert("lifelonglearningjob.sedna.io/name".into(), name.clone());
    labels.insert("lifelonglearningjob.sedna.io/uid".into(), uid.clone());
    labels.insert("lifelonglearningjob.sedna.io/worker-type".into(), kind.into());
    labels.insert(ROUND_LABEL.into(), spec.round.to_string());
    labels.insert(WORKER_ROUND_LABEL.into(), worker_round(kind, spec.round));
    let metadata = ObjectMeta {
        generate_name: Some(format!("{name}-{kind}-")),
        namespace: job.metadata.namespace.clone(),
        labels: Some(labels),
        annotations: template_meta.annotations.clone(),
        finalizers: template_meta.finalizers.clone(),
        owner_references: Some(vec![OwnerReference {
            api_version: "sedna.io/v1alpha1".into(),
            kind: "LifelongLearningJob".into(),
            name: name.clone(),
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..ObjectMeta::default()
    };

    let namespace = job.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let worker = WorkerContext {
        namespace: &namespace,
        job_name: &name,
        worker_name: ctx.worker_name,
        lc_server: ctx.lc_server,
        kb_server: ctx.kb_server,
        output_dir: &job.spec.output_dir,
        dataset_url: &ctx.dataset.spec.url,
    };
    let mut mounts = Mounts::default();
    let mut env: Vec<EnvVar> = Vec::new();
    for (key, value) in sedna_env(spec, &worker) {
        let value = match url_env(spec.stage).iter().find(|u| u.name == key) {
            Some(how) => mounts.translate(&value, how, ctx),
            None => value,
        };
        env.push(plain(&key, &value));
    }
    if mounts.host_path {
        env.push(plain("DATA_PATH_PREFIX", DATA_PATH_PREFIX));
    }
    // Keys by reference only; the endpoint is not secret.
    let s3_used = |owner| mounts.s3_raw.contains(&owner);
    for (owner, credential) in [(Owner::Job, &ctx.job_credential), (Owner::Dataset, &ctx.dataset_credential)] {
        if let (true, Some(credential)) = (s3_used(owner), credential) {
            env.extend(s3_env("", credential));
            break; // one set per container: Sedna's workers read one S3_ENDPOINT_URL
        }
    }

    let mut pod_spec: PodSpec = template.spec.clone().unwrap_or_default();
    pod_spec.host_network = Some(true);
    pod_spec.dns_policy = Some("ClusterFirstWithHostNet".into());
    if spec.stage != Stage::Deploy && pod_spec.restart_policy.is_none() {
        pod_spec.restart_policy = Some("OnFailure".into());
    }
    for container in &mut pod_spec.containers {
        container.env.get_or_insert_with(Vec::new).extend(env.iter().cloned());
        container.volume_mounts.get_or_insert_with(Vec::new).extend(mounts.app_mounts.iter().cloned());
    }
    if !mounts.downloads.is_empty() {
        pod_spec.init_containers.get_or_insert_with(Vec::new).insert(0, mounts.initializer(ctx));
        mounts.volumes.push(Volume {
            name: DOWNLOADS_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    pod_spec.volumes.get_or_insert_with(Vec::new).extend(mounts.volumes);
    Pod { metadata, spec: Some(pod_spec), status: None }
}

/// The volumes, mounts and downloads the URLs of one pod need.
#[derive(Default)]
struct Mounts {
    volumes: Vec<Volume>,
    app_mounts: Vec<VolumeMount>,
    host_path: bool,
    /// How `perennial fetch` gets it, source, destination folder.
    downloads: Vec<(Fetch, String, String)>,
    /// Credentials the workers need for raw `s3://` values.
    s3_raw: Vec<Owner>,
}

impl Mounts {
    /// The env value a worker sees for `value` (one URL, or several joined by `;`).
    fn translate(&mut self, value: &str, how: &UrlEnv, ctx: &PodContext<'_>) -> String {
        let parts: Vec<String> = value.split(';').filter(|u| !u.is_empty()).map(|u| self.one(u, how, ctx)).collect();
        parts.join(";")
    }

    fn one(&mut self, url: &str, how: &UrlEnv, ctx: &PodContext<'_>) -> String {
        match url.split_once("://") {
            None => {
                let parent = url.rsplit_once('/').map(|(dir, _)| dir).filter(|d| !d.is_empty()).unwrap_or("/");
                let volume = volume_name(&format!("{parent}/"));
                if !self.volumes.iter().any(|v| v.name == volume) {
                    self.volumes.push(Volume {
                        name: volume.clone(),
                        host_path: Some(HostPathVolumeSource {
                            path: parent.to_owned(),
                            type_: Some("Directory".into()),
                        }),
                        ..Volume::default()
                    });
                    self.app_mounts.push(VolumeMount {
                        name: volume,
                        mount_path: format!("{DATA_PATH_PREFIX}{parent}"),
                        ..VolumeMount::default()
                    });
                }
                self.host_path = true;
                format!("{DATA_PATH_PREFIX}{url}")
            }
            Some((_, rest)) if how.download => {
                // /downloads/<bucket or host>/<key>; the index of a remote txt dataset is indirect.
                let local = format!("{DOWNLOADS}/{rest}");
                let folder = local.rsplit_once('/').map(|(dir, _)| dir.to_owned()).unwrap_or(local.clone());
                // A remote dataset's round index (see `Fetch::DatasetIndex`).
                let indirect = how.name == "ORIGINAL_DATASET_URL" && url != ctx.dataset.spec.url;
                let fetch = match (indirect, how.owner) {
                    (true, _) => Fetch::DatasetIndex,
                    (false, Owner::Job) => Fetch::Job,
                    (false, Owner::Dataset) => Fetch::Dataset,
                };
                self.downloads.push((fetch, url.to_owned(), folder));
                if !self.app_mounts.iter().any(|m| m.name == DOWNLOADS_VOLUME) {
                    self.app_mounts.push(VolumeMount {
                        name: DOWNLOADS_VOLUME.into(),
                        mount_path: DOWNLOADS.into(),
                        read_only: Some(true),
                        ..VolumeMount::default()
                    });
                }
                local
            }
            Some(_) => {
                if !self.s3_raw.contains(&how.owner) {
                    self.s3_raw.push(how.owner);
                }
                url.to_owned()
            }
        }
    }

    /// The init container: `perennial fetch --job SRC DST --dataset SRC DST --dataset-index SRC
    /// DST ...`, each download with its own credential (Sedna gives one set for all).
    fn initializer(&self, ctx: &PodContext<'_>) -> Container {
        let mut args = vec!["fetch".to_owned()];
        for (fetch, source, destination) in &self.downloads {
            args.push(fetch.flag().to_owned());
            args.push(source.clone());
            args.push(destination.clone());
        }
        let mut env = Vec::new();
        let needs = |owner| self.downloads.iter().any(|(fetch, ..)| fetch.credentials().contains(&owner));
        if let (true, Some(credential)) = (needs(Owner::Job), &ctx.job_credential) {
            env.extend(s3_env("", credential));
        }
        if let (true, Some(credential)) = (needs(Owner::Dataset), &ctx.dataset_credential) {
            env.extend(s3_env("DATASET_", credential));
        }
        Container {
            name: "storage-initializer".into(),
            image: Some(ctx.fetch_image.to_owned()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(vec!["perennial".into()]),
            args: Some(args),
            env: Some(env),
            volume_mounts: Some(vec![VolumeMount {
                name: DOWNLOADS_VOLUME.into(),
                mount_path: DOWNLOADS.into(),
                ..VolumeMount::default()
            }]),
            resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some(BTreeMap::from([
                    ("cpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into())),
                    ("memory".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into())),
                ])),
                ..Default::default()
            }),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Container::default()
        }
    }
}

fn plain(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

/// `S3_ENDPOINT_URL` as a value, the keys from the Secret (`prefix` for a second set).
fn s3_env(prefix: &str, credential: &Credential) -> Vec<EnvVar> {
    let from_secret = |name: &str, key: &str| EnvVar {
        name: format!("{prefix}{name}"),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: credential.secret.clone(),
                key: key.into(),
                optional: None,
            }),
            ..EnvVarSource::default()
        }),
    };
    let [endpoint, access_key, secret_key] = S3_ENV;
    vec![
        plain(&format!("{prefix}{endpoint}"), &credential.endpoint_url),
        from_secret(access_key, access_key),
        from_secret(secret_key, secret_key),
    ]
}

/// The S3 env of a worker that reads S3 (Sedna's names; the keys by reference to the Secret).
pub const S3_ENV: [&str; 3] = ["S3_ENDPOINT_URL", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY"];

/// Sedna's volume name for a host folder: RFC 1123, at most 63 characters, a trailing `-`
/// made `z` (`/output/train/` → `output-trainz`).
pub fn volume_name(path: &str) -> String {
    let mut name: String =
        path.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    name = name.trim_start_matches('-').to_owned();
    name.truncate(63);
    if name.ends_with('-') {
        name.pop();
        name.push('z');
    }
    if name.is_empty() { "sedna-default-volume-name".into() } else { name }
}

/// A Secret's S3 endpoint, from Sedna's annotations (`s3-endpoint`, `s3-usehttps`: "0" is http).
pub fn endpoint_url(annotations: &BTreeMap<String, String>) -> Option<String> {
    let endpoint = annotations.get("s3-endpoint")?;
    let scheme = if annotations.get("s3-usehttps").map(String::as_str) == Some("0") { "http" } else { "https" };
    Some(format!("{scheme}://{endpoint}"))
}

#[cfg(test)]
mod tests;
