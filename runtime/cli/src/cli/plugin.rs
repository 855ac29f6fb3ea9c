//! `perennial plugin`: check, call and benchmark a policy plugin from the command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use perennial_edge::replay;
use perennial_policy::{
    self as policy, Kind, Level, Limits, ModelInfo, PolicyEvents, PolicyHost, PolicyRef, SampleBatch, SelectorKind,
    SplitterKind, TracingEvents, TriggerKind, TriggerStats, ValidRef,
};
use perennial_storage::S3Credentials;
use serde::Deserialize;

use super::decisions;
#[cfg(feature = "authoring")]
use super::plugin_meta::{self, Metadata};
use super::plugin_new::{self, Lang, PolicyKind};
use super::precompiled;
use perennial_policy::signing::TrustedKey;

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Start a policy project outside this repository: the policy, native tests, the WIT
    /// contract (and for Rust the SDK) vendored in, one build command, a README.
    New {
        /// The decision it makes.
        #[arg(value_enum)]
        kind: PolicyKind,
        /// Its name: lower-case letters, digits, '-' and '_' (the crate, package or file name).
        name: String,
        /// The language.
        #[arg(long, value_enum, default_value_t = Lang::Rust)]
        lang: Lang,
        /// Where to make it (default: ./NAME); must not exist, or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Compiles a component read from stdin into the compile cache: the child process that
    /// `run` and `edge` compile in.
    #[cfg(feature = "edge")]
    #[command(name = "compile-into-cache", hide = true)]
    CompileIntoCache {
        #[arg(long)]
        cache_dir: PathBuf,
    },
    /// The built-ins this build embeds, a line each: NAME SHA256 (the operator, which does not
    /// link them, keys its compiles for the nodes with these).
    #[cfg(feature = "edge")]
    #[command(name = "builtin-digests", hide = true)]
    BuiltinDigests,
    /// Compile a policy for nodes that run it without compiling (the compiler-free edge
    /// agent, 32-bit ARM): one signed `.pcwasm` per platform, which a node loads only if the
    /// key it trusts signed it.
    #[cfg(feature = "edge")]
    Compile {
        /// The component: builtin:NAME, a path, file:///path, https://... or s3://bucket/key.
        #[arg(value_name = "REF")]
        plugin: String,
        /// Expected SHA-256 of the component (required for https:// and s3://).
        #[arg(long)]
        sha256: Option<String>,
        /// A platform to compile for, as `perennial plugin platform` prints it on the node: a
        /// target triple (aarch64-unknown-linux-gnu) or pulley32 / pulley64. Repeat for more.
        #[arg(long = "target", value_name = "PLATFORM", required = true)]
        targets: Vec<String>,
        /// The ed25519 private key to sign with (PEM PKCS#8: `perennial plugin keygen` or
        /// `openssl genpkey -algorithm ed25519`).
        #[arg(long, value_name = "FILE", env = "PERENNIAL_SIGN_KEY")]
        sign_key: PathBuf,
        /// The folder to write NAME.PLATFORM.pcwasm into.
        #[arg(long, value_name = "DIR", default_value = ".")]
        out_dir: PathBuf,
        /// Registry logins for an oci:// plugin, as JSON on standard input: how the operator
        /// gives its compile a job's imagePullSecrets (never in a file or an argument).
        #[arg(long, hide = true)]
        logins_on_stdin: bool,
    },
    /// Make an ed25519 key pair to sign precompiled policies with: NAME.key (private: keep it
    /// where the compiles run) and NAME.pub (what nodes trust: `--trust-key NAME.pub`).
    Keygen {
        /// The path of the pair without its extension, e.g. `keys/perennial`.
        #[arg(value_name = "NAME")]
        name: PathBuf,
    },
    /// What this node runs: its platform and engine fingerprint (what `plugin compile --target`
    /// must name for it), and whether this build can compile policies itself.
    Platform,
    /// Load and verify a plugin: its world, package version, size and compile time. With
    /// --config, the config is first checked against the config schema of the plugin's metadata
    /// (if it has one: `plugin annotate`), naming each field it lacks or gets wrong, then handed
    /// to the plugin's `configure`.
    Check {
        #[command(flatten)]
        plugin: PluginArgs,
    },
    /// Write a policy's metadata into its component: a `perennial:metadata` custom section
    /// (JSON) with its name, description, kind, version, author and the JSON Schema of its
    /// config, which `plugin inspect` shows and `plugin check` validates configs with. The
    /// metadata is checked first (every field known, the kind the component's world, the schema
    /// a valid JSON Schema of an object); nothing is written when it is refused. A section the
    /// component had is replaced. Annotating changes the component's bytes, so its sha256:
    /// pin the annotated component's digest (printed).
    #[cfg(feature = "authoring")]
    Annotate {
        /// The component file (.wasm).
        #[arg(value_name = "COMPONENT")]
        component: PathBuf,
        /// The metadata: a YAML (or JSON) file of at most 64 KiB with name, description, kind
        /// (trigger, splitter or selector), version, author and configSchema.
        #[arg(long, value_name = "FILE")]
        metadata: PathBuf,
        /// Where to write the annotated component (default: over COMPONENT, atomically).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Show what a plugin is, without running it: its world, sha256, size and metadata (name,
    /// description, kind, version, author, the config's fields with their types, defaults and
    /// descriptions). A component without metadata says so.
    #[cfg(feature = "authoring")]
    Inspect {
        #[command(flatten)]
        plugin: PluginArgs,
        /// text, or json.
        #[arg(long, value_enum, default_value_t = InspectOutput::Text)]
        output: InspectOutput,
    },
    /// Call a plugin once and print its answer as JSON. A --config is first checked against the
    /// plugin's config schema, if its metadata has one (as `check` does).
    Call {
        #[command(flatten)]
        plugin: PluginArgs,
        #[command(flatten)]
        input: CallInput,
    },
    /// Run a candidate on a job's recorded decisions (`perennial decisions`): how many it agrees
    /// with, the first disagreements side by side, what it would have changed. Exits 0 when it
    /// agrees with every one, 1 when it does not.
    Replay {
        #[command(flatten)]
        plugin: PluginArgs,
        /// The job: NAMESPACE/NAME, or NAME in `default`.
        #[arg(long)]
        job: String,
        /// The state dir of `perennial run` or `perennial edge`.
        #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = ".perennial")]
        state_dir: PathBuf,
        /// Where the host's filesystem is mounted, as `perennial edge` was told (a DaemonSet sets
        /// `ROOTFS_MOUNT_DIR`): a split's batches are read back from the dataset under it.
        #[arg(long, env = "ROOTFS_MOUNT_DIR")]
        rootfs_mount_dir: Option<PathBuf>,
        #[command(flatten)]
        filter: decisions::Filter,
        /// Disagreements shown.
        #[arg(long, default_value_t = 5)]
        show: usize,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Test a built plugin against fixture files: decisions with their inputs and the answers
    /// expected, in the format `perennial decisions --output json` writes (a job's real
    /// decisions are fixtures). Exits 0 when it answers every one as expected, 1 when not. A
    /// --config is first checked against the plugin's config schema, if its metadata has one.
    Test {
        #[command(flatten)]
        plugin: PluginArgs,
        /// The fixture files: each a JSON list of decisions (or one decision); a folder stands
        /// for the .json files in it.
        #[arg(required = true)]
        fixtures: Vec<PathBuf>,
        /// Disagreements shown.
        #[arg(long, default_value_t = 5)]
        show: usize,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Push a policy component to an OCI registry (the CNCF Wasm artifact layout), with the
    /// credentials `docker login` wrote; prints the digests a job pins it by.
    #[cfg(feature = "edge")]
    Push(super::plugin_oci::PushArgs),
    /// Pull a policy component from an OCI registry into a file, verified by its digests.
    Pull(super::plugin_oci::PullArgs),
    /// Measure a plugin: compile, load from cache, instantiate, and per-call time.
    Bench {
        #[command(flatten)]
        plugin: PluginArgs,
        /// Calls to time.
        #[arg(long, default_value_t = 2000)]
        iterations: u32,
        /// Samples per batch, for a splitter.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
    },
}

/// How `plugin inspect` prints.
#[cfg(feature = "authoring")]
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InspectOutput {
    Text,
    Json,
}

#[derive(Args)]
pub struct PluginArgs {
    /// The plugin: builtin:NAME, a path, file:///path, https://..., s3://bucket/key or
    /// oci://HOST/REPO:TAG.
    #[arg(value_name = "REF")]
    pub(super) plugin: String,
    /// Expected SHA-256 of the component (required for https://, s3:// and oci:// without
    /// @sha256:).
    #[arg(long)]
    sha256: Option<String>,
    /// JSON config handed to the plugin's `configure`.
    #[arg(long)]
    config: Option<String>,
    /// Time per call, in milliseconds.
    #[arg(long, default_value_t = Limits::default().timeout_ms)]
    timeout_ms: u64,
    /// Memory cap of the plugin instance, in MiB.
    #[arg(long, default_value_t = Limits::default().memory_mib)]
    memory_mib: u64,
    /// Time a fresh instance may take to start (instantiate and configure), in milliseconds.
    #[arg(long, default_value_t = Limits::default().start_timeout_ms)]
    start_timeout_ms: u64,
    /// Compile cache directory.
    #[arg(long, env = "PERENNIAL_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile without reading or writing the on-disk cache.
    #[arg(long)]
    no_cache: bool,
    /// The ed25519 public key (PEM) whose signature a precompiled policy (.pcwasm) needs.
    #[arg(long, value_name = "FILE", env = "PERENNIAL_TRUST_KEY")]
    trust_key: Option<PathBuf>,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct CallInput {
    /// Ask a trigger: stats as JSON, e.g. '{"pendingTrain": 501}' (missing fields are zero).
    #[arg(long, value_name = "STATS_JSON")]
    trigger: Option<String>,
    /// Ask a splitter: a file with one sample per line ('-' for stdin).
    #[arg(long, value_name = "FILE")]
    split: Option<PathBuf>,
    /// Ask a selector: '{"deployed": MODEL|null, "candidates": [MODEL...]}', where MODEL is
    /// '{"url": ..., "format": ..., "metrics": {"accuracy": 0.9}}'.
    #[arg(long, value_name = "JSON")]
    select: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectInput {
    #[serde(default)]
    deployed: Option<ModelInfo>,
    #[serde(default)]
    candidates: Vec<ModelInfo>,
}

impl PluginArgs {
    fn reference(&self) -> anyhow::Result<PolicyRef> {
        let config = match &self.config {
            Some(text) => Some(serde_json::from_str(text).context("--config is not valid JSON")?),
            None => None,
        };
        let mut reference = PolicyRef::new(&self.plugin);
        reference.sha256 = self.sha256.clone();
        reference.config = config;
        reference.limits = Limits {
            timeout_ms: self.timeout_ms,
            memory_mib: self.memory_mib,
            start_timeout_ms: self.start_timeout_ms,
        };
        Ok(reference)
    }

    pub(super) fn host(&self) -> anyhow::Result<PolicyHost> {
        let cache_dir = (!self.no_cache).then(|| self.cache_dir.clone().unwrap_or_else(policy::default_cache_dir));
        let host = PolicyHost::new(cache_dir, S3Credentials::from_env()).context("cannot open the compile cache")?;
        self.trust(&host)?;
        Ok(host)
    }

    /// Gives `host` the key of `--trust-key`, if any.
    fn trust(&self, host: &PolicyHost) -> anyhow::Result<()> {
        if let Some(path) = &self.trust_key {
            host.trust(TrustedKey::from_file(path).map_err(|err| anyhow::anyhow!("--trust-key {err}"))?);
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> anyhow::Result<ValidRef> {
        self.reference()?.validate().map_err(|err| anyhow::anyhow!("{}: {err}", self.plugin))
    }
}

/// Where a loaded policy's log lines go.
#[derive(Clone, Copy)]
pub(super) enum PolicyLog {
    /// On stderr, every level (debug too), apart from the host's own lines: what `plugin call`
    /// and `check` show the policy's author.
    Shown,
    /// Into the host's log (`RUST_LOG`): `plugin bench` calls a policy thousands of times.
    Quiet,
}

/// A policy's lines as its author reads them: `policy debug: …`.
struct ShownEvents;

impl PolicyEvents for ShownEvents {
    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        };
        eprintln!("policy {level}: {message}");
    }
}

fn events(log: PolicyLog) -> Arc<dyn PolicyEvents> {
    match log {
        PolicyLog::Shown => Arc::new(ShownEvents),
        PolicyLog::Quiet => Arc::new(TracingEvents { job: "plugin-cli".into() }),
    }
}

pub async fn run(command: PluginCommand) -> anyhow::Result<()> {
    match command {
        PluginCommand::New { kind, name, lang, dir } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let made = plugin_new::make(kind, &name, lang, &dir)?;
            let lang = format!("{lang:?}").to_lowercase();
            println!("made {}: the {} policy {name} in {lang}; next, in it:", made.dir.display(), kind.name());
            for step in made.next_steps {
                println!("  {step}");
            }
            println!("and see its README.md");
            Ok(())
        }
        #[cfg(feature = "edge")]
        PluginCommand::CompileIntoCache { cache_dir } => compile_into_cache(cache_dir),
        #[cfg(feature = "edge")]
        PluginCommand::BuiltinDigests => {
            for name in perennial_policy::builtin::names() {
                if let Some(component) = perennial_policy::builtin::component(name) {
                    println!("{name} {}", perennial_policy::artifact::sha256_hex(component));
                }
            }
            Ok(())
        }
        #[cfg(feature = "edge")]
        PluginCommand::Compile { plugin, sha256, targets, sign_key, out_dir, logins_on_stdin } => {
            precompiled::compile(Compile { plugin, sha256, targets, sign_key, out_dir, logins_on_stdin }).await
        }
        PluginCommand::Keygen { name } => precompiled::keygen(&name),
        PluginCommand::Platform => {
            precompiled::platform();
            Ok(())
        }
        #[cfg(feature = "edge")]
        PluginCommand::Push(args) => super::plugin_oci::push(args).await,
        PluginCommand::Pull(args) => super::plugin_oci::pull(args).await,
        PluginCommand::Check { plugin } => check(&plugin).await,
        #[cfg(feature = "authoring")]
        PluginCommand::Annotate { component, metadata, output } => annotate(&component, &metadata, output.as_deref()),
        #[cfg(feature = "authoring")]
        PluginCommand::Inspect { plugin, output } => inspect(&plugin, output).await,
        PluginCommand::Call { plugin, input } => call(&plugin, input).await,
        PluginCommand::Bench { plugin, iterations, batch } => bench(&plugin, iterations, batch).await,
        PluginCommand::Test { plugin, fixtures, show, json } => {
            super::plugin_test::test(&plugin, &fixtures, show, json).await
        }
        PluginCommand::Replay { plugin, job, state_dir, rootfs_mount_dir, filter, show, json } => {
            replay(&plugin, Replay { job, state_dir, rootfs: rootfs_mount_dir, filter, show, json }).await
        }
    }
}

#[cfg(feature = "edge")]
use precompiled::Compile;

/// `plugin compile-into-cache`: one component from stdin (as large as a fetch may be), compiled
/// on one thread of this low-priority process into `cache_dir`.
#[cfg(feature = "edge")]
fn compile_into_cache(cache_dir: PathBuf) -> anyhow::Result<()> {
    use std::io::Read;
    policy::set_compile_mode(policy::CompileMode::Background);
    let limit = policy::COMPONENT_READ.max_bytes;
    let mut bytes = Vec::new();
    std::io::stdin().take(limit + 1).read_to_end(&mut bytes).context("reading the component")?;
    if bytes.len() as u64 > limit {
        bail!("the component is larger than {} MiB", limit >> 20);
    }
    let host = PolicyHost::new(Some(cache_dir), None).context("cannot open the compile cache")?;
    // The compiler's own words: the host that started this process names the plugin and step.
    match host.compile_into_cache(&bytes) {
        Ok(_) => Ok(()),
        Err(policy::LoadError { error: policy::PolicyError::Compile { message, .. }, .. }) => bail!("{message}"),
        Err(err) => Err(err.into()),
    }
}

/// The policy kind a component exports, and its package version.
pub(super) fn world_of(exports: &[String]) -> Option<(&'static str, String)> {
    let kinds = [
        ("trigger-policy", "perennial:policy/trigger@"),
        ("splitter-policy", "perennial:policy/splitter@"),
        ("selector-policy", "perennial:policy/selector@"),
    ];
    exports.iter().find_map(|export| {
        kinds.iter().find_map(|(world, prefix)| {
            export.strip_prefix(prefix).map(|version| (*world, format!("perennial:policy@{version}")))
        })
    })
}

async fn check(args: &PluginArgs) -> anyhow::Result<()> {
    let valid = args.validate()?;
    let host = args.host()?;
    let bytes = host.fetch_ref(&valid).await?;
    let inspection = host.inspect(&valid, &bytes)?;
    let Some((world, package)) = world_of(&inspection.exports) else {
        bail!("{}: not a Perennial policy; it exports {}", args.plugin, inspection.exports.join(", "));
    };
    println!("plugin:   {}", inspection.source);
    println!("world:    {world} ({package})");
    println!("sha256:   {}", inspection.digest);
    println!("size:     {} bytes", inspection.size);
    match &inspection.precompiled {
        Some(header) => println!(
            "compile:  precompiled for {} (engine {}), signed by key {}; verified and loaded in {:.1} ms",
            header.platform,
            header.fingerprint,
            header.signer,
            ms(inspection.compile_time)
        ),
        None => {
            let origin = if inspection.from_cache { "from cache" } else { "compiled" };
            println!("compile:  {:.1} ms ({origin})", ms(inspection.compile_time));
        }
    }
    check_metadata(args, &valid, &bytes, &inspection)?;
    if args.config.is_some() {
        off_runtime(move || load_as(world, &host, &valid, &bytes)).await?;
        println!("config:   accepted");
    } else {
        println!("config:   not checked (pass --config)");
    }
    Ok(())
}

/// Says the component's metadata, and checks a config given against its config schema first:
/// what the config lacks, in the SDKs' words, before the policy runs.
#[cfg(feature = "authoring")]
fn check_metadata(
    args: &PluginArgs,
    valid: &ValidRef,
    bytes: &[u8],
    inspection: &perennial_policy::Inspection,
) -> anyhow::Result<()> {
    let metadata =
        component_metadata(bytes, &inspection.exports).map_err(|err| anyhow::anyhow!("{}: {err}", args.plugin))?;
    match &metadata {
        Some(metadata) => println!("metadata: {} {} ({})", metadata.name, metadata.version, metadata.kind),
        None if inspection.precompiled.is_some() => println!("metadata: none (a precompiled policy keeps none)"),
        None => println!("metadata: none (no config schema to check a config against)"),
    }
    let schema = metadata.as_ref().and_then(|m| m.config_schema.as_ref());
    match (&args.config, schema) {
        (Some(_), Some(schema)) => config_fits(&args.plugin, valid, schema),
        _ => Ok(()),
    }
}

/// Checks the config given (`--config`) against the config schema the component embeds, if
/// any, before the policy runs (`plugin call` and `plugin test`, as `plugin check` does).
#[cfg(feature = "authoring")]
pub(super) fn config_fits_embedded_schema(args: &PluginArgs, valid: &ValidRef, bytes: &[u8]) -> anyhow::Result<()> {
    if args.config.is_none() {
        return Ok(());
    }
    // Metadata that cannot be read is `plugin check`'s to say; here it checks nothing.
    let Ok(Some(metadata)) = component_metadata(bytes, &[]) else { return Ok(()) };
    match &metadata.config_schema {
        Some(schema) => config_fits(&args.plugin, valid, schema),
        None => Ok(()),
    }
}

#[cfg(not(feature = "authoring"))]
pub(super) fn config_fits_embedded_schema(_: &PluginArgs, _: &ValidRef, _: &[u8]) -> anyhow::Result<()> {
    Ok(())
}

/// What the config lacks against `schema`, in the SDKs' words; the policy is not run then.
#[cfg(feature = "authoring")]
fn config_fits(plugin: &str, valid: &ValidRef, schema: &serde_json::Value) -> anyhow::Result<()> {
    // An empty config is `{}`, as the SDKs read it.
    let text = if valid.config.trim().is_empty() { "{}" } else { valid.config.as_str() };
    let config: serde_json::Value =
        serde_json::from_str(text).map_err(|err| anyhow::anyhow!("config: not JSON ({err})"))?;
    let errors = plugin_meta::config_errors(schema, &config);
    if !errors.is_empty() {
        bail!(
            "{plugin}: the config does not match the policy's config schema (the policy was not run): {}",
            errors.join("; ")
        );
    }
    Ok(())
}

/// The compiler-free build reads no metadata: the precompiled policies it runs keep none.
#[cfg(not(feature = "authoring"))]
fn check_metadata(
    _args: &PluginArgs,
    _valid: &ValidRef,
    _bytes: &[u8],
    _inspection: &perennial_policy::Inspection,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(feature = "authoring")]
/// The metadata a component carries, if any, checked against the world it exports (a
/// precompiled policy keeps none).
fn component_metadata(bytes: &[u8], exports: &[String]) -> Result<Option<Metadata>, String> {
    if policy::artifact::is_artifact(bytes) {
        return Ok(None);
    }
    let Some(metadata) = plugin_meta::scan(bytes)?.metadata()? else { return Ok(None) };
    match plugin_meta::kind_of(exports) {
        Some(kind) if kind != metadata.kind => Err(format!(
            "its metadata says it is a {}, but it is a {kind} (it exports {})",
            metadata.kind,
            exports.join(", ")
        )),
        _ => Ok(Some(metadata)),
    }
}

#[cfg(feature = "authoring")]
/// `plugin annotate`: the metadata file checked, then the component written with it (to a
/// temporary file beside the output, renamed over it), or nothing written.
fn annotate(
    component: &std::path::Path,
    metadata_file: &std::path::Path,
    output: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use std::io::Read;
    let metadata =
        plugin_meta::read_file(metadata_file).map_err(|err| anyhow::anyhow!("{}: {err}", metadata_file.display()))?;
    let named = |err: String| anyhow::anyhow!("{}: {err}", component.display());
    let limit = policy::COMPONENT_READ.max_bytes;
    let mut bytes = Vec::new();
    std::fs::File::open(component)
        .and_then(|file| file.take(limit + 1).read_to_end(&mut bytes))
        .map_err(|err| named(format!("cannot read it: {err}")))?;
    if bytes.len() as u64 > limit {
        return Err(named(format!("larger than {} MiB, the most a policy may be", limit >> 20)));
    }
    let scan = plugin_meta::scan(&bytes).map_err(named)?;
    let Some(kind) = plugin_meta::kind_of(&scan.exports) else {
        return Err(named(format!("not a Perennial policy; it exports {}", listed(&scan.exports))));
    };
    if metadata.kind != kind {
        bail!(
            "{}: kind: {:?}, but {} is a {kind} (it exports {})",
            metadata_file.display(),
            metadata.kind,
            component.display(),
            scan.exports.join(", ")
        );
    }
    let annotated = plugin_meta::annotated(&bytes, &scan, &metadata);
    let output = output.unwrap_or(component);
    // A new output file takes the component's mode.
    let mode =
        std::fs::metadata(component).map(|m| m.permissions()).unwrap_or_else(|_| super::plugin_oci::readable_by_all());
    super::plugin_oci::write_whole(output, &annotated, mode)
        .map_err(|err| anyhow::anyhow!("{}: cannot write it: {err}", output.display()))?;
    println!(
        "annotated {}: {} {} ({kind}); sha256 {} (was {}: pin the new one)",
        output.display(),
        metadata.name,
        metadata.version,
        policy::artifact::sha256_hex(&annotated),
        policy::artifact::sha256_hex(&bytes)
    );
    Ok(())
}

#[cfg(feature = "authoring")]
fn listed(exports: &[String]) -> String {
    if exports.is_empty() { "nothing".into() } else { exports.join(", ") }
}

#[cfg(feature = "authoring")]
/// `plugin inspect`: what the component says of itself, read without compiling it (a
/// precompiled policy is verified and loaded as `check` does).
async fn inspect(args: &PluginArgs, output: InspectOutput) -> anyhow::Result<()> {
    let valid = args.validate()?;
    let host = args.host()?;
    let bytes = host.fetch_ref(&valid).await?;
    let named = |err: String| anyhow::anyhow!("{}: {err}", args.plugin);
    let (source, digest, size, exports, precompiled) = if policy::artifact::is_artifact(&bytes) {
        let inspection = host.inspect(&valid, &bytes)?;
        (inspection.source, inspection.digest, inspection.size, inspection.exports, true)
    } else {
        let digest = policy::artifact::sha256_hex(&bytes);
        if let Some(expected) = &valid.sha256
            && *expected != digest
        {
            return Err(named(format!("its sha256 is {digest}, not the {expected} expected")));
        }
        let exports = plugin_meta::scan(&bytes).map_err(named)?.exports;
        (valid.source.to_string(), digest, bytes.len(), exports, false)
    };
    let metadata = component_metadata(&bytes, &exports).map_err(named)?;
    let world = world_of(&exports);
    if output == InspectOutput::Json {
        let json = serde_json::json!({
            "plugin": source,
            "world": world.as_ref().map(|(world, _)| *world),
            "package": world.as_ref().map(|(_, package)| package),
            "exports": exports,
            "sha256": digest,
            "size": size,
            "precompiled": precompiled,
            "metadata": metadata,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!("plugin:      {source}");
    match &world {
        Some((world, package)) => println!("world:       {world} ({package})"),
        None => println!("world:       none: not a Perennial policy (it exports {})", listed(&exports)),
    }
    println!("sha256:      {digest}");
    println!("size:        {size} bytes");
    let Some(metadata) = metadata else {
        if precompiled {
            println!("metadata:    none (a precompiled policy keeps none: inspect its component)");
        } else {
            println!("metadata:    none (`perennial plugin annotate` writes it)");
        }
        return Ok(());
    };
    println!("name:        {}", metadata.name);
    println!("kind:        {}", metadata.kind);
    println!("version:     {}", metadata.version);
    if let Some(author) = &metadata.author {
        println!("author:      {author}");
    }
    if !metadata.description.is_empty() {
        println!("description: {}", metadata.description);
    }
    match &metadata.config_schema {
        Some(schema) => print!("config:\n{}", plugin_meta::describe_schema(schema)),
        None => println!("config:      no schema"),
    }
    Ok(())
}

/// Loads (instantiates and configures) a plugin as the kind its world names, then drops it.
fn load_as(world: &str, host: &PolicyHost, valid: &ValidRef, bytes: &[u8]) -> anyhow::Result<()> {
    match world {
        "trigger-policy" => drop(load::<TriggerKind>(host, valid, bytes, PolicyLog::Shown)?),
        "splitter-policy" => drop(load::<SplitterKind>(host, valid, bytes, PolicyLog::Shown)?),
        _ => drop(load::<SelectorKind>(host, valid, bytes, PolicyLog::Shown)?),
    }
    Ok(())
}

pub(super) fn load<K: Kind>(
    host: &PolicyHost,
    valid: &ValidRef,
    bytes: &[u8],
    log: PolicyLog,
) -> anyhow::Result<policy::Policy<K>> {
    Ok(host.load_bytes::<K>(valid, bytes, events(log))?)
}

async fn call(args: &PluginArgs, input: CallInput) -> anyhow::Result<()> {
    let valid = args.validate()?;
    let host = args.host()?;
    let bytes = host.fetch_ref(&valid).await?;
    config_fits_embedded_schema(args, &valid, &bytes)?;
    let answer = off_runtime(move || answer(&host, &valid, &bytes, input)).await?;
    println!("{answer}");
    Ok(())
}

/// The plugin's answer to one `plugin call` input.
fn answer(host: &PolicyHost, valid: &ValidRef, bytes: &[u8], input: CallInput) -> anyhow::Result<serde_json::Value> {
    Ok(if let Some(stats) = input.trigger {
        let stats: TriggerStats = serde_json::from_str(&stats).context("--trigger")?;
        let policy = load::<TriggerKind>(host, valid, bytes, PolicyLog::Shown)?;
        serde_json::to_value(policy.decide(&stats)?)?
    } else if let Some(file) = input.split {
        let text = if file.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("--split: reading stdin")?
        } else {
            std::fs::read_to_string(&file).with_context(|| format!("--split: {}", file.display()))?
        };
        let lines: Vec<&str> = text.lines().collect();
        let policy = load::<SplitterKind>(host, valid, bytes, PolicyLog::Shown)?;
        let assignments = policy.split(SampleBatch::from_lines(0, &lines)?)?;
        let (train, eval, skip) = assignments.counts();
        serde_json::json!({"assignments": assignments.to_vec(), "train": train, "eval": eval, "skip": skip})
    } else if let Some(json) = input.select {
        let select: SelectInput = serde_json::from_str(&json).context("--select")?;
        let policy = load::<SelectorKind>(host, valid, bytes, PolicyLog::Shown)?;
        serde_json::to_value(policy.select(select.deployed.as_ref(), &select.candidates)?)?
    } else {
        bail!("give one of --trigger, --split or --select");
    })
}

/// Runs `work` (instantiating and calling a plugin) on a blocking thread, as `perennial run`
/// runs its policies: WASI's stdio blocks on the async runtime, which panics on one of the
/// runtime's own threads when a plugin prints or panics.
pub(super) async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(work).await.context("the plugin's thread stopped")?
}

/// Configs to benchmark the built-ins with when none is given.
fn default_bench_config(plugin: &str) -> Option<serde_json::Value> {
    Some(match plugin {
        "builtin:threshold-trigger" => serde_json::json!({"condition": {"operator": ">", "threshold": 500}}),
        "builtin:ratio-split" => serde_json::json!({"trainProb": 0.8}),
        "builtin:metric-select" => serde_json::json!({"metric": "accuracy"}),
        _ => return None,
    })
}

async fn bench(args: &PluginArgs, iterations: u32, batch: usize) -> anyhow::Result<()> {
    let mut reference = args.reference()?;
    if reference.config.is_none() {
        reference.config = default_bench_config(&args.plugin);
    }
    let valid = reference.validate().map_err(|err| anyhow::anyhow!("{}: {err}", args.plugin))?;
    let uncached = PolicyHost::new(None, S3Credentials::from_env())?;
    args.trust(&uncached)?;
    let bytes = uncached.fetch_ref(&valid).await?;
    let cold = uncached.inspect(&valid, &bytes)?;
    let Some((world, _)) = world_of(&cold.exports) else {
        bail!("{}: not a Perennial policy", args.plugin);
    };
    println!("{} ({world}, {} bytes) on {}", cold.source, cold.size, policy::platform::this_node());
    let what = if cold.precompiled.is_some() { "verify + load (precompiled):" } else { "compile (cold):            " };
    println!("{what}  {:>9.2} ms", ms(cold.compile_time));
    let trust = args.trust_key.clone();
    off_runtime(move || bench_calls(world, &valid, &bytes, trust, iterations, batch)).await
}

/// Loads from the disk cache and times calls (on a blocking thread: see [`off_runtime`]).
fn bench_calls(
    world: &str,
    valid: &ValidRef,
    bytes: &[u8],
    trust_key: Option<PathBuf>,
    iterations: u32,
    batch: usize,
) -> anyhow::Result<()> {
    let cache_dir = tempfile::tempdir()?;
    let cached_host = PolicyHost::new(Some(cache_dir.path().to_path_buf()), None)?;
    if let Some(path) = trust_key {
        cached_host.trust(TrustedKey::from_file(&path).map_err(|err| anyhow::anyhow!("--trust-key {err}"))?);
    }
    cached_host.inspect(valid, bytes)?;
    cached_host.clear_memory_cache();
    let started = Instant::now();
    load_as(world, &cached_host, valid, bytes)?;
    println!("load from disk cache + configure: {:>5.3} ms", ms(started.elapsed()));

    let times = match world {
        "trigger-policy" => {
            let policy = load::<TriggerKind>(&cached_host, valid, bytes, PolicyLog::Quiet)?;
            let stats = TriggerStats { pending_train: 501, ..TriggerStats::default() };
            time_calls(iterations, || policy.decide(&stats).map(drop))?
        }
        "splitter-policy" => {
            let policy = load::<SplitterKind>(&cached_host, valid, bytes, PolicyLog::Quiet)?;
            let lines: Vec<String> = (0..batch).map(|i| format!("images/{i:08}.jpg,{:>43}", i % 10)).collect();
            let template = SampleBatch::from_lines(0, &lines)?;
            let times = time_calls(iterations.min(500), || policy.split(template.clone()).map(drop))?;
            let per_sample = median(&times).as_secs_f64() / batch as f64;
            println!("split throughput:             {:>9.2} M samples/s (batch {batch})", 1e-6 / per_sample);
            times
        }
        _ => {
            let policy = load::<SelectorKind>(&cached_host, valid, bytes, PolicyLog::Quiet)?;
            let model = |accuracy: f64| ModelInfo {
                url: "/output/eval/1/index.pkl".into(),
                format: "pkl".into(),
                metrics: [("accuracy".to_owned(), accuracy)].into(),
            };
            let candidates = [model(0.9), model(0.8)];
            time_calls(iterations, || policy.select(Some(&model(0.85)), &candidates).map(drop))?
        }
    };
    println!("call: median {:>8.2} µs, p90 {:>8.2} µs", us(median(&times)), us(percentile(&times, 0.9)));
    Ok(())
}

fn time_calls(
    iterations: u32,
    mut call: impl FnMut() -> Result<(), policy::PolicyError>,
) -> anyhow::Result<Vec<Duration>> {
    for _ in 0..iterations.min(50) {
        call()?;
    }
    let mut times = Vec::with_capacity(iterations as usize);
    for _ in 0..iterations.max(1) {
        let started = Instant::now();
        call()?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok(times)
}

fn median(sorted: &[Duration]) -> Duration {
    percentile(sorted, 0.5)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// What `plugin replay` replays, and how it reports.
struct Replay {
    job: String,
    state_dir: PathBuf,
    rootfs: Option<PathBuf>,
    filter: decisions::Filter,
    show: usize,
    json: bool,
}

async fn replay(args: &PluginArgs, replay: Replay) -> anyhow::Result<()> {
    let valid = args.validate()?;
    let host = args.host()?;
    let bytes = host.fetch_ref(&valid).await?;
    let inspection = host.inspect(&valid, &bytes)?;
    let Some((world, _)) = world_of(&inspection.exports) else {
        bail!("{}: not a Perennial policy; it exports {}", args.plugin, inspection.exports.join(", "));
    };
    let kind = match world {
        "trigger-policy" => decisions::Kind::Trigger,
        "splitter-policy" => decisions::Kind::Splitter,
        _ => decisions::Kind::Selector,
    };
    if let Some(asked) = replay.filter.kind
        && asked != kind
    {
        bail!("--kind: {} is a {world}, it cannot replay other decisions", args.plugin);
    }
    let store = decisions::open_edge_store(&replay.state_dir)?;
    let job = decisions::job_key(&replay.job);
    let mut query = replay.filter.query(None)?;
    query.kind = Some(kind.into());
    let records = decisions::records(&store, &job, &query)?;
    let spec = perennial_edge::job_spec(&store, &job)?;
    drop(store);
    let source = inspection.source.clone();
    let digest = inspection.digest.clone();
    let report = off_runtime(move || -> anyhow::Result<replay::KindReport> {
        let keep = replay.show;
        Ok(match kind {
            decisions::Kind::Trigger => {
                let policy = load::<TriggerKind>(&host, &valid, &bytes, PolicyLog::Quiet)?;
                replay::triggers(&records, keep, &mut |stats| policy.decide(stats).map_err(|err| err.to_string()))
            }
            decisions::Kind::Selector => {
                let policy = load::<SelectorKind>(&host, &valid, &bytes, PolicyLog::Quiet)?;
                replay::selections(&records, keep, &mut |input| {
                    policy.select(input.deployed.as_ref(), &input.candidates).map_err(|err| err.to_string())
                })
            }
            decisions::Kind::Splitter => {
                let policy = load::<SplitterKind>(&host, &valid, &bytes, PolicyLog::Quiet)?;
                let Some(spec) = spec else { bail!("job {job}: its spec is not in the state dir") };
                let csv = spec.dataset_format.eq_ignore_ascii_case("csv");
                let mut index: Box<dyn perennial_edge::IndexFile> = if spec.dataset_url.starts_with("s3://") {
                    Box::new(perennial_edge::S3Index::open(&spec.dataset_url, S3Credentials::from_env().as_ref())?)
                } else {
                    let path = super::edge::host_path(replay.rootfs.as_deref(), &spec.dataset_url);
                    Box::new(perennial_edge::LocalFile { path: path.into() })
                };
                let max_line = perennial_edge::IngestLimits::default().max_line;
                replay::splits(
                    &records,
                    keep,
                    &mut |input| replay::read_batch(index.as_mut(), input, csv, max_line),
                    &mut |batch| policy.split(batch).map_err(|err| err.to_string()),
                )
            }
        })
    })
    .await?;
    let kind_name = perennial_edge::decisions::DecisionKind::from(kind);
    if replay.json {
        let json = serde_json::json!({"plugin": source, "sha256": digest, "kind": kind_name, "report": report});
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_replay(&source, &digest, kind_name, &report);
    }
    if report.agrees() { Ok(()) } else { Err(super::Exit::quiet(1).into()) }
}

pub(super) fn print_replay(
    source: &str,
    digest: &str,
    kind: perennial_edge::decisions::DecisionKind,
    report: &replay::KindReport,
) {
    println!("{source} (sha256 {}) on the recorded {kind} decisions:", digest.get(..12).unwrap_or(digest));
    println!(
        "  {} decisions: {} agree, {} disagree, {} not comparable (not replayed)",
        report.decisions, report.agreed, report.disagreed, report.not_comparable
    );
    for skipped in &report.skipped {
        println!("  not replayed: {skipped}");
    }
    if !report.disagreements.is_empty() {
        let shown = report.disagreements.len();
        println!("first {shown} disagreement{}:", if shown == 1 { "" } else { "s" });
    }
    for d in &report.disagreements {
        println!("  #{} {} round {}: {}", d.id, replay::time(d.at_ms), d.round, d.input);
        let by = &d.recorded_by;
        let digest = by.digest.get(..12).unwrap_or(&by.digest);
        let by = if digest.is_empty() { by.plugin.clone() } else { format!("{} sha256:{digest}", by.plugin) };
        println!("    recorded:  {:<24} {} (by {by})", d.recorded, d.recorded_reason);
        println!("    candidate: {:<24} {}", d.candidate, d.candidate_reason);
    }
    if !report.effects.is_empty() {
        println!("what it would have changed:");
    }
    for effect in &report.effects {
        println!("  {}", effect.describe());
    }
}
