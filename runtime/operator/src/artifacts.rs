//! Policies compiled for the nodes' platforms, in the cloud: a node that said its platform when
//! it connected gets, beside each job, an offer per policy ([`PolicyArtifact`]): ready (a signed
//! artifact it fetches over the link by its digest), compiling, or refused with why.
//!
//! Each (component, platform, engine fingerprint) is compiled once, whatever the number of nodes
//! and jobs that use it, by `perennial plugin compile` in a child process at the lowest priority,
//! stopped while the operator calls the API server (`give_way`: a round is never slowed by it; its
//! memory, hundreds of MB for a Python component, is never the operator's), and kept in a folder
//! under a name made of those three digests: it outlives a restart and an upgrade of the
//! toolchain. The child signs with the operator's key; the operator checks each artifact against
//! that key before it offers it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use perennial_artifact::child::map_large_buffers_apart;
use perennial_artifact::child::{release_freed_memory, run_giving_way};
use perennial_artifact::give_way::GiveWay;

use super::access::{Access, Proofs};
use perennial_artifact::signing::{SigningKey, TrustedKey};
use perennial_artifact::{artifact, target as platform};
use perennial_link::cloud_server::ArtifactPiece;
use perennial_link::messages::PolicyPlatform;
use perennial_types::{PolicyArtifact, PolicyRef, RegistryAuth, RegistryLogin, Source};
use tokio::sync::{Semaphore, watch};

/// How long a refused compile stands before a node's next look tries it again (a fetch that
/// failed may work now).
pub const RETRY_REFUSED: Duration = Duration::from_secs(60);

/// The largest artifact kept (a Python policy compiles to ~30 MB).
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// `perennial operator --sign-key`, `--artifact-dir`.
#[derive(Clone, Debug)]
pub struct ArtifactOptions {
    pub sign_key: PathBuf,
    pub dir: PathBuf,
    /// The control plane's work, which each compile gives way to ([`crate::client::ApiHealth::give_way`]).
    pub give_way: Arc<GiveWay>,
}

/// One compile: a component for a platform's engine, and for an `oci://` one the repository
/// it is pulled from. A job's access proof reads only its reference's manifest, which a
/// registry of its own could make name any component: a compile shared across repositories
/// would offer a private component to a job whose repository never held it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    component_sha256: String,
    platform: String,
    fingerprint: String,
    /// `HOST[:PORT]/REPOSITORY` of an `oci://` component.
    repository: Option<String>,
}

impl Key {
    fn file_name(&self) -> String {
        let (component, platform, fingerprint) = (&self.component_sha256, &self.platform, &self.fingerprint);
        match &self.repository {
            None => format!("{component}.{platform}.{fingerprint}.pcwasm"),
            Some(repository) => {
                let repository = perennial_artifact::artifact::sha256_hex(repository.as_bytes());
                format!("{component}.{}.{platform}.{fingerprint}.pcwasm", &repository[..16])
            }
        }
    }
}

#[derive(Clone, Debug)]
enum State {
    Compiling,
    Ready {
        artifact_sha256: String,
        size: u64,
    },
    /// `secret`: the Secret whose login the failed compile pulled with (another job's, perhaps).
    Refused {
        reason: String,
        at: Instant,
        secret: Option<String>,
    },
}

/// A failed compile's reason as told to a job. A compile is shared by the jobs that name the
/// component in one repository; one that pulled with another job's login (`by`: its Secret,
/// which its reason names with its user) is told in general terms, the detail in the
/// operator's log.
fn told_to(reason: String, by: Option<&str>, login: Option<&RegistryLogin>) -> String {
    match by {
        Some(secret) if login.map(|login| login.secret.as_str()) != Some(secret) => {
            FAILED_WITH_ANOTHER_LOGIN.to_owned()
        }
        _ => reason,
    }
}

const FAILED_WITH_ANOTHER_LOGIN: &str = "the compile for this node, made with another job's pull Secret, failed (the \
                                         operator's log says why); it is tried again within a minute";

/// The cloud's compiles and their artifacts.
pub struct Artifacts {
    sign_key: PathBuf,
    trusted: TrustedKey,
    dir: PathBuf,
    /// The program that compiles (this one: `perennial plugin compile`).
    exe: PathBuf,
    /// The built-ins' digests by name, or why they are not known.
    builtins: Result<HashMap<String, String>, String>,
    states: Mutex<HashMap<Key, State>>,
    /// Ready artifacts by their file's digest: what a node asks for.
    files: Mutex<HashMap<String, PathBuf>>,
    /// One compile at a time: the operator's reconciles keep the other core.
    compiles: Arc<Semaphore>,
    give_way: Arc<GiveWay>,
    /// Which jobs' logins may pull which `oci://` components.
    proofs: Arc<Proofs>,
    /// Counts finished compiles: the nodes' offers are made again when it moves.
    finished: watch::Sender<u64>,
}

