//! `perennial plugin compile`, `keygen` and `platform`: policies compiled for a node rather than
//! on it, signed with a key the node trusts.

use std::io::Write as _;
use std::path::{Path, PathBuf};
#[cfg(feature = "edge")]
use std::time::Instant;

use anyhow::{Context, bail};
use perennial_policy::{self as policy, platform, signing};

/// What `plugin compile` was asked.
#[cfg(feature = "edge")]
pub struct Compile {
    pub plugin: String,
    pub sha256: Option<String>,
    pub targets: Vec<String>,
    pub sign_key: PathBuf,
    pub out_dir: PathBuf,
    /// Registry logins on standard input (the operator's compile of a job's `oci://` policy).
    pub logins_on_stdin: bool,
}

/// The most read of the logins on standard input.
#[cfg(feature = "edge")]
const MAX_LOGINS_BYTES: u64 = 1 << 20;

/// The registry logins on standard input (JSON of a `RegistryAuth`); an error never quotes them.
#[cfg(feature = "edge")]
fn logins_from_stdin() -> anyhow::Result<perennial_types::RegistryAuth> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::io::stdin().take(MAX_LOGINS_BYTES + 1).read_to_end(&mut bytes).context("reading the logins")?;
    if bytes.len() as u64 > MAX_LOGINS_BYTES {
        bail!("the logins on standard input are more than {MAX_LOGINS_BYTES} bytes");
    }
    serde_json::from_slice(&bytes).map_err(|err| {
        anyhow::anyhow!(
            "the logins on standard input are not JSON of logins (line {}, column {})",
            err.line(),
            err.column()
        )
    })
}

/// `plugin compile`: the component, compiled for each target and signed, written as
/// `OUT_DIR/NAME.PLATFORM.pcwasm`. Everything is checked before the first compile.
#[cfg(feature = "edge")]
pub async fn compile(args: Compile) -> anyhow::Result<()> {
    for target in &args.targets {
        platform::check_target(target).map_err(|err| anyhow::anyhow!("--target {err}"))?;
    }
    let key = std::sync::Arc::new(
        signing::SigningKey::from_file(&args.sign_key).map_err(|err| anyhow::anyhow!("--sign-key {err}"))?,
    );
    if !args.out_dir.is_dir() {
        bail!("--out-dir {} is not a folder", args.out_dir.display());
    }
    let mut reference = policy::PolicyRef::new(&args.plugin);
    reference.sha256 = args.sha256.clone();
    let valid = reference.validate().map_err(|err| anyhow::anyhow!("{}: {err}", args.plugin))?;
    let host = policy::PolicyHost::new(None, perennial_storage::S3Credentials::from_env())?;
    let bytes = match args.logins_on_stdin {
        true => host.fetch_ref_for_job(&valid, &logins_from_stdin()?).await?,
        false => host.fetch_ref(&valid).await?,
    };
    if policy::artifact::is_artifact(&bytes) {
        bail!("{} is already a precompiled policy: compile its source component", args.plugin);
    }
    let digest = policy::artifact::sha256_hex(&bytes);
    if let Some(expected) = &valid.sha256
        && *expected != digest
    {
        bail!("{} has sha256 {digest}, but --sha256 says {expected}", args.plugin);
    }
    // The operator's compile gives way to its control plane from this line on.
    println!(
        "{}{} ({:.1} MB, sha256 {digest}): compiling for {}",
        policy::compiler::FETCHED,
        args.plugin,
        bytes.len() as f64 / 1e6,
        args.targets.join(", ")
    );
    let stem = stem(&args.plugin);
    for target in args.targets {
        let started = Instant::now();
        let (component, signer, plugin) = (bytes.clone(), key.clone(), args.plugin.clone());
        let (target, sealed) = tokio::task::spawn_blocking(move || {
            let sealed = policy::precompile::compile_signed(&component, &target, &signer)
                .map_err(|err| anyhow::anyhow!("compiling {plugin} for {target}: {err}"))?;
            anyhow::Ok((target, sealed))
        })
        .await
        .context("the compile stopped")??;
        let path = args.out_dir.join(format!("{stem}.{target}.pcwasm"));
        write_new(&path, &sealed, 0o644, true)?;
        println!(
            "{}: {} for {target}, {:.1} MB, compiled in {:.1} s, signed by key {}",
            path.display(),
            args.plugin,
            sealed.len() as f64 / 1e6,
            started.elapsed().as_secs_f64(),
            key.trusted().id()
        );
    }
    println!("sha256 of the component (the jobs' pin): {digest}");
    Ok(())
}

