//! Registry logins for a job's `oci://` policies, from the Secrets its worker pod templates name
//! in `imagePullSecrets` (train, eval and deploy: their union), in the job's own namespace.
//!
//! Each reconcile reads them again (a `get` per Secret, only for a job that has an `oci://`
//! reference and names a Secret: no Secret watch, no Secret list; a Secret read serves every job
//! that names it for [`READ_SERVES_FOR`], not one read per reconcile, unless the job itself was
//! changed: a user who fixed a Secret touches the job) and keeps, in memory, only the
//! `auths` entries for the registries the job's references name. The link adds them to the job's
//! config for its node (`config.registryAuth`, [`PullSecrets::auth_of`]); the operator's own
//! compiles for compiler-free nodes pull with them. A Secret missing, forbidden or malformed is
//! said on the job (an Event, and in the message of the pull that fails on the node), by its
//! name and what is wrong, never its content; the job goes on without it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PodTemplateSpec, Secret};
use kube::{Api, Client};

use perennial_api::LifelongLearningJob;
use perennial_types::docker_auths::Auths;
use perennial_types::{Password, PolicyRef, RegistryAuth, RegistryLogin, Source};

/// The type of a Secret made by `kubectl create secret docker-registry`, and its key.
const DOCKER_CONFIG_JSON: (&str, &str) = ("kubernetes.io/dockerconfigjson", ".dockerconfigjson");
/// The older form (a `.dockercfg`: the `auths` map alone).
const DOCKER_CFG: (&str, &str) = ("kubernetes.io/dockercfg", ".dockercfg");
/// The most of a Secret's docker config read (the API server caps a Secret at 1 MiB).
const MAX_CONFIG_BYTES: usize = 1 << 20;

/// Each job's logins, as last read, by job key with the job's uid (a job made again under its
/// name is another job), and the jobs whose logins changed since the link last looked.
#[derive(Default)]
pub struct PullSecrets {
    state: Mutex<State>,
    /// The Secrets read lately, shared by the jobs that name them.
    reads: SecretReads,
    /// Wakes the link's follower ([`PullSecrets::changed`]).
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    by_job: HashMap<String, (String, Arc<RegistryAuth>)>,
    /// Each job's own metadata as last resolved ([`job_metadata`]).
    metadata: HashMap<String, u64>,
    changed: BTreeSet<String>,
}

impl PullSecrets {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `auth` as the logins of job `key` (of `uid`); whether its problems are new (to be
    /// said). An unchanged one wakes nobody.
    pub fn set(&self, key: &str, uid: &str, auth: RegistryAuth) -> bool {
        let mut state = self.lock();
        let before = state.by_job.get(key).filter(|(held, _)| held == uid).map(|(_, auth)| auth.clone());
        if before.as_deref() == Some(&auth) || (before.is_none() && auth.is_empty()) {
            return false;
        }
        let new_problems = !auth.problems.is_empty() && before.is_none_or(|before| before.problems != auth.problems);
        if auth.is_empty() {
            state.by_job.remove(key);
        } else {
            state.by_job.insert(key.to_owned(), (uid.to_owned(), Arc::new(auth)));
        }
        state.changed.insert(key.to_owned());
        drop(state);
        self.wake.notify_one();
        new_problems
    }

    /// Forgets job `key` (deleted).
    pub fn forget(&self, key: &str) {
        let mut state = self.lock();
        state.metadata.remove(key);
        if state.by_job.remove(key).is_some() {
            drop(state);
            self.set_changed(key);
        }
    }

    fn set_changed(&self, key: &str) {
        self.lock().changed.insert(key.to_owned());
        self.wake.notify_one();
    }

    /// Whether job `key`'s own metadata ([`job_metadata`]) changed since it was last told:
    /// a change by a user (an annotation, an apply) has its Secrets read afresh.
    pub fn job_changed(&self, key: &str, metadata: u64) -> bool {
        self.lock().metadata.insert(key.to_owned(), metadata) != Some(metadata)
    }

    /// Whether logins are held for job `key` (of any uid).
    pub fn holds(&self, key: &str) -> bool {
        self.lock().by_job.contains_key(key)
    }

    /// The logins of job `key` if it is the job of `uid`.
    pub fn auth_of(&self, key: &str, uid: Option<&str>) -> Option<Arc<RegistryAuth>> {
        let state = self.lock();
        let (held, auth) = state.by_job.get(key)?;
        (Some(held.as_str()) == uid).then(|| auth.clone())
    }

    /// Waits for a change; the keys of the jobs whose logins changed.
    pub async fn changed(&self) -> BTreeSet<String> {
        loop {
            let changed = std::mem::take(&mut self.lock().changed);
            if !changed.is_empty() {
                return changed;
            }
            self.wake.notified().await;
        }
    }
}

/// What a user changes of a job, hashed: its uid, generation (the spec), labels and annotations.
/// Not its status or pods, which change through a round.
pub fn job_metadata(job: &LifelongLearningJob) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let meta = &job.metadata;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&meta.uid, meta.generation, &meta.labels).hash(&mut hasher);
    // The job's own: a stored copy's templates (`stored_templates`) are not a change.
    let annotations = meta.annotations.iter().flatten();
    annotations.filter(|(key, _)| !super::stored_templates::is_ours(key)).for_each(|pair| pair.hash(&mut hasher));
    hasher.finish()
}

