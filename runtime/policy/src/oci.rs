//! `oci://` policies: pulled from the registry with the docker `config.json`'s credentials,
//! checked against the reference's pins, and kept on disk by digest, so that a registry that is
//! down (or a tag moved to other content) stops neither a restart nor a job whose pinned
//! component is kept: the copy serves, and the load says why once. The registry is asked first:
//! a moved tag is always told. A kept copy serves only a pull that a registry let have it: of
//! the same repository, as the same puller (the same Secret's login, or this machine's own) —
//! never another tenant's job on the node that names the digest.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::engine::COMPONENT_READ;
use perennial_oci::{OciRef, Options, RegistryError};
use perennial_types::RegistryAuth;

/// Components pulled from registries, by SHA-256 (`<hex>.wasm`), which component each
/// manifest digest pulled held (`manifests/<hex>`: a manifest named by digest never changes),
/// and who pulled each from where (`grants/<hex>`: empty files named by a digest of the
/// repository, the puller and the component).
pub struct ComponentStore {
    dir: PathBuf,
}

impl ComponentStore {
    /// A store in `dir` (made when first written).
    pub fn new(dir: PathBuf) -> Self {
        ComponentStore { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The component of hex `sha256`, if kept and intact.
    pub fn get(&self, sha256: &str) -> Option<Vec<u8>> {
        match self.kept(sha256) {
            Kept::Intact(bytes) => Some(bytes),
            Kept::Damaged | Kept::Absent => None,
        }
    }

    /// The copy of the component of hex `sha256`: a damaged one (its bytes are not that digest)
    /// is removed.
    pub fn kept(&self, sha256: &str) -> Kept {
        let path = self.dir.join(format!("{sha256}.wasm"));
        let Ok(bytes) = std::fs::read(&path) else { return Kept::Absent };
        if hex::encode(Sha256::digest(&bytes)) == sha256 {
            return Kept::Intact(bytes);
        }
        if let Err(err) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), "cannot remove the damaged copy of a component: {err}");
        }
        Kept::Damaged
    }

    /// Keeps a component; a failure only costs the copy, so it is logged.
    pub fn put(&self, sha256: &str, bytes: &[u8]) {
        let path = self.dir.join(format!("{sha256}.wasm"));
        if let Err(err) = write_atomically(&self.dir, &path, bytes) {
            tracing::warn!(dir = %self.dir.display(), "cannot keep the pulled component: {err}");
        }
    }

    /// The component the manifest `digest` (`sha256:HEX`) held.
    pub fn component_of(&self, manifest_digest: &str) -> Option<String> {
        let hex = manifest_digest.strip_prefix("sha256:")?;
        let text = std::fs::read_to_string(self.dir.join("manifests").join(hex)).ok()?;
        let text = text.trim();
        (text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| text.to_owned())
    }

    /// Records that `puller` pulled component `sha256` from `oci`'s repository.
    pub fn grant(&self, oci: &OciRef, puller: &str, sha256: &str) {
        let dir = self.dir.join("grants");
        if let Err(err) = write_atomically(&dir, &dir.join(grant_name(oci, puller, sha256)), b"") {
            tracing::warn!(dir = %dir.display(), "cannot record who pulled the kept component: {err}");
        }
    }

    /// Whether `puller` pulled component `sha256` from `oci`'s repository here before.
    pub fn granted(&self, oci: &OciRef, puller: &str, sha256: &str) -> bool {
        self.dir.join("grants").join(grant_name(oci, puller, sha256)).is_file()
    }

    pub fn put_manifest(&self, manifest_digest: &str, component_sha256: &str) {
        let Some(hex) = manifest_digest.strip_prefix("sha256:") else { return };
        let dir = self.dir.join("manifests");
        if let Err(err) = write_atomically(&dir, &dir.join(hex), component_sha256.as_bytes()) {
            tracing::warn!(dir = %dir.display(), "cannot keep the pulled manifest's digest: {err}");
        }
    }
}

fn grant_name(oci: &OciRef, puller: &str, sha256: &str) -> String {
    let mut digest = Sha256::new();
    for part in [&oci.registry, &oci.repository, puller, sha256] {
        digest.update(part.as_bytes());
        digest.update([0]);
    }
    hex::encode(digest.finalize())
}

