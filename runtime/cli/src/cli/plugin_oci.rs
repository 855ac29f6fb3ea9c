//! `perennial plugin push` and `pull`: a policy as an OCI artifact (the CNCF Wasm layout), with
//! the docker `config.json`'s credentials for the registry.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use perennial_oci::{OciRef, Options};
use perennial_policy::{self as policy, Source};

#[derive(Args)]
pub struct Registry {
    /// Plain HTTP to a registry that is not on this machine (one on this machine, localhost or
    /// 127.0.0.1, is always reached over plain HTTP).
    #[arg(long)]
    insecure: bool,
}

#[cfg(feature = "edge")]
#[derive(Args)]
pub struct PushArgs {
    /// The component (.wasm) to push.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Where: oci://HOST[:PORT]/REPO:TAG.
    #[arg(value_name = "REF")]
    reference: String,
    #[command(flatten)]
    registry: Registry,
}

#[derive(Args)]
pub struct PullArgs {
    /// What: oci://HOST[:PORT]/REPO[:TAG][@sha256:MANIFEST].
    #[arg(value_name = "REF")]
    reference: String,
    /// Expected SHA-256 of the component: anything else is refused before it is read.
    #[arg(long)]
    sha256: Option<String>,
    /// Where to write it (default: the repository's last part, .wasm, here).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    registry: Registry,
}

fn oci_ref(reference: &str) -> anyhow::Result<OciRef> {
    match policy::parse_source(reference) {
        Ok(Source::Oci(oci)) => Ok(oci),
        Ok(_) => bail!("{reference}: not an oci:// reference (oci://HOST[:PORT]/REPO[:TAG])"),
        // One holding credentials is refused, and not shown.
        Err(err) => bail!("{}: {err}", perennial_types::policy::shown_plugin(reference)),
    }
}

fn options(oci: &OciRef, registry: &Registry) -> anyhow::Result<Options> {
    let limit = policy::COMPONENT_READ;
    let mut options =
        Options::from_docker_config(oci, limit.max_bytes, limit.timeout).map_err(|err| anyhow::anyhow!(err))?;
    options.plain_http = registry.insecure;
    Ok(options)
}

/// `plugin push FILE REF`: checks that FILE is a policy component, pushes it, prints the pins.
#[cfg(feature = "edge")]
pub async fn push(args: PushArgs) -> anyhow::Result<()> {
    let oci = oci_ref(&args.reference)?;
    if oci.tag.is_none() || oci.digest.is_some() {
        bail!("{oci}: push to a tag: oci://HOST[:PORT]/REPO:TAG");
    }
    let bytes = read_component(&args.file)?;
    // A policy component, or nothing: what a job would refuse is refused here.
    let host = policy::PolicyHost::with_shared_cache(None, None)?;
    let file = policy::PolicyRef::new(args.file.display().to_string());
    let valid = file.validate().map_err(|err| anyhow::anyhow!(err))?;
    let inspection = host.inspect(&valid, &bytes)?;
    if inspection.precompiled.is_some() {
        bail!(
            "{}: a precompiled policy (.pcwasm) is for one platform; push the component (.wasm)",
            args.file.display()
        );
    }
    let info = perennial_oci::layout::ComponentInfo {
        exports: inspection.exports.clone(),
        imports: inspection.imports.clone(),
        target: None,
    };
    let pushed = perennial_oci::push(&oci, bytes, info, &options(&oci, &args.registry)?)
        .await
        .with_context(|| format!("pushing {} to {oci}", args.file.display()))?;
    let untagged = OciRef { tag: None, digest: Some(pushed.manifest_digest.clone()), ..oci.clone() };
    println!("pushed {} to {oci}", args.file.display());
    println!("  manifest  {}", pushed.manifest_digest);
    println!("  sha256    {}", pushed.component_sha256);
    println!("pin it in a job by the component's digest:");
    println!("  plugin: {oci}");
    println!("  sha256: {}", pushed.component_sha256);
    println!("or by the manifest's:");
    println!("  plugin: {untagged}");
    Ok(())
}

/// `plugin pull REF`: pulls the component, verified, into a file; prints its digests.
pub async fn pull(args: PullArgs) -> anyhow::Result<()> {
    let oci = oci_ref(&args.reference)?;
    let sha256 = match &args.sha256 {
        Some(hex) => {
            let hex = hex.trim().to_ascii_lowercase();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("--sha256: {:?} is not 64 hex digits", args.sha256.as_deref().unwrap_or_default());
            }
            Some(hex)
        }
        None => None,
    };
    let pulled = perennial_oci::pull(&oci, sha256.as_deref(), &options(&oci, &args.registry)?)
        .await
        .with_context(|| format!("pulling {oci}"))?;
    let output = args.output.unwrap_or_else(|| {
        let name = oci.repository.rsplit('/').next().unwrap_or("policy");
        PathBuf::from(format!("{name}.wasm"))
    });
    write_whole(&output, &pulled.bytes, readable_by_all()).with_context(|| format!("writing {}", output.display()))?;
    println!("pulled {oci} into {} ({} bytes)", output.display(), pulled.bytes.len());
    println!("  manifest  {}", pulled.manifest_digest);
    println!("  sha256    {}", pulled.component_sha256);
    Ok(())
}

/// Writes a component to `path` whole or not at all: into a temporary file beside it, renamed
/// over it once written and synced. A failure (a full disk) leaves what was there. The file keeps
/// the mode it had; a new one gets `new_mode` (not the temporary file's 0600).
pub(super) fn write_whole(path: &std::path::Path, bytes: &[u8], new_mode: std::fs::Permissions) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let mut file = tempfile::Builder::new().prefix(".perennial-").suffix(".tmp").tempfile_in(dir)?;
    let mode = std::fs::metadata(path).map(|m| m.permissions()).unwrap_or(new_mode);
    file.as_file().set_permissions(mode)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|err| err.error)?;
    Ok(())
}

/// A component is no secret: 0644.
pub(super) fn readable_by_all() -> std::fs::Permissions {
    std::os::unix::fs::PermissionsExt::from_mode(0o644)
}

#[cfg(feature = "edge")]
fn read_component(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let max = policy::COMPONENT_READ.max_bytes;
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.len() > max {
        bail!("{}: {} bytes, more than the {max} a policy may be", path.display(), meta.len());
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}