impl std::fmt::Debug for Artifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Artifacts").field("dir", &self.dir).field("key", &self.trusted.id()).finish()
    }
}

/// Why `--sign-key` or `--artifact-dir` cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactSetupError {
    #[error("--sign-key {0}")]
    Key(String),
    #[error("--artifact-dir {path}: {source}")]
    Dir { path: String, source: std::io::Error },
    #[error("the compiler (this program): {0}")]
    Exe(std::io::Error),
}

impl Artifacts {
    pub fn new(options: &ArtifactOptions) -> Result<Arc<Artifacts>, ArtifactSetupError> {
        let key = SigningKey::from_file(&options.sign_key).map_err(ArtifactSetupError::Key)?;
        let dir_error = |source| ArtifactSetupError::Dir { path: options.dir.display().to_string(), source };
        std::fs::create_dir_all(options.dir.join("tmp")).map_err(dir_error)?;
        let exe = std::env::current_exe().map_err(ArtifactSetupError::Exe)?;
        let builtins = builtin_digests(&exe);
        if let Err(err) = &builtins {
            tracing::warn!("the built-in policies cannot be compiled for the nodes: {err}");
        }
        let artifacts = Artifacts {
            builtins,
            sign_key: options.sign_key.clone(),
            trusted: key.trusted(),
            dir: options.dir.clone(),
            exe,
            states: Mutex::default(),
            files: Mutex::default(),
            compiles: Arc::new(Semaphore::new(1)),
            give_way: options.give_way.clone(),
            proofs: Arc::default(),
            finished: watch::channel(0).0,
        };
        tracing::info!(
            dir = %options.dir.display(),
            "policies are compiled for the nodes that ask, signed by key {}",
            artifacts.trusted.id()
        );
        Ok(Arc::new(artifacts))
    }

    /// Moves each time a compile finishes (the offers it changes are made again).
    pub fn finished(&self) -> watch::Receiver<u64> {
        self.finished.subscribe()
    }

    /// The offer for `reference` to `node`; `None` when the node loads it as it is (a signed
    /// artifact named by the job). Starts the compile when none was made, an `oci://` pull with
    /// the job's `login` for its registry if it has one.
    pub fn offer(
        self: &Arc<Self>,
        reference: &PolicyRef,
        node: &PolicyPlatform,
        login: Option<&RegistryLogin>,
    ) -> Option<PolicyArtifact> {
        let refused = |reason: String| Some(PolicyArtifact::Refused { reason });
        if reference.plugin.ends_with(".pcwasm") {
            return None;
        }
        if let Err(reason) = serves(node) {
            return refused(reason);
        }
        let valid = match reference.validate() {
            Ok(valid) => valid,
            Err(err) => return refused(err),
        };
        let (component_sha256, repository) = match (&valid.source, &valid.sha256) {
            (Source::Builtin(name), _) => match &self.builtins {
                Ok(builtins) => match builtins.get(name) {
                    Some(digest) => (digest.clone(), None),
                    None => return refused(format!("no built-in called {name:?}")),
                },
                Err(err) => return refused(format!("the operator cannot list its built-ins: {err}")),
            },
            (Source::File(path), _) => {
                return refused(format!(
                    "{} is a path on the node: the operator compiles only what it can fetch (builtin:, \
                     https://, s3:// or oci:// with its sha256); or name a .pcwasm made by `perennial plugin compile`",
                    path.display()
                ));
            }
            (Source::Oci(oci), pin) => {
                // Offered only once this job's own login has shown its reference holds the
                // component (a compile made for another job among them: access.rs); a
                // reference pinned by its manifest's digest alone names the component so.
                if pin.is_none() && oci.digest.is_none() {
                    return refused(
                        "the operator compiles an oci:// plugin by digest: pin it with @sha256: (its manifest's) \
                         or sha256: (its component's, as `perennial plugin push` prints it)"
                            .into(),
                    );
                }
                let this = self.clone();
                let checked = move || this.finished.send_modify(|count| *count += 1);
                match self.proofs.access(oci, pin.as_deref(), login, checked) {
                    Access::Proven(component) => (component, Some(format!("{}/{}", oci.registry, oci.repository))),
                    Access::Checking => return Some(PolicyArtifact::Compiling { platform: node.platform.clone() }),
                    Access::Refused(reason) => return refused(reason),
                }
            }
            (_, Some(sha256)) => (sha256.clone(), None),
            (_, None) => return refused("a remote plugin needs its sha256".into()),
        };
        let key = Key {
            component_sha256,
            platform: node.platform.clone(),
            fingerprint: node.fingerprint.clone(),
            repository,
        };
        let mut states = self.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let state = match states.get(&key) {
            Some(State::Refused { at, .. }) if at.elapsed() >= RETRY_REFUSED => None,
            Some(state) => Some(state.clone()),
            None => None,
        };
        let state = match state {
            Some(state) => state,
            None => {
                let state = match self.cached(&key) {
                    Some(ready) => ready,
                    None => {
                        self.start(key.clone(), reference, login.cloned());
                        State::Compiling
                    }
                };
                states.insert(key.clone(), state.clone());
                state
            }
        };
        Some(match state {
            State::Compiling => PolicyArtifact::Compiling { platform: key.platform },
            State::Ready { artifact_sha256, size, .. } => PolicyArtifact::Ready {
                component_sha256: key.component_sha256,
                artifact_sha256,
                size,
                platform: key.platform,
            },
            State::Refused { reason, secret, .. } => {
                PolicyArtifact::Refused { reason: told_to(reason, secret.as_deref(), login) }
            }
        })
    }