/// Who a pull of `oci` speaks as: the Secret whose login it uses (or used, read back on a node
/// that did not keep the login), else this machine (its docker config, or anonymously). `None`
/// when the job had a login this node kept nothing of (a state from before the Secrets were
/// kept by name): no kept copy is theirs.
fn puller(oci: &OciRef, auth: Option<&RegistryAuth>) -> Option<String> {
    let Some(auth) = auth else { return Some(THIS_MACHINE.to_owned()) };
    if let Some(login) = auth.login(&oci.registry) {
        return Some(format!("the Secret {}", login.secret));
    }
    if withheld(oci, Some(auth)) {
        return auth.withheld_from.get(&oci.registry).map(|secret| format!("the Secret {secret}"));
    }
    Some(THIS_MACHINE.to_owned())
}

const THIS_MACHINE: &str = "this machine";

/// A kept copy of a component.
pub enum Kept {
    Intact(Vec<u8>),
    /// There was one, but its bytes were not the digest's: it was removed.
    Damaged,
    Absent,
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|err| err.error)?;
    Ok(())
}

/// How to reach `oci`'s registry for a job ([`Options::for_job`]).
fn options(oci: &OciRef, auth: Option<&RegistryAuth>) -> Result<Options, String> {
    Options::for_job(oci, auth, COMPONENT_READ.max_bytes, COMPONENT_READ.timeout)
}

/// Pulls `oci` (checked against `sha256`, the component's pin, if given), or, when the registry
/// cannot be reached, takes the pinned component from `store`; with the job's registry logins
/// (`auth`) if it has some. The message of a failure names what to do, and the job's Secrets that
/// gave nothing; it never holds a credential.
pub async fn fetch(
    oci: &OciRef,
    sha256: Option<&str>,
    store: Option<&ComponentStore>,
    auth: Option<&RegistryAuth>,
) -> Result<Vec<u8>, String> {
    let problems = auth.map(|auth| &auth.problems[..]).unwrap_or_default();
    pull_or_keep(oci, sha256, store, auth).await.map_err(|err| {
        if problems.is_empty() { err } else { format!("{err} (the job's imagePullSecrets: {})", problems.join("; ")) }
    })
}

async fn pull_or_keep(
    oci: &OciRef,
    sha256: Option<&str>,
    store: Option<&ComponentStore>,
    auth: Option<&RegistryAuth>,
) -> Result<Vec<u8>, String> {
    let options = options(oci, auth)?;
    // The component the reference pins: its `sha256:`, else what its manifest digest held.
    let pinned = sha256
        .map(str::to_owned)
        .or_else(|| oci.digest.as_deref().and_then(|digest| store.and_then(|store| store.component_of(digest))));
    let puller = puller(oci, auth);
    // The kept copy of the pinned component, if this puller pulled it from this repository.
    let kept_for_puller = |store: &ComponentStore, sha: &str| match &puller {
        Some(puller) if store.granted(oci, puller, sha) => store.kept(sha),
        _ => Kept::Absent,
    };
    match perennial_oci::pull(oci, pinned.as_deref(), &options).await {
        Ok(pulled) => {
            if let Some(store) = store {
                store.put(&pulled.component_sha256, &pulled.bytes);
                if let Some(puller) = &puller {
                    store.grant(oci, puller, &pulled.component_sha256);
                }
                if let Some(digest) = &oci.digest {
                    store.put_manifest(digest, &pulled.component_sha256);
                }
            }
            Ok(pulled.bytes)
        }
        // The registry down, or its tag moved to other content: the pinned component, if kept,
        // serves (and the reason is said); the other content is never pulled.
        Err(err @ (RegistryError::Unreachable(_) | RegistryError::Moved { .. })) => {
            let kept = match (pinned.as_deref(), store) {
                (Some(sha), Some(store)) => kept_for_puller(store, sha),
                _ => Kept::Absent,
            };
            match (kept, &pinned, store) {
                (Kept::Intact(bytes), Some(sha), Some(store)) => {
                    tracing::warn!(
                        "{oci}: {err}; the component it pins (sha256 {sha}) is served from the copy kept in {}",
                        store.dir().display()
                    );
                    Ok(bytes)
                }
                (Kept::Damaged, Some(sha), Some(store)) => Err(format!(
                    "{err}, and the copy of the component it pins (sha256 {sha}) kept in {} is damaged: it was \
                     removed",
                    store.dir().display()
                )),
                _ if matches!(err, RegistryError::Unreachable(_)) => Err(format!(
                    "{err}, and no copy of the component it pins is kept here as pulled from {}/{} by {}",
                    oci.registry,
                    oci.repository,
                    puller.as_deref().unwrap_or("this job's login")
                )),
                _ => Err(err.to_string()),
            }
        }
        // Refused for want of the job's login, which this node does not keep (read back from its
        // state, before the link brings it again): the pinned component, if kept, serves.
        Err(err @ RegistryError::Denied(_)) if withheld(oci, auth) => match (pinned.as_deref(), store) {
            (Some(sha), Some(store)) => match kept_for_puller(store, sha) {
                Kept::Intact(bytes) => {
                    tracing::warn!(
                        "{oci}: the job's login for {} is not kept on this node and the link has not brought it \
                         yet; the component it pins (sha256 {sha}) is served from the copy kept in {}",
                        oci.registry,
                        store.dir().display()
                    );
                    Ok(bytes)
                }
                Kept::Damaged | Kept::Absent => Err(err.to_string()),
            },
            _ => Err(err.to_string()),
        },
        Err(err) => Err(err.to_string()),
    }
}

