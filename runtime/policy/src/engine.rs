//! The policy host: one wasmtime engine for the process, a linker with what policies may
//! import, and compilation once per component digest (in memory, and on disk when a cache
//! directory is given).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use super::artifact;
use super::bindings::{Kind, batch_data, host};
use super::builtin;
use super::cache::DiskCache;
#[cfg(feature = "compiler")]
use super::compiler::{compile_in_child, compile_in_scratch};
use super::error::{LoadError, PolicyError, Step, one_line};
use super::instance::{Policy, PolicyInfo};
use super::oci::{self, ComponentStore};
use super::platform;
use super::reference::{PolicyRef, Source, ValidRef};
use super::sandbox::{HostState, PolicyEvents};
use super::signing::TrustedKey;
use perennial_storage::{self as storage, S3Credentials};
use perennial_types::RegistryAuth;

/// The most a component may be, and how long its fetch may take.
pub const COMPONENT_READ: storage::ReadLimit =
    storage::ReadLimit { max_bytes: 64 << 20, timeout: Duration::from_secs(120) };

/// How often the epoch advances: the resolution of per-call deadlines.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// How the process compiles policies. Set once, before the first policy loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileMode {
    /// On every core: the `plugin` tools, where an author waits for the answer.
    Foreground,
    /// On one low-priority thread per load: `run` and `edge`, where a compile (seconds for a
    /// Python component) must never take a core from the running jobs' decisions.
    Background,
}

static COMPILE_MODE: OnceLock<CompileMode> = OnceLock::new();

/// Sets how this process compiles policies (the first call wins; the default is foreground).
pub fn set_compile_mode(mode: CompileMode) {
    let _ = COMPILE_MODE.set(mode);
}

fn compile_mode() -> CompileMode {
    *COMPILE_MODE.get_or_init(|| CompileMode::Foreground)
}

/// Whether compiles may use every core (parallel compilation changes no code).
#[cfg(feature = "compiler")]
pub(crate) fn compiles_in_foreground() -> bool {
    compile_mode() == CompileMode::Foreground
}

/// Whether this build can compile components ([`crate`]'s `compiler` feature); without, it runs
/// only signed precompiled policies.
pub const HAS_COMPILER: bool = cfg!(feature = "compiler");

/// The process's engine. Its settings are fixed, so compiled code can be shared and cached
/// (parallel compilation changes no code: a cache entry serves both modes).
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let config = platform::config(None).expect("this node's platform is one wasmtime runs");
        let engine = Engine::new(&config).expect("the policy engine settings are valid");
        let ticker = engine.clone();
        std::thread::Builder::new()
            .name("policy-epoch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    ticker.increment_epoch();
                }
            })
            .expect("start the policy epoch thread");
        engine
    })
}

/// A verified, compiled component.
pub struct Inspection {
    pub source: String,
    pub digest: String,
    pub size: usize,
    pub compile_time: Duration,
    pub from_cache: bool,
    /// For a signed precompiled policy: what it was compiled for and who signed it.
    pub precompiled: Option<artifact::Header>,
    /// Exported interfaces, e.g. `perennial:policy/trigger@0.1.0`.
    pub exports: Vec<String>,
    /// Imported interfaces, e.g. `wasi:cli/environment@0.2.0`.
    pub imports: Vec<String>,
    compiled: Arc<Compiled>,
}

/// A component compiled and pre-linked, shared by every policy loaded from the same digest.
pub struct Compiled {
    pub component: Component,
    pub pre: InstancePre<HostState>,
}

struct Inner {
    linker: Linker<HostState>,
    disk: Option<DiskCache>,
    /// Components pulled from OCI registries, by digest (beside the compile cache).
    components: Option<ComponentStore>,
    compiled: Mutex<HashMap<String, Arc<Compiled>>>,
    s3: Option<S3Credentials>,
    /// The binary that compiles in a child process, when the host does so (`run`, `edge`).
    compiler: OnceLock<PathBuf>,
    /// The key whose signature a precompiled policy needs (`--trust-key`).
    trusted: OnceLock<TrustedKey>,
    /// Where the operator's artifacts for this node come from (the link).
    artifacts: OnceLock<Arc<dyn ArtifactFetch>>,
    /// The disk cache took a child's compile once and kept nothing (a read-only or full
    /// filesystem): children compile into a scratch folder since.
    #[cfg(feature = "compiler")]
    cache_takes_nothing: std::sync::atomic::AtomicBool,
}