    /// A piece of a ready artifact, by its file's digest.
    pub async fn chunk(&self, sha256: &str, offset: u64, max: usize) -> Result<ArtifactPiece, String> {
        let path = self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(sha256).cloned();
        let path = path.ok_or_else(|| format!("this operator has no artifact {sha256}"))?;
        // Freed memory is given back once the last piece is sent (the link's `artifact_sent`).
        tokio::task::spawn_blocking(move || read_piece(&path, offset, max)).await.map_err(|err| err.to_string())?
    }

    /// A sound artifact for `key` left by an earlier compile (this run or an earlier one).
    fn cached(&self, key: &Key) -> Option<State> {
        let path = self.dir.join(key.file_name());
        if !path.is_file() {
            return None;
        }
        match self.check(&path, key) {
            Ok(state) => Some(self.keep(state, path)),
            Err(err) => {
                tracing::warn!(path = %path.display(), "a stored artifact is not sound, compiling again: {err}");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Checks an artifact file against the operator's own key and what it was compiled for
    /// (read in pieces: a Python policy's is tens of MB); its digest and size.
    fn check(&self, path: &Path, key: &Key) -> Result<(String, u64), String> {
        let (header, digest, size) = artifact::open_file(path, &self.trusted, &key.platform, &key.fingerprint)?;
        if header.component_sha256 != key.component_sha256 {
            return Err(format!("compiled from component {}, not {}", header.component_sha256, key.component_sha256));
        }
        Ok((digest, size))
    }

    fn keep(&self, (artifact_sha256, size): (String, u64), path: PathBuf) -> State {
        let mut files = self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        files.insert(artifact_sha256.clone(), path);
        State::Ready { artifact_sha256, size }
    }

    /// Compiles `key` in a child process, then makes the offers again.
    fn start(self: &Arc<Self>, key: Key, reference: &PolicyRef, login: Option<RegistryLogin>) {
        let (this, plugin, pin) = (self.clone(), reference.plugin.clone(), reference.sha256.clone());
        tokio::spawn(async move {
            let Ok(_permit) = this.compiles.clone().acquire_owned().await else { return };
            let started = Instant::now();
            let worker = this.clone();
            let job = key.clone();
            let secret = login.as_ref().map(|login| login.secret.clone());
            let outcome =
                tokio::task::spawn_blocking(move || worker.compile(&job, &plugin, pin.as_deref(), login.as_ref()))
                    .await
                    .unwrap_or_else(|err| Err(format!("the compile stopped: {err}")));
            let state = match outcome {
                Ok((state, path, paused)) => {
                    tracing::info!(
                        component = key.component_sha256,
                        platform = key.platform,
                        "compiled for the nodes in {:.1} s ({:.1} s of it paused while the control plane worked)",
                        started.elapsed().as_secs_f64(),
                        paused.as_secs_f64()
                    );
                    this.keep(state, path)
                }
                Err(reason) => {
                    tracing::warn!(component = key.component_sha256, platform = key.platform, "not compiled: {reason}");
                    State::Refused { reason, at: Instant::now(), secret }
                }
            };
            this.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(key, state);
            this.finished.send_modify(|count| *count += 1);
        });
    }

    /// `perennial plugin compile` in a child, into a folder of its own; the artifact checked and
    /// moved into place.
    fn compile(
        &self,
        key: &Key,
        plugin: &str,
        pin: Option<&str>,
        login: Option<&RegistryLogin>,
    ) -> Result<((String, u64), PathBuf, Duration), String> {
        let out = tempfile::tempdir_in(self.dir.join("tmp")).map_err(|err| format!("a working folder: {err}"))?;
        let mut command = Command::new(&self.exe);
        command.args(["plugin", "compile", plugin, "--target", &key.platform, "--sign-key"]);
        command.arg(&self.sign_key).arg("--out-dir").arg(out.path());
        // One compile thread (wasmtime compiles in parallel on rayon's pool): a core stays free
        // for the operator, the API server and the nodes.
        command.env("RAYON_NUM_THREADS", "1");
        if let Some(pin) = pin {
            command.args(["--sha256", pin]);
        }
        // The job's login reaches the child on its standard input: never in a file or an argument.
        let logins = match (login, plugin_registry(plugin)) {
            (Some(login), Some(registry)) => {
                command.arg("--logins-on-stdin");
                let auth = RegistryAuth { logins: [(registry, login.clone())].into(), ..RegistryAuth::default() };
                serde_json::to_vec(&auth).map_err(|err| format!("the job's login: {err}"))?
            }
            _ => Vec::new(),
        };
        // The lowest priority, and stopped while the control plane works: the operator's
        // reconciles (and the API server beside it) come first; a round never waits for a compile.
        let paused = run_giving_way(command, &logins, &self.give_way)?;
        let made = std::fs::read_dir(out.path())
            .map_err(|err| err.to_string())?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "pcwasm"))
            .ok_or("the compiler wrote no artifact")?;
        let size = std::fs::metadata(&made).map_err(|err| err.to_string())?.len();
        if size > MAX_ARTIFACT_BYTES {
            return Err(format!("the artifact is {size} bytes, over the {MAX_ARTIFACT_BYTES} byte limit"));
        }
        let checked = self.check(&made, key);
        // The check read the whole artifact, a megabyte at a time.
        release_freed_memory();
        let checked = checked?;
        let path = self.dir.join(key.file_name());
        std::fs::rename(&made, &path).map_err(|err| format!("{}: {err}", path.display()))?;
        Ok((checked, path, paused))
    }
}

/// The registry of an `oci://` plugin.
fn plugin_registry(plugin: &str) -> Option<String> {
    match perennial_types::parse_source(plugin) {
        Ok(Source::Oci(oci)) => Some(oci.registry),
        _ => None,
    }
}

/// Whether this operator's compiler makes code that `node` runs: a platform it compiles for,
/// and the same engine (wasmtime version and settings).
pub fn serves(node: &PolicyPlatform) -> Result<(), String> {
    platform::check_target(&node.platform)?;
    let ours = platform::fingerprint(&node.platform);
    if ours != node.fingerprint {
        return Err(format!(
            "the node's engine fingerprint for {} is {}, this operator compiles for {ours} (wasmtime {}): run the \
             same Perennial release on the node and the operator",
            node.platform,
            node.fingerprint,
            platform::WASMTIME_VERSION
        ));
    }
    Ok(())
}

/// The built-ins this program embeds, by name, with their component's SHA-256: asked of the
/// program itself (`perennial plugin builtin-digests`), whose compiling part this process does not
/// link.
fn builtin_digests(exe: &Path) -> Result<HashMap<String, String>, String> {
    let output = Command::new(exe)
        .args(["plugin", "builtin-digests"])
        .output()
        .map_err(|err| format!("{}: {err}", exe.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} plugin builtin-digests: {}",
            exe.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, digest)| (name.to_owned(), digest.trim().to_owned()))
        .collect())
}