/// The name a compiled file is given: the built-in's name, or the file name without `.wasm`.
#[cfg(feature = "edge")]
fn stem(plugin: &str) -> String {
    let last = plugin.strip_prefix("builtin:").unwrap_or(plugin).rsplit('/').next().unwrap_or(plugin);
    let last = last.split(['?', '#']).next().unwrap_or(last);
    let stem = last.strip_suffix(".wasm").unwrap_or(last);
    if stem.is_empty() { "policy".into() } else { stem.to_owned() }
}

/// `plugin keygen NAME`: NAME.key (mode 0600) and NAME.pub; neither may exist already.
pub fn keygen(name: &Path) -> anyhow::Result<()> {
    let private_path = with_extension(name, "key");
    let public_path = with_extension(name, "pub");
    for path in [&private_path, &public_path] {
        if path.exists() {
            bail!("{} exists: a key is never overwritten (remove it, or choose another NAME)", path.display());
        }
    }
    let (private, public) = signing::generate().map_err(|err| anyhow::anyhow!(err))?;
    write_new(&private_path, private.as_bytes(), 0o600, false)?;
    write_new(&public_path, public.to_pem().as_bytes(), 0o644, false)?;
    println!("{}: the private key (sign with it: plugin compile --sign-key; keep it secret)", private_path.display());
    println!("{}: the public key (nodes trust it: --trust-key)", public_path.display());
    println!("key id: {}", public.id());
    Ok(())
}

/// `plugin platform`: what `plugin compile --target` must name for this node.
pub fn platform() {
    let node = platform::this_node();
    println!("platform:    {node}");
    println!("fingerprint: {}", platform::fingerprint(node));
    println!("wasmtime:    {}", platform::WASMTIME_VERSION);
    if policy::HAS_COMPILER {
        println!("compiler:    yes (compiles policies itself; also runs precompiled ones given --trust-key)");
    } else {
        println!("compiler:    no (runs only signed precompiled policies: plugin compile --target {node})");
    }
}

fn with_extension(name: &Path, extension: &str) -> PathBuf {
    let mut path = name.as_os_str().to_owned();
    path.push(".");
    path.push(extension);
    PathBuf::from(path)
}

/// Writes `bytes` to `path` whole or not at all (a temporary file renamed), with `mode`;
/// `replace`: whether an existing file may be replaced.
fn write_new(path: &Path, bytes: &[u8], mode: u32, replace: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let folder = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(folder).with_context(|| format!("{}", folder.display()))?;
    file.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(bytes).with_context(|| format!("{}", path.display()))?;
    file.as_file().sync_all()?;
    if replace {
        file.persist(path).map_err(|err| err.error).with_context(|| format!("{}", path.display()))?;
    } else {
        file.persist_noclobber(path).map_err(|err| err.error).with_context(|| format!("{}", path.display()))?;
    }
    Ok(())
}

#[cfg(all(test, feature = "edge"))]
mod tests {
    use super::stem;

    #[test]
    fn compiled_files_are_named_after_their_component() {
        assert_eq!(stem("builtin:first-select"), "first-select");
        assert_eq!(stem("./target/trigger.wasm"), "trigger");
        assert_eq!(stem("https://example.com/p/split.wasm?x=1"), "split");
        assert_eq!(stem("s3://bucket/"), "policy");
    }
}
