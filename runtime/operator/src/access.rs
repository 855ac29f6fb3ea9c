//! Who may be offered a compile of an `oci://` policy. The operator compiles each component once
//! per repository for every job that names it; before a job is offered it, the job's own
//! reference must be shown to hold that component with the job's own login (its
//! `imagePullSecrets`, else the operator's docker config, else anonymously): its manifest is
//! read, and its layer must be the component. A job that names a private component's digest
//! without access to it is refused, as its own pull would be. A proof stands for
//! [`PROOF_STANDS`] (then made again, the old one standing meanwhile: a login taken away stops
//! the offers within it), a refusal for [`RETRY_REFUSED`] (then checked again, the refusal
//! standing meanwhile). A reference pinned only by its manifest's digest (`@sha256:`) is read
//! the same way, with the job's login: the layer it holds is the component (a manifest named by
//! digest never changes), and the read is the job's proof of access to it. The manifest alone
//! proves nothing across repositories (a registry of one's own can make one name any layer):
//! compiles are shared within a repository only (`artifacts::Key`).

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use perennial_oci::{OciRef, Options};
use perennial_types::{RegistryAuth, RegistryLogin};

use super::artifacts::RETRY_REFUSED;

/// How long a proof of access stands.
pub const PROOF_STANDS: Duration = Duration::from_secs(600);
/// A manifest is small; the whole read is bounded in time.
const MANIFEST_READ: (u64, Duration) = (1 << 20, Duration::from_secs(30));

/// Whether a job may be offered a compile of its `oci://` reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// The reference holds this component (hex SHA-256), read with the job's login.
    Proven(String),
    Checking,
    Refused(String),
}

#[derive(Clone, Debug)]
struct Proof {
    access: Access,
    at: Instant,
    /// A check is under way (a stale proof stands meanwhile).
    checking: bool,
}

/// The proofs made, by (reference, component, login).
#[derive(Default)]
pub struct Proofs {
    by_key: Mutex<HashMap<u64, Proof>>,
}

impl Proofs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Proof>> {
        self.by_key.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `login` (`None`: the operator's own docker config) may pull `oci` as component
    /// `sha256` (`None`: whatever its manifest digest holds): proven (with the component),
    /// being checked (started now), or refused and why. `checked` is called when a check ends
    /// (the offers are made again).
    pub fn access(
        self: &Arc<Self>,
        oci: &OciRef,
        sha256: Option<&str>,
        login: Option<&RegistryLogin>,
        checked: impl FnOnce() + Send + 'static,
    ) -> Access {
        let key = proof_key(oci, sha256, login);
        let mut proofs = self.lock();
        let stale = |proof: &Proof| match proof.access {
            Access::Proven(_) => proof.at.elapsed() >= PROOF_STANDS,
            Access::Refused(_) => proof.at.elapsed() >= RETRY_REFUSED,
            Access::Checking => false,
        };
        match proofs.get_mut(&key) {
            Some(proof) if proof.checking || !stale(proof) => return proof.access.clone(),
            // A proof or refusal gone stale stands while it is made again (a refusal flipped to
            // "checking" would turn a node's offer from refused to compiling and back each
            // minute, for a registry only the nodes reach).
            Some(proof) => proof.checking = true,
            None => {
                proofs.insert(key, Proof { access: Access::Checking, at: Instant::now(), checking: true });
            }
        }
        let access = proofs.get(&key).map(|proof| proof.access.clone()).unwrap_or(Access::Checking);
        drop(proofs);
        let (this, oci, sha256) = (self.clone(), oci.clone(), sha256.map(str::to_owned));
        let auth = login.map(|login| RegistryAuth {
            logins: [(oci.registry.clone(), login.clone())].into(),
            ..RegistryAuth::default()
        });
        tokio::spawn(async move {
            let access = prove(&oci, sha256.as_deref(), auth.as_ref()).await;
            if let Access::Refused(why) = &access {
                tracing::info!(reference = %oci, "a job is not offered its compiled policy: {why}");
            }
            this.lock().insert(key, Proof { access, at: Instant::now(), checking: false });
            checked();
        });
        access
    }
}

/// Reads `oci`'s manifest with `auth`: its layer must be component `sha256`, if given.
async fn prove(oci: &OciRef, sha256: Option<&str>, auth: Option<&RegistryAuth>) -> Access {
    let (max_bytes, timeout) = MANIFEST_READ;
    let options = match Options::for_job(oci, auth, max_bytes, timeout) {
        Ok(options) => options,
        Err(err) => return Access::Refused(err),
    };
    match perennial_oci::resolve(oci, &options).await {
        Ok(resolved) => match sha256 {
            Some(sha256) if resolved.component_sha256 != sha256 => Access::Refused(format!(
                "{oci} holds the component with sha256 {}, not the {sha256} the job pins",
                resolved.component_sha256
            )),
            _ => Access::Proven(resolved.component_sha256),
        },
        Err(err) => Access::Refused(format!("{oci}: {err}")),
    }
}

/// The key of a proof: the reference, the component, and the login (its password hashed, held
/// only in this process).
fn proof_key(oci: &OciRef, sha256: Option<&str>, login: Option<&RegistryLogin>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (oci.to_string(), sha256).hash(&mut hasher);
    if let Some(login) = login {
        (&login.secret, &login.username, login.password.expose()).hash(&mut hasher);
    }
    hasher.finish()
}