fn read_piece(path: &Path, offset: u64, max: usize) -> Result<ArtifactPiece, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let total = file.metadata().map_err(|err| err.to_string())?.len();
    if offset > total {
        return Err(format!("offset {offset} is past the artifact's end ({total} bytes)"));
    }
    file.seek(SeekFrom::Start(offset)).map_err(|err| err.to_string())?;
    let mut data = Vec::with_capacity(max.min((total - offset) as usize));
    file.take(max as u64).read_to_end(&mut data).map_err(|err| err.to_string())?;
    Ok(ArtifactPiece { total, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(platform: &str, fingerprint: String) -> PolicyPlatform {
        PolicyPlatform { platform: platform.into(), fingerprint, compiles: false }
    }

    #[test]
    fn a_shared_compiles_failure_names_another_jobs_login_to_no_one_else() {
        use perennial_types::Password;
        let reason = "pulling oci://r/t: refused the credentials of user \"robot-a\" (from the Secret team-a/regcred \
                      (the job's imagePullSecrets))"
            .to_owned();
        let login =
            |secret: &str| RegistryLogin { secret: secret.into(), username: "u".into(), password: Password::new("p") };
        // The job whose login it was hears it whole.
        assert_eq!(told_to(reason.clone(), Some("team-a/regcred"), Some(&login("team-a/regcred"))), reason);
        // Another namespace's job, or one with no login, hears neither the Secret nor the user.
        for other in [Some(login("team-b/regcred")), None] {
            assert_eq!(told_to(reason.clone(), Some("team-a/regcred"), other.as_ref()), FAILED_WITH_ANOTHER_LOGIN);
        }
        // A compile made with no login says what it says.
        assert_eq!(told_to(reason.clone(), None, Some(&login("team-b/regcred"))), reason);
    }

    #[test]
    fn a_compile_is_shared_within_a_repository_only() {
        let key = |repository: Option<&str>| Key {
            component_sha256: "ab".repeat(32),
            platform: "pulley64".into(),
            fingerprint: "f".repeat(32),
            repository: repository.map(str::to_owned),
        };
        let (team, rival, builtin) = (key(Some("r:5000/team/trigger")), key(Some("r:5000/rival/trigger")), key(None));
        assert_ne!(team.file_name(), rival.file_name(), "another repository's compile is its own");
        assert_eq!(team.file_name(), key(Some("r:5000/team/trigger")).file_name());
        assert_eq!(builtin.file_name(), format!("{}.pulley64.{}.pcwasm", "ab".repeat(32), "f".repeat(32)));
    }

    #[test]
    fn a_node_of_another_engine_is_told_why() {
        assert_eq!(serves(&node("pulley32", platform::fingerprint("pulley32"))), Ok(()));
        assert_eq!(
            serves(&node("aarch64-unknown-linux-gnu", platform::fingerprint("aarch64-unknown-linux-gnu"))),
            Ok(())
        );
        let err = serves(&node("pulley32", "0".repeat(32))).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "the node's engine fingerprint for pulley32 is {}, this operator",
                "0".repeat(32)
            )),
            "{err}"
        );
        assert!(err.contains("run the same Perennial release"), "{err}");
        let err = serves(&node("mips-unknown-linux-gnu", String::new())).unwrap_err();
        assert!(err.contains("is not a platform policies compile for"), "{err}");
    }

    #[tokio::test]
    async fn offers_name_what_cannot_be_compiled_and_pieces_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (private, _) = perennial_artifact::signing::generate().unwrap();
        std::fs::write(dir.path().join("op.key"), private).unwrap();
        let options = ArtifactOptions {
            sign_key: dir.path().join("op.key"),
            dir: dir.path().join("artifacts"),
            give_way: Default::default(),
        };
        let artifacts = Artifacts::new(&options).unwrap();
        let node = node("pulley64", platform::fingerprint("pulley64"));
        let file = PolicyRef::new("/opt/policies/mine.wasm");
        let Some(PolicyArtifact::Refused { reason }) = artifacts.offer(&file, &node, None) else {
            panic!("a path is refused")
        };
        assert!(reason.contains("is a path on the node"), "{reason}");
        assert_eq!(artifacts.offer(&PolicyRef::new("https://x/p.pulley64.pcwasm"), &node, None), None);
        let unknown = PolicyRef::new("builtin:nope");
        // This test's binary is not `perennial`: it cannot list built-ins, and says so.
        let Some(PolicyArtifact::Refused { reason }) = artifacts.offer(&unknown, &node, None) else {
            panic!("refused")
        };
        assert!(reason.contains("nope") || reason.contains("cannot list its built-ins"), "{reason}");
        let err = artifacts.chunk(&"a".repeat(64), 0, 10).await.unwrap_err();
        assert_eq!(err, format!("this operator has no artifact {}", "a".repeat(64)));

        let path = dir.path().join("blob");
        std::fs::write(&path, vec![7u8; 25]).unwrap();
        let piece = read_piece(&path, 20, 10).unwrap();
        assert_eq!((piece.total, piece.data.len()), (25, 5));
        assert!(read_piece(&path, 26, 10).unwrap_err().contains("past the artifact's end"));
    }
}