/// The registries (`HOST[:PORT]`) of the job's `oci://` references: its policies and shadows.
pub fn registries(job: &LifelongLearningJob) -> BTreeSet<String> {
    let spec = &job.spec;
    let mut references: Vec<PolicyRef> = vec![spec.trigger_policy(), spec.select_policy()];
    references.extend(spec.dataset.split_policy.clone());
    let shadows: Vec<PolicyRef> =
        references.iter().filter_map(|reference| reference.shadow.as_ref().map(|s| s.as_policy())).collect();
    references.extend(shadows);
    references
        .iter()
        .filter_map(|reference| match perennial_types::parse_source(&reference.plugin) {
            Ok(Source::Oci(oci)) => Some(oci.registry),
            _ => None,
        })
        .collect()
}

/// The most pull Secrets read for a job (each is a read on every reconcile).
pub const MAX_PULL_SECRETS: usize = 8;

/// The Secrets the job's worker pod templates name in `imagePullSecrets`, each once, in the
/// order named (the first that has a registry's login gives it, as for the kubelet).
pub fn secret_names(job: &LifelongLearningJob) -> Vec<String> {
    let Ok(job) = super::stored_templates::restored(job) else {
        return Vec::new(); // a bug, said by the job's reconcile
    };
    let spec = &job.spec;
    let templates: [&PodTemplateSpec; 3] =
        [&spec.train_spec.template, &spec.eval_spec.template, &spec.deploy_spec.template];
    let mut names: Vec<String> = Vec::new();
    let named = templates.iter().filter_map(|template| template.spec.as_ref()?.image_pull_secrets.as_ref()).flatten();
    for name in named.map(|reference| &reference.name).filter(|name| !name.is_empty()) {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// Reads the job's pull Secrets (`afresh`, or each from a recent read that found it) and keeps
/// the logins for its registries; the problems named.
/// A Secret that cannot be read for a while (the API server busy or away) keeps the logins it
/// gave before (`previous`): a hiccup takes no working login from the nodes.
pub async fn resolve(
    client: &Client,
    pull_secrets: &PullSecrets,
    namespace: &str,
    job: &LifelongLearningJob,
    previous: Option<&RegistryAuth>,
    afresh: bool,
) -> RegistryAuth {
    let registries = registries(job);
    let mut names = secret_names(job);
    let mut auth = RegistryAuth::default();
    if registries.is_empty() || names.is_empty() {
        return auth;
    }
    if names.len() > MAX_PULL_SECRETS {
        auth.problems.push(format!(
            "{} Secrets named in imagePullSecrets: only the first {MAX_PULL_SECRETS} are read",
            names.len()
        ));
        names.truncate(MAX_PULL_SECRETS);
    }
    for name in names {
        let shown = format!("{namespace}/{name}");
        // A plain name of this namespace only (a template is not validated for it).
        if let Some(why) = perennial_api::credential_refusal(Some(&name), namespace) {
            auth.problems.push(format!("the Secret {name:?} (imagePullSecrets): {why}"));
            continue;
        }
        let secret = match pull_secrets.reads.get(client, namespace, &name, afresh).await {
            Ok(Read::Found(secret)) => secret,
            Ok(Read::Absent) => {
                auth.problems.push(format!("the Secret {shown} (imagePullSecrets) does not exist"));
                continue;
            }
            Ok(Read::Forbidden) => {
                auth.problems.push(format!(
                    "the operator may not read the Secret {shown} (imagePullSecrets): bind the ClusterRole \
                     perennial-operator-credentials in {namespace}"
                ));
                continue;
            }
            Err(err) => {
                auth.problems.push(format!("the Secret {shown} (imagePullSecrets) could not be read: {}", said(&err)));
                let kept = previous.into_iter().flat_map(|previous| &previous.logins);
                for (registry, login) in kept.filter(|(_, login)| login.secret == shown) {
                    auth.logins.entry(registry.clone()).or_insert_with(|| login.clone());
                }
                continue;
            }
        };
        match logins_of(&secret, &shown, &registries) {
            // The first Secret that has a registry's login gives it (as the kubelet does).
            Ok(logins) => {
                for (registry, login) in logins {
                    auth.logins.entry(registry).or_insert(login);
                }
            }
            Err(why) => auth.problems.push(why),
        }
    }
    auth
}

/// How long a Secret read serves before it is read again: a job is reconciled 10–20 times a
/// round, and jobs share their Secrets. A changed Secret reaches the nodes within this.
pub const READ_SERVES_FOR: Duration = Duration::from_secs(10);

/// A Secret's read: found, absent, or forbidden.
enum Read {
    Found(Arc<Secret>),
    Absent,
    Forbidden,
}

/// The Secrets found in the last [`READ_SERVES_FOR`], by (namespace, name). One missing or
/// forbidden is not kept: it is read again at once (a user creates it or binds the role).
#[derive(Default)]
struct SecretReads(Mutex<HashMap<(String, String), Found>>);

/// A Secret found, and when.
type Found = (Instant, Arc<Secret>);

impl SecretReads {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Found>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The Secret `namespace/name`, from a read of the last [`READ_SERVES_FOR`] that found it,
    /// or read now (`afresh`: read now in any case).
    async fn get(&self, client: &Client, namespace: &str, name: &str, afresh: bool) -> Result<Read, kube::Error> {
        let key = (namespace.to_owned(), name.to_owned());
        let kept = self.lock().get(&key).filter(|(at, _)| !afresh && at.elapsed() < READ_SERVES_FOR).cloned();
        if let Some((_, secret)) = kept {
            return Ok(Read::Found(secret));
        }
        let read = match Api::<Secret>::namespaced(client.clone(), namespace).get_opt(name).await {
            Ok(Some(secret)) => Read::Found(Arc::new(secret)),
            Ok(None) => Read::Absent,
            Err(kube::Error::Api(status)) if status.code == 403 => Read::Forbidden,
            Err(err) => return Err(err),
        };
        let mut reads = self.lock();
        // No Secret kept longer than it serves.
        reads.retain(|_, (at, _)| at.elapsed() < READ_SERVES_FOR);
        match &read {
            Read::Found(secret) => reads.insert(key, (Instant::now(), secret.clone())),
            Read::Absent | Read::Forbidden => reads.remove(&key),
        };
        Ok(read)
    }
}

/// How many jobs' Secrets [`resolve_all`] reads at once.
const RESOLVED_AT_ONCE: usize = 16;

/// Reads the pull Secrets of every job that has `oci://` policies and names some, before the
/// link opens, so that each node gets its jobs' logins with their first state (not a reconcile
/// later, with a pull refused meanwhile); the keys of the jobs that got logins. Only the logins:
/// the problems are said by the job's reconcile, once.
pub async fn resolve_all(
    client: &Client,
    jobs: &[Arc<LifelongLearningJob>],
    pull_secrets: &PullSecrets,
) -> BTreeSet<String> {
    use futures::StreamExt as _;
    let wanted: Vec<Arc<LifelongLearningJob>> =
        jobs.iter().filter(|job| !registries(job).is_empty() && !secret_names(job).is_empty()).cloned().collect();
    // Read now, as they are: the jobs' first reconciles share these reads.
    for job in &wanted {
        pull_secrets.job_changed(&perennial_api::key(&job.metadata), job_metadata(job));
    }
    let resolved: Vec<(Arc<LifelongLearningJob>, RegistryAuth)> = futures::stream::iter(wanted)
        .map(|job| {
            let client = client.clone();
            async move {
                let namespace = job.metadata.namespace.clone().unwrap_or_default();
                let auth = resolve(&client, pull_secrets, &namespace, &job, None, false).await;
                (job, auth)
            }
        })
        .buffer_unordered(RESOLVED_AT_ONCE)
        .collect()
        .await;
    let mut keys = BTreeSet::new();
    for (job, auth) in resolved {
        let Some(uid) = job.metadata.uid.as_deref() else { continue };
        if auth.logins.is_empty() {
            continue;
        }
        let key = perennial_api::key(&job.metadata);
        pull_secrets.set(&key, uid, RegistryAuth { logins: auth.logins, ..RegistryAuth::default() });
        keys.insert(key);
    }
    keys
}

/// What a failed read says, without a body the API server may have echoed.
fn said(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("HTTP {} {}", status.code, status.reason),
        other => other.to_string(),
    }
}

/// The logins a pull Secret (`shown`: `namespace/name`) has for `registries`; entries for other
/// registries are not read. The error names the Secret and what is wrong, never its content.
pub fn logins_of(
    secret: &Secret,
    shown: &str,
    registries: &BTreeSet<String>,
) -> Result<BTreeMap<String, RegistryLogin>, String> {
    let type_ = secret.type_.as_deref().unwrap_or("Opaque");
    let (key, entries_only) = match type_ {
        t if t == DOCKER_CONFIG_JSON.0 => (DOCKER_CONFIG_JSON.1, false),
        t if t == DOCKER_CFG.0 => (DOCKER_CFG.1, true),
        other => {
            return Err(format!(
                "the Secret {shown} (imagePullSecrets) is of type {other}, not {} (`kubectl create secret \
                 docker-registry` makes one)",
                DOCKER_CONFIG_JSON.0
            ));
        }
    };
    let data = secret.data.as_ref().and_then(|data| data.get(key)).map(|bytes| &bytes.0[..]);
    let Some(data) = data else {
        return Err(format!("the Secret {shown} (imagePullSecrets) has no {key} key"));
    };
    if data.len() > MAX_CONFIG_BYTES {
        return Err(format!("the Secret {shown} (imagePullSecrets): its {key} is more than {MAX_CONFIG_BYTES} bytes"));
    }
    // serde's message may quote the text it could not read: only where.
    let not_json = |err: serde_json::Error| {
        format!(
            "the Secret {shown} (imagePullSecrets): its {key} is not a docker config (line {}, column {})",
            err.line(),
            err.column()
        )
    };
    let auths = if entries_only { Auths::of_dockercfg(data) } else { Auths::of_config_json(data) };
    let auths = auths.map_err(not_json)?;
    let mut logins = BTreeMap::new();
    for registry in auths.registries().into_iter().filter(|registry| registries.contains(*registry)) {
        let Some(entry) = auths.entry(registry) else { continue };
        let where_ = format!("the Secret {shown} (imagePullSecrets): its {key}'s auths entry for {registry}");
        let (username, password) = entry.user_and_password().map_err(|why| format!("{where_} {why}"))?;
        logins.insert(
            registry.to_owned(),
            RegistryLogin { secret: shown.to_owned(), username, password: Password::new(password) },
        );
    }
    Ok(logins)
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use k8s_openapi::ByteString;

    use super::*;

    const HOST: &str = "127.0.0.1:5000";

    fn secret(type_: &str, key: &str, data: &str) -> Secret {
        Secret {
            type_: Some(type_.into()),
            data: Some(BTreeMap::from([(key.to_owned(), ByteString(data.as_bytes().to_vec()))])),
            ..Secret::default()
        }
    }

    fn hosts() -> BTreeSet<String> {
        BTreeSet::from([HOST.to_owned()])
    }

    fn base64(text: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    #[test]
    fn the_logins_for_the_jobs_registries_only() {
        let json = format!(
            r#"{{"auths": {{"{HOST}": {{"auth": "{}"}}, "ghcr.io": {{"username": "x", "password": "other-pw"}}}}}}"#,
            base64("ann:pw:with-colon")
        );
        let logins =
            logins_of(&secret(DOCKER_CONFIG_JSON.0, ".dockerconfigjson", &json), "ml/regcred", &hosts()).expect("read");
        assert_eq!(logins.keys().collect::<Vec<_>>(), [HOST], "ghcr.io's entry is not kept");
        let login = &logins[HOST];
        assert_eq!((login.username.as_str(), login.password.expose()), ("ann", "pw:with-colon"));
        assert_eq!(login.secret, "ml/regcred");
        // Username and password; a URL key (as `docker login` writes Docker Hub's).
        let json = format!(r#"{{"auths": {{"http://{HOST}/v1/": {{"username": "bo", "password": "pw"}}}}}}"#);
        let logins = logins_of(&secret(DOCKER_CONFIG_JSON.0, ".dockerconfigjson", &json), "ml/r", &hosts()).unwrap();
        assert_eq!(logins[HOST].username, "bo");
        // The older .dockercfg: the entries alone.
        let cfg = format!(r#"{{"{HOST}": {{"auth": "{}"}}}}"#, base64("cy:pw"));
        let logins = logins_of(&secret(DOCKER_CFG.0, ".dockercfg", &cfg), "ml/old", &hosts()).unwrap();
        assert_eq!(logins[HOST].username, "cy");
        // A malformed entry for another registry is not read, so not refused.
        let json =
            format!(r#"{{"auths": {{"ghcr.io": {{"auth": "!!"}}, "{HOST}": {{"auth": "{}"}}}}}}"#, base64("a:b"));
        assert!(logins_of(&secret(DOCKER_CONFIG_JSON.0, ".dockerconfigjson", &json), "ml/r", &hosts()).is_ok());
        // No entry for the job's registry: no login, no error (another Secret may have it).
        let json = r#"{"auths": {"ghcr.io": {"auth": "eDp5"}}}"#;
        assert!(
            logins_of(&secret(DOCKER_CONFIG_JSON.0, ".dockerconfigjson", json), "ml/r", &hosts()).unwrap().is_empty()
        );
    }

    #[test]
    fn a_bad_secret_is_named_and_never_quoted() {
        let password = "Sup3r-s3cret";
        let mut said = Vec::new();
        let mut refused = |secret: Secret| {
            let err = logins_of(&secret, "ml/regcred", &hosts()).unwrap_err();
            said.push(err.clone());
            err
        };
        let config = |data: &str| secret(DOCKER_CONFIG_JSON.0, ".dockerconfigjson", data);
        let err = refused(config(&format!(r#"{{"auths": {{"{password}"#)));
        let start = "the Secret ml/regcred (imagePullSecrets): its .dockerconfigjson is not a docker config";
        assert!(err.starts_with(start), "{err}");
        let err = refused(secret(DOCKER_CONFIG_JSON.0, ".dockercfg", "{}"));
        assert_eq!(err, "the Secret ml/regcred (imagePullSecrets) has no .dockerconfigjson key");
        let err = refused(secret("Opaque", ".dockerconfigjson", "{}"));
        assert!(err.contains("is of type Opaque, not kubernetes.io/dockerconfigjson"), "{err}");
        let err = refused(Secret { type_: Some(DOCKER_CONFIG_JSON.0.into()), ..Secret::default() });
        assert!(err.ends_with("has no .dockerconfigjson key"), "{err}");
        let err = refused(config(&format!(r#"{{"auths": {{"{HOST}": {{"auth": "{password}!"}}}}}}"#)));
        assert!(err.ends_with(&format!("auths entry for {HOST} has an auth that is not base64")), "{err}");
        let err = refused(config(&format!(r#"{{"auths": {{"{HOST}": {{"auth": "{}"}}}}}}"#, base64(password))));
        assert!(err.ends_with("has an auth that is not base64 of user:password"), "{err}");
        let err = refused(config(&format!(r#"{{"auths": {{"{HOST}": {{"username": "ann"}}}}}}"#)));
        assert!(err.ends_with("has neither an auth nor a username and password"), "{err}");
        for err in said {
            assert!(!err.contains(password) && !err.contains(&base64(password)), "{err}");
        }
    }

    #[test]
    fn the_jobs_registries_and_secrets() {
        let job: LifelongLearningJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
            "metadata": {"name": "j", "namespace": "ml"},
            "spec": {
                "dataset": {"name": "d", "trainProb": 0.8,
                            "splitPolicy": {"plugin": "oci://ghcr.io/a/split:1", "sha256": "0".repeat(64)}},
                "trainSpec": {"template": {"spec": {"imagePullSecrets": [{"name": "b"}, {"name": "a"}], "containers": []}},
                              "trigger": {"policy": {"plugin": "builtin:threshold-trigger",
                                          "shadow": {"plugin": format!("oci://{HOST}/p/t:1")}}}},
                "evalSpec": {"template": {"spec": {"imagePullSecrets": [{"name": "b"}], "containers": []}}},
                "deploySpec": {"template": {"spec": {"imagePullSecrets": [{"name": "c"}, {"name": ""}], "containers": []}}},
                "outputDir": "/o"}
        }))
        .expect("a job");
        assert_eq!(registries(&job), BTreeSet::from(["ghcr.io".to_owned(), HOST.to_owned()]));
        assert_eq!(secret_names(&job), ["b", "a", "c"], "each once, in the order named");

        // The job store's copy (its templates compact): the same names, the same own metadata.
        let mut stored = job.clone();
        crate::stored_templates::compact(&mut stored);
        assert_eq!(secret_names(&stored), ["b", "a", "c"]);
        assert_eq!(job_metadata(&stored), job_metadata(&job), "a stored copy is not a change by a user");
    }

    #[test]
    fn a_change_wakes_the_link_once_and_problems_are_said_once() {
        let secrets = PullSecrets::default();
        let problem = RegistryAuth {
            problems: vec!["the Secret ml/x (imagePullSecrets) does not exist".into()],
            ..Default::default()
        };
        assert!(!secrets.set("ml/j", "u1", RegistryAuth::default()), "nothing held, nothing to say");
        assert!(secrets.lock().changed.is_empty());
        assert!(secrets.set("ml/j", "u1", problem.clone()), "a new problem is said");
        assert!(!secrets.set("ml/j", "u1", problem.clone()), "the same again: not said again");
        assert_eq!(secrets.auth_of("ml/j", Some("u1")).as_deref(), Some(&problem));
        assert_eq!(secrets.auth_of("ml/j", Some("u2")), None, "another job under the name");
        secrets.forget("ml/j");
        assert_eq!(secrets.auth_of("ml/j", Some("u1")), None);
        assert_eq!(std::mem::take(&mut secrets.lock().changed), BTreeSet::from(["ml/j".to_owned()]));
    }
}