/// Fetches a signed artifact the operator compiled for this node, by its SHA-256 (the edge's
/// link); at most `size` bytes.
pub trait ArtifactFetch: Send + Sync {
    fn fetch<'a>(
        &'a self,
        artifact_sha256: &'a str,
        size: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send + 'a>>;
}

/// Loads policies. Cheap to clone; clones share the compile cache.
#[derive(Clone)]
pub struct PolicyHost {
    inner: Arc<Inner>,
}

impl PolicyHost {
    /// A host with an in-memory compile cache, and an on-disk one in `cache_dir` if given.
    /// `s3` is used to fetch `s3://` plugins.
    pub fn new(cache_dir: Option<PathBuf>, s3: Option<S3Credentials>) -> Result<Self, std::io::Error> {
        let engine = engine();
        let mut linker = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(std::io::Error::other)?;
        forbid_waiting(&mut linker).map_err(std::io::Error::other)?;
        host::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).map_err(std::io::Error::other)?;
        batch_data::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).map_err(std::io::Error::other)?;
        let components = cache_dir.as_ref().map(|dir| ComponentStore::new(dir.join("components")));
        let disk = cache_dir.map(|dir| DiskCache::new(dir, engine)).transpose()?;
        let compiled = Mutex::new(HashMap::new());
        let inner = Inner {
            linker,
            disk,
            components,
            compiled,
            s3,
            compiler: OnceLock::new(),
            trusted: OnceLock::new(),
            artifacts: OnceLock::new(),
            #[cfg(feature = "compiler")]
            cache_takes_nothing: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(PolicyHost { inner: Arc::new(inner) })
    }

    /// A host with the compile cache in `dir`, or the one every subcommand shares by default
    /// ([`default_cache_dir`]); when it cannot be made, a warning and no disk cache (policies
    /// are compiled on each start).
    ///
    /// [`default_cache_dir`]: crate::default_cache_dir
    pub fn with_shared_cache(dir: Option<PathBuf>, s3: Option<S3Credentials>) -> Result<Self, std::io::Error> {
        let dir = dir.unwrap_or_else(super::cache::default_dir);
        match PolicyHost::new(Some(dir.clone()), s3.clone()) {
            Ok(host) => Ok(host),
            Err(err) => {
                tracing::warn!(
                    "the compile cache {} cannot be used ({err}); set PERENNIAL_CACHE_DIR to a writable folder",
                    dir.display()
                );
                PolicyHost::new(None, s3)
            }
        }
    }

    /// Compiles new components in a child process running `exe` (this program), into the disk
    /// cache, and loads them from there ([`crate::compiler`]). Without a disk cache, compiles
    /// stay in this process.
    pub fn compile_in_child_process(&self, exe: PathBuf) {
        let _ = self.inner.compiler.set(exe);
    }

    /// Compiles `bytes` into the disk cache, as the child process of
    /// [`PolicyHost::compile_in_child_process`] does; returns the component's digest.
    pub fn compile_into_cache(&self, bytes: &[u8]) -> Result<String, LoadError> {
        let digest = hex::encode(Sha256::digest(bytes));
        self.compile("the component", &digest, bytes)?;
        Ok(digest)
    }

    /// Loads signed precompiled policies when `key` signed them (and no others).
    pub fn trust(&self, key: TrustedKey) {
        let _ = self.inner.trusted.set(key);
    }

    /// Fetches the operator's artifacts with `fetch` ([`PolicyHost::load_offered`]).
    pub fn fetch_artifacts_with(&self, fetch: Arc<dyn ArtifactFetch>) {
        let _ = self.inner.artifacts.set(fetch);
    }

    /// Loads a policy: checks the reference, fetches the component, verifies its digest,
    /// compiles it (or takes it from the cache), instantiates it and configures it. The error
    /// names the step that failed.
    pub async fn load<K: Kind>(
        &self,
        reference: &PolicyRef,
        events: Arc<dyn PolicyEvents>,
    ) -> Result<Policy<K>, LoadError> {
        let valid = reference.validate().map_err(|err| LoadError::new(Step::Reference, PolicyError::Reference(err)))?;
        let bytes = self.fetch_ref(&valid).await?;
        self.load_fetched(valid, bytes, events).await
    }

    /// Loads `reference` from the artifact the operator compiled from it for this node
    /// (`artifact_sha256`, `size` bytes, compiled from `component_sha256`), fetched over the
    /// link. It is verified like any signed artifact: the trusted key, this node's platform and
    /// engine, and the component it was compiled from (the reference's pin, else the offer's).
    pub async fn load_offered<K: Kind>(
        &self,
        reference: &PolicyRef,
        offer: (&str, &str, u64),
        events: Arc<dyn PolicyEvents>,
    ) -> Result<Policy<K>, LoadError> {
        let (component_sha256, artifact_sha256, size) = offer;
        let mut valid =
            reference.validate().map_err(|err| LoadError::new(Step::Reference, PolicyError::Reference(err)))?;
        let plugin = valid.source.to_string();
        let fetch_error =
            |message: String| LoadError::new(Step::Fetch, PolicyError::Fetch { plugin: plugin.clone(), message });
        let fetch = self.inner.artifacts.get().ok_or_else(|| {
            fetch_error("the operator compiled it for this node, and this agent has no link to fetch it".into())
        })?;
        let bytes = fetch
            .fetch(artifact_sha256, size)
            .await
            .map_err(|message| fetch_error(format!("the operator's artifact for this node: {message}")))?;
        if !artifact::is_artifact(&bytes) {
            return Err(fetch_error(format!("the operator's artifact {artifact_sha256} is not a signed artifact")));
        }
        valid.sha256.get_or_insert_with(|| component_sha256.to_owned());
        self.load_fetched(valid, Arc::from(bytes), events).await
    }

    /// Everything after the fetch ([`PolicyHost::fetch`]): verify, compile, start, configure,
    /// off the async threads (compiling is long CPU work).
    pub async fn load_fetched<K: Kind>(
        &self,
        valid: ValidRef,
        bytes: Arc<[u8]>,
        events: Arc<dyn PolicyEvents>,
    ) -> Result<Policy<K>, LoadError> {
        let host = self.clone();
        let load = move || host.load_bytes::<K>(&valid, &bytes, events);
        let stopped =
            |why: String| LoadError::new(Step::Compile, PolicyError::Trap(format!("the loader stopped: {why}")));
        match compile_mode() {
            CompileMode::Foreground => {
                tokio::task::spawn_blocking(load).await.unwrap_or_else(|join| Err(stopped(join.to_string())))
            }
            CompileMode::Background => {
                let (done, loaded) = tokio::sync::oneshot::channel();
                std::thread::Builder::new()
                    .name("policy-load".into())
                    .spawn(move || {
                        lower_this_threads_priority();
                        let _ = done.send(load());
                        release_freed_memory();
                    })
                    .map_err(|err| stopped(err.to_string()))?;
                loaded.await.unwrap_or_else(|_| Err(stopped("it panicked".into())))
            }
        }
    }

    /// Fetches the component a checked reference names: [`PolicyHost::fetch`], with its pin
    /// (an `oci://` one is checked before it is read, and kept on disk by it).
    pub async fn fetch_ref(&self, valid: &ValidRef) -> Result<Arc<[u8]>, LoadError> {
        self.fetch_pinned(&valid.source, valid.sha256.as_deref(), None).await
    }

    /// [`PolicyHost::fetch_ref`] for a job: an `oci://` pull with the job's registry logins
    /// (`auth`, from its `imagePullSecrets`), preferred over this machine's docker config.
    pub async fn fetch_ref_for_job(&self, valid: &ValidRef, auth: &RegistryAuth) -> Result<Arc<[u8]>, LoadError> {
        self.fetch_pinned(&valid.source, valid.sha256.as_deref(), Some(auth)).await
    }

    /// Fetches a component's bytes (at most [`COMPONENT_READ`]: a Python component is ~18 MB).
    pub async fn fetch(&self, source: &Source) -> Result<Arc<[u8]>, LoadError> {
        self.fetch_pinned(source, None, None).await
    }

    async fn fetch_pinned(
        &self,
        source: &Source,
        sha256: Option<&str>,
        auth: Option<&RegistryAuth>,
    ) -> Result<Arc<[u8]>, LoadError> {
        let fetch_error =
            |message: String| LoadError::new(Step::Fetch, PolicyError::Fetch { plugin: source.to_string(), message });
        match source {
            Source::Builtin(name) => builtin::component(name).map(Arc::from).ok_or_else(|| {
                fetch_error(if builtin::names().contains(&name.as_str()) {
                    let node = platform::this_node();
                    format!(
                        "this edge agent has no compiler and runs built-ins precompiled too: compile it with \
                         `perennial plugin compile builtin:{name} --target {node} --sign-key KEY` on any machine, \
                         and name the .pcwasm it writes in the job"
                    )
                } else {
                    format!("no built-in called {name:?}")
                })
            }),
            Source::File(path) => {
                let path = std::path::absolute(path).map_err(|err| fetch_error(err.to_string()))?;
                // Said plainly: an author's most common mistake is a path that is not there yet.
                match std::fs::metadata(&path) {
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                        return Err(fetch_error(format!("no such file: {} (build it first?)", path.display())));
                    }
                    Err(err) => return Err(fetch_error(format!("{}: {err}", path.display()))),
                    Ok(meta) if meta.is_dir() => {
                        return Err(fetch_error(format!("{} is a folder, not a component", path.display())));
                    }
                    Ok(_) => {}
                }
                let url = path.to_str().ok_or_else(|| fetch_error("the path is not UTF-8".into()))?;
                storage::read_limited(url, None, COMPONENT_READ)
                    .await
                    .map(Arc::from)
                    .map_err(|err| fetch_error(err.to_string()))
            }
            Source::Https(url) | Source::S3(url) => storage::read_limited(url, self.inner.s3.as_ref(), COMPONENT_READ)
                .await
                .map(Arc::from)
                .map_err(|err| fetch_error(err.to_string())),
            Source::Oci(reference) => {
                let store = self.inner.components.as_ref();
                oci::fetch(reference, sha256, store, auth).await.map(Arc::from).map_err(fetch_error)
            }
        }
    }

    /// Verifies the digest and compiles: what `plugin check` reports.
    pub fn inspect(&self, valid: &ValidRef, bytes: &[u8]) -> Result<Inspection, LoadError> {
        if artifact::is_artifact(bytes) {
            return self.inspect_artifact(valid, bytes);
        }
        let source = valid.source.to_string();
        let digest = hex::encode(Sha256::digest(bytes));
        if let Some(expected) = &valid.sha256
            && *expected != digest
        {
            let error = PolicyError::Digest { plugin: source, expected: expected.clone(), actual: digest };
            return Err(LoadError::new(Step::Verify, error));
        }
        let started = Instant::now();
        let (compiled, from_cache) = self.compile(&source, &digest, bytes)?;
        Ok(Inspection {
            exports: exported_interfaces(&compiled.component),
            imports: imported_interfaces(&compiled.component),
            compile_time: started.elapsed(),
            from_cache,
            precompiled: None,
            size: bytes.len(),
            digest,
            source,
            compiled,
        })
    }

    /// A signed precompiled policy: verified against the trusted key, this node's platform and
    /// engine, and the reference's pin (which names the source component), then deserialized.
    /// Nothing is deserialized before all of that holds.
    fn inspect_artifact(&self, valid: &ValidRef, bytes: &[u8]) -> Result<Inspection, LoadError> {
        let source = valid.source.to_string();
        let refused =
            |message: String| LoadError::new(Step::Verify, PolicyError::Artifact { plugin: source.clone(), message });
        let trusted = self.inner.trusted.get().ok_or_else(|| {
            refused("it is a signed precompiled policy, and this node trusts no key (give it --trust-key)".into())
        })?;
        let node = platform::this_node();
        let started = Instant::now();
        let verified = artifact::open(bytes, trusted, node, &platform::fingerprint(node)).map_err(refused)?;
        let header = verified.header;
        if let Some(expected) = &valid.sha256
            && *expected != header.component_sha256
        {
            let error = PolicyError::Digest {
                plugin: format!("{source} (compiled from a component that)"),
                expected: expected.clone(),
                actual: header.component_sha256,
            };
            return Err(LoadError::new(Step::Verify, error));
        }
        let digest = header.component_sha256.clone();
        let memorised = self.lock_compiled().get(&digest).cloned();
        let compiled = match memorised {
            Some(compiled) => compiled,
            None => {
                // SAFETY: the payload is what the trusted key signed for this platform and
                // engine (checked above, on these very bytes); wasmtime checks its version and
                // settings again.
                let component = unsafe { Component::deserialize(engine(), verified.payload) }
                    .map_err(|err| refused(format!("wasmtime refuses it: {}", one_line(&format!("{err:#}")))))?;
                self.prelink(&source, &digest, component)?
            }
        };
        Ok(Inspection {
            exports: exported_interfaces(&compiled.component),
            imports: imported_interfaces(&compiled.component),
            compile_time: started.elapsed(),
            from_cache: false,
            size: usize::try_from(header.component_size).unwrap_or(usize::MAX),
            precompiled: Some(header),
            digest,
            source,
            compiled,
        })
    }

    /// Everything after the fetch, on the calling thread (compilation is CPU work).
    pub fn load_bytes<K: Kind>(
        &self,
        valid: &ValidRef,
        bytes: &[u8],
        events: Arc<dyn PolicyEvents>,
    ) -> Result<Policy<K>, LoadError> {
        let inspection = self.inspect(valid, bytes)?;
        let source = inspection.source;
        if !inspection.exports.iter().any(|name| name == K::EXPORT) {
            let exports = &inspection.exports;
            let message =
                format!("it exports {}", if exports.is_empty() { "nothing".into() } else { exports.join(", ") });
            return Err(LoadError::new(
                Step::Instantiate,
                PolicyError::WrongWorld { plugin: source, kind: K::NAME, message },
            ));
        }
        let pre = K::pre(inspection.compiled.pre.clone()).map_err(|err| {
            LoadError::new(
                Step::Instantiate,
                PolicyError::WrongWorld {
                    plugin: source.clone(),
                    kind: K::NAME,
                    message: one_line(&format!("{err:#}")),
                },
            )
        })?;
        let info = PolicyInfo {
            kind: K::NAME,
            source,
            digest: inspection.digest,
            size: inspection.size,
            compile_time: inspection.compile_time,
            from_cache: inspection.from_cache,
            limits: valid.limits,
            on_error: valid.on_error,
        };
        Policy::start(info, pre, valid.config.clone(), events)
    }

    /// The compiled component for `digest`: from memory, from disk, or compiled now.
    /// Returns whether it came from a cache.
    fn compile(&self, source: &str, digest: &str, bytes: &[u8]) -> Result<(Arc<Compiled>, bool), LoadError> {
        if let Some(compiled) = self.lock_compiled().get(digest) {
            return Ok((compiled.clone(), true));
        }
        let engine = engine();
        // A compiler-free node deserializes only what its trusted key signed: not this cache's
        // checksummed (unsigned) entries.
        let cached = self.inner.disk.as_ref().filter(|_| HAS_COMPILER).and_then(|disk| disk.load(engine, digest));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => self.compile_now(source, digest, bytes)?,
        };
        Ok((self.prelink(source, digest, component)?, from_cache))
    }

    /// Compiles a component on this machine: in a child process when the host does so.
    #[cfg(feature = "compiler")]
    fn compile_now(&self, source: &str, digest: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        let failed = |message: String| {
            LoadError::new(Step::Compile, PolicyError::Compile { plugin: source.to_owned(), message })
        };
        let engine = engine();
        match (&self.inner.disk, self.inner.compiler.get()) {
            (Some(disk), Some(exe)) => {
                use std::sync::atomic::Ordering;
                if !self.inner.cache_takes_nothing.load(Ordering::Relaxed) {
                    compile_in_child(exe, disk.dir(), bytes).map_err(failed)?;
                    if let Some(component) = disk.load(engine, digest) {
                        return Ok(component);
                    }
                    // The policy compiled, and the cache kept nothing: said once, and the
                    // policies serve all the same (compiled again on each start).
                    if !self.inner.cache_takes_nothing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            dir = %disk.dir().display(),
                            "the compile cache keeps nothing (a read-only or full filesystem?): policies are \
                             compiled into a scratch folder and not kept across restarts"
                        );
                    }
                }
                compile_in_scratch(exe, engine, digest, bytes).map_err(failed)
            }
            (disk, _) => {
                let component =
                    Component::from_binary(engine, bytes).map_err(|err| failed(one_line(&format!("{err:#}"))))?;
                if let Some(disk) = disk {
                    disk.store(digest, &component);
                }
                Ok(component)
            }
        }
    }

    /// This build has no compiler: a component must come precompiled.
    #[cfg(not(feature = "compiler"))]
    fn compile_now(&self, source: &str, _digest: &str, _bytes: &[u8]) -> Result<Component, LoadError> {
        let node = platform::this_node();
        let message = format!(
            "this edge agent has no compiler and runs only signed precompiled policies: compile it for this node \
             with `perennial plugin compile {source} --target {node} --sign-key KEY` on any machine, and name the \
             .pcwasm it writes in the job"
        );
        Err(LoadError::new(Step::Compile, PolicyError::Precompiled { plugin: source.to_owned(), message }))
    }

    /// Pre-links a compiled component and keeps it in memory under `digest`.
    fn prelink(&self, source: &str, digest: &str, component: Component) -> Result<Arc<Compiled>, LoadError> {
        let pre = self.inner.linker.instantiate_pre(&component).map_err(|err| {
            let message = one_line(&format!("{err:#} (policies may import only perennial:policy and WASI 0.2)"));
            LoadError::new(
                Step::Instantiate,
                PolicyError::WrongWorld { plugin: source.to_owned(), kind: "policy", message },
            )
        })?;
        let compiled = Arc::new(Compiled { component, pre });
        self.lock_compiled().insert(digest.to_owned(), compiled.clone());
        Ok(compiled)
    }

    fn lock_compiled(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Compiled>>> {
        self.inner.compiled.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets compiled components held in memory (the disk cache stays).
    pub fn clear_memory_cache(&self) {
        self.lock_compiled().clear();
    }

    /// Where the on-disk cache keeps `digest`, if there is a disk cache.
    pub fn disk_cache_path(&self, digest: &str) -> Option<PathBuf> {
        self.inner.disk.as_ref().map(|disk| disk.path(digest))
    }
}

/// Makes the calling thread the last to get a core (nice 10): background work (a compile, a
/// shadow policy) then takes only what the jobs leave.
pub fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id; raising one's nice value needs no privilege.
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
    }
}