/// Whether the job had a login for `oci`'s registry that this node did not keep.
fn withheld(oci: &OciRef, auth: Option<&RegistryAuth>) -> bool {
    auth.is_some_and(|auth| auth.login(&oci.registry).is_none() && auth.withheld.contains(&oci.registry))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference on a local registry, and a job's login for it from the Secret `ml/regcred`.
    fn reference_and_login() -> (OciRef, RegistryAuth) {
        use perennial_types::{Password, RegistryLogin};
        let oci = OciRef::parse("127.0.0.1:5000/team/trigger:v1").unwrap();
        let login =
            RegistryLogin { secret: "ml/regcred".into(), username: "ann".into(), password: Password::new("pw-9") };
        let mut auth = RegistryAuth::default();
        auth.logins.insert("127.0.0.1:5000".into(), login);
        (oci, auth)
    }

    #[test]
    fn the_jobs_login_for_the_registry_is_used_and_named_never_shown() {
        let (oci, auth) = reference_and_login();
        let options = options(&oci, Some(&auth)).unwrap();
        assert_eq!(options.credentials.as_ref().map(|c| c.username.as_str()), Some("ann"));
        assert_eq!(options.credentials_from, "the Secret ml/regcred (the job's imagePullSecrets)");
        assert!(!format!("{options:?} {auth:?}").contains("pw-9"));
        assert!(!withheld(&oci, Some(&auth)), "a login held is used, not withheld");
        let kept = auth.kept_form();
        assert!(withheld(&oci, Some(&kept)), "read back from the edge's state: withheld");
        let other = OciRef::parse("ghcr.io/team/trigger:v1").unwrap();
        assert!(!withheld(&other, Some(&kept)) && !withheld(&oci, None));
    }

    #[test]
    fn a_kept_copy_is_granted_only_to_the_repository_and_puller_that_pulled_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ComponentStore::new(dir.path().to_owned());
        let (oci, auth) = reference_and_login();
        let ann = puller(&oci, Some(&auth)).unwrap();
        assert_eq!(ann, "the Secret ml/regcred");
        store.grant(&oci, &ann, "ab12");
        assert!(store.granted(&oci, &ann, "ab12"));
        // Read back from the edge's state after a restart: still that Secret's.
        assert_eq!(puller(&oci, Some(&auth.kept_form())).as_deref(), Some(ann.as_str()));
        // Another tenant's Secret, this machine's own login, another repository, another component.
        let mut other = auth.clone();
        other.logins.get_mut("127.0.0.1:5000").unwrap().secret = "rival/regcred".into();
        assert!(!store.granted(&oci, &puller(&oci, Some(&other)).unwrap(), "ab12"));
        assert!(!store.granted(&oci, &puller(&oci, None).unwrap(), "ab12"));
        let elsewhere = OciRef::parse("127.0.0.1:5000/rival/trigger:v1").unwrap();
        assert!(!store.granted(&elsewhere, &ann, "ab12"));
        assert!(!store.granted(&oci, &ann, "cd34"));
        // A login withheld without its Secret's name (a state kept before names were): nobody's.
        let mut nameless = auth.kept_form();
        nameless.withheld_from.clear();
        assert_eq!(puller(&oci, Some(&nameless)), None);
    }

    #[test]
    fn a_damaged_copy_is_told_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = ComponentStore::new(dir.path().to_owned());
        let bytes = b"\0asm a component".to_vec();
        let sha = hex::encode(Sha256::digest(&bytes));
        store.put(&sha, &bytes);
        assert!(matches!(store.kept(&sha), Kept::Intact(kept) if kept == bytes));
        let mut flipped = bytes.clone();
        flipped[3] ^= 1;
        std::fs::write(dir.path().join(format!("{sha}.wasm")), flipped).unwrap();
        assert!(matches!(store.kept(&sha), Kept::Damaged));
        assert!(!dir.path().join(format!("{sha}.wasm")).exists(), "removed");
        assert!(matches!(store.kept(&sha), Kept::Absent));
    }
}