pub use perennial_artifact::child::release_freed_memory;

/// A policy may not wait: `wasi:io/poll` would block the host thread, where no epoch deadline
/// can stop it (a `sleep` in a plugin would hang the job). Both ways of waiting trap instead.
fn forbid_waiting(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;
    const WHY: &str = "policies may not wait (wasi:io/poll is not available to them)";
    linker.allow_shadowing(true);
    let mut poll = linker.instance("wasi:io/poll@0.2.12")?;
    poll.func_wrap("poll", |_, (_,): (Vec<Resource<DynPollable>>,)| -> wasmtime::Result<(Vec<u32>,)> {
        Err(wasmtime::format_err!(WHY))
    })?;
    poll.func_wrap("[method]pollable.block", |_, (_,): (Resource<DynPollable>,)| -> wasmtime::Result<()> {
        Err(wasmtime::format_err!(WHY))
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interfaces a component imports, e.g. `wasi:cli/environment@0.2.0`.
pub fn imported_interfaces(component: &Component) -> Vec<String> {
    component.component_type().imports(engine()).map(|(name, _)| name.to_owned()).collect()
}

/// The interfaces a component exports, e.g. `perennial:policy/trigger@0.1.0`.
pub fn exported_interfaces(component: &Component) -> Vec<String> {
    component.component_type().exports(engine()).map(|(name, _)| name.to_owned()).collect()
}
