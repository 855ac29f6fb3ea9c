//! Push and pull a component. Every request has a timeout and the whole operation one more; a
//! pull reads at most [`Options::max_bytes`]. Errors name the reference and what to do; they are
//! built here from what the registry said, never from a credential.

use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWrite;

use crate::credentials::{Credentials, DockerConfig};
use crate::layout::{self, ComponentInfo, WasmConfig};
use perennial_types::policy::OciRef;

/// How long connecting to a registry may take, and waiting for any one read.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach a registry.
#[derive(Clone, Debug)]
pub struct Options {
    /// Plain HTTP for a registry that is not on this machine (one on this machine always is).
    pub plain_http: bool,
    /// `None`: anonymous.
    pub credentials: Option<Credentials>,
    /// Where the credentials came from (or would have), for messages: a file's path.
    pub credentials_from: String,
    /// The most a component may be.
    pub max_bytes: u64,
    /// The whole push or pull.
    pub timeout: Duration,
}

impl Options {
    /// Credentials for `oci`'s registry from the docker `config.json` ([`DockerConfig`]), if it
    /// has some; anonymous otherwise.
    pub fn from_docker_config(oci: &OciRef, max_bytes: u64, timeout: Duration) -> Result<Options, String> {
        let config = DockerConfig::load_default()?;
        Ok(Options {
            plain_http: false,
            credentials: config.credentials(&oci.registry)?,
            credentials_from: config.path().display().to_string(),
            max_bytes,
            timeout,
        })
    }

    /// Anonymous.
    pub fn anonymous(max_bytes: u64, timeout: Duration) -> Options {
        Options { plain_http: false, credentials: None, credentials_from: String::new(), max_bytes, timeout }
    }

    fn auth(&self) -> RegistryAuth {
        match &self.credentials {
            Some(creds) => RegistryAuth::Basic(creds.username.clone(), creds.password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// Why a push or pull failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached, timed out or failed (5xx): a copy already held may serve.
    #[error("{0}")]
    Unreachable(String),
    /// The reference names other content than the pin: `actual` is what the registry has.
    #[error(
        "it names a component with sha256 {actual}, but the reference pins sha256 {expected} (did the tag \
         move?); it is not pulled"
    )]
    Moved { expected: String, actual: String },
    /// Anything else: refused, absent, not a Wasm artifact, too large.
    #[error("{0}")]
    Refused(String),
}

/// The manifest a reference resolves to, and its component layer.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// `sha256:HEX`.
    pub manifest_digest: String,
    /// Hex SHA-256 of the component (the layer's digest).
    pub component_sha256: String,
    layer: OciDescriptor,
}

/// A pulled component, verified against its layer digest (and the manifest's, when pinned).
#[derive(Clone, Debug)]
pub struct Pulled {
    pub bytes: Vec<u8>,
    pub manifest_digest: String,
    pub component_sha256: String,
}

/// A pushed component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// `sha256:HEX`: pin the reference with `@` it.
    pub manifest_digest: String,
    /// Hex SHA-256 of the component: the reference's `sha256:`.
    pub component_sha256: String,
}

fn reference(oci: &OciRef) -> Reference {
    let (registry, repository) = (oci.registry.clone(), oci.repository.clone());
    match (&oci.tag, &oci.digest) {
        (Some(tag), Some(digest)) => Reference::with_tag_and_digest(registry, repository, tag.clone(), digest.clone()),
        (None, Some(digest)) => Reference::with_digest(registry, repository, digest.clone()),
        (Some(tag), None) => Reference::with_tag(registry, repository, tag.clone()),
        (None, None) => Reference::with_tag(registry, repository, "latest".into()),
    }
}

fn client(oci: &OciRef, options: &Options) -> Result<Client, RegistryError> {
    perennial_tls::install_crypto_provider();
    let protocol = if options.plain_http || oci.is_loopback() { ClientProtocol::Http } else { ClientProtocol::Https };
    let config = ClientConfig {
        protocol,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        user_agent: concat!("perennial/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(config).map_err(|err| RegistryError::Refused(format!("no HTTP client for {oci}: {err}")))
}

/// What went wrong, said for `oci`: `Unreachable` when a copy held may serve instead.
fn explain(oci: &OciRef, options: &Options, err: &OciDistributionError) -> RegistryError {
    let registry = &oci.registry;
    let repository = &oci.repository;
    match err {
        OciDistributionError::RequestError(err) => {
            let what = if err.is_timeout() {
                "timed out".to_owned()
            } else if err.is_connect() {
                format!("cannot be reached ({})", cause(err))
            } else {
                cause(err)
            };
            RegistryError::Unreachable(format!("the registry {registry} {what}"))
        }
        OciDistributionError::ServerError { code, .. } if *code >= 500 => {
            RegistryError::Unreachable(format!("the registry {registry} failed (HTTP {code})"))
        }
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::ServerError { code: 401 | 403, .. } => {
            RegistryError::Refused(match &options.credentials {
                None => format!(
                    "the registry {registry} refused access to the repository {repository}: it is private (or absent), \
                     and {} has no credentials for {registry} (`docker login {registry}` writes them)",
                    shown(&options.credentials_from)
                ),
                Some(creds) => format!(
                    "the registry {registry} refused the credentials of user {:?} (from {}) for the repository \
                     {repository}",
                    creds.username,
                    shown(&options.credentials_from)
                ),
            })
        }
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<String> = envelope.errors.iter().map(|e| format!("{:?}: {}", e.code, e.message)).collect();
            let denied = envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::Unauthorized | oci_client::errors::OciErrorCode::Denied
                )
            });
            if denied {
                return explain(
                    oci,
                    options,
                    &OciDistributionError::ServerError { code: 401, url: String::new(), message: String::new() },
                );
            }
            let unknown = envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                )
            });
            if unknown {
                RegistryError::Refused(format!("{oci} is not in the registry ({})", codes.join("; ")))
            } else {
                RegistryError::Refused(format!("the registry {registry} refused {oci}: {}", codes.join("; ")))
            }
        }
        OciDistributionError::ServerError { code, .. } => {
            RegistryError::Refused(format!("the registry {registry} answered HTTP {code} for {oci}"))
        }
        OciDistributionError::DigestError(err) => {
            RegistryError::Refused(format!("{oci}: what the registry sent does not match its digest ({err})"))
        }
        other => RegistryError::Refused(format!("{oci}: {other}")),
    }
}

fn shown(path: &str) -> &str {
    if path.is_empty() { "no docker config.json" } else { path }
}

/// An error and its causes on one line (reqwest's own says only "error sending request").
fn cause(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

async fn bounded<T>(
    oci: &OciRef,
    options: &Options,
    work: impl std::future::Future<Output = Result<T, RegistryError>>,
) -> Result<T, RegistryError> {
    match tokio::time::timeout(options.timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(RegistryError::Unreachable(format!(
            "the registry {} did not finish within {} s for {oci}",
            oci.registry,
            options.timeout.as_secs()
        ))),
    }
}

/// The manifest `oci` names and its component layer; refuses what is not a Wasm artifact.
pub async fn resolve(oci: &OciRef, options: &Options) -> Result<Resolved, RegistryError> {
    let client = client(oci, options)?;
    bounded(oci, options, resolve_with(&client, oci, options)).await
}

async fn resolve_with(client: &Client, oci: &OciRef, options: &Options) -> Result<Resolved, RegistryError> {
    let image = reference(oci);
    let (manifest, manifest_digest) =
        client.pull_image_manifest(&image, &options.auth()).await.map_err(|err| explain(oci, options, &err))?;
    let layers: Vec<&OciDescriptor> = manifest.layers.iter().filter(|l| layout::is_wasm_layer(&l.media_type)).collect();
    let [layer] = layers.as_slice() else {
        let types: Vec<&str> = manifest.layers.iter().map(|l| l.media_type.as_str()).collect();
        return Err(RegistryError::Refused(format!(
            "{oci} is not a Wasm component artifact: it needs one layer of type {} (config {}); it has {} \
             (config {})",
            layout::LAYER_MEDIA_TYPE,
            layout::CONFIG_MEDIA_TYPE,
            if types.is_empty() { "no layers".to_owned() } else { types.join(", ") },
            manifest.config.media_type
        )));
    };
    let component_sha256 = layer
        .digest
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| RegistryError::Refused(format!("{oci}: its layer's digest {:?} is not sha256", layer.digest)))?
        .to_ascii_lowercase();
    Ok(Resolved { manifest_digest, component_sha256, layer: (*layer).clone() })
}

/// Pulls the component `oci` names: when `expected` (hex SHA-256) is given, refuses other
/// content before reading it ([`RegistryError::Moved`]).
pub async fn pull(oci: &OciRef, expected: Option<&str>, options: &Options) -> Result<Pulled, RegistryError> {
    let client = client(oci, options)?;
    bounded(oci, options, async {
        let resolved = resolve_with(&client, oci, options).await?;
        if let Some(expected) = expected
            && !expected.eq_ignore_ascii_case(&resolved.component_sha256)
        {
            return Err(RegistryError::Moved {
                expected: expected.to_ascii_lowercase(),
                actual: resolved.component_sha256,
            });
        }
        let size = u64::try_from(resolved.layer.size).unwrap_or(0);
        if size > options.max_bytes {
            return Err(RegistryError::Refused(format!(
                "{oci}: the component is {size} bytes, more than the {} a policy may be",
                options.max_bytes
            )));
        }
        let mut out = Bounded { bytes: Vec::new(), max: options.max_bytes };
        client.pull_blob(&reference(oci), &resolved.layer, &mut out).await.map_err(|err| match err {
            OciDistributionError::IoError(io) if io.kind() == std::io::ErrorKind::FileTooLarge => {
                RegistryError::Refused(format!(
                    "{oci}: the component is more than the {} bytes a policy may be",
                    options.max_bytes
                ))
            }
            err => explain(oci, options, &err),
        })?;
        // pull_blob checked the layer digest; checked again here, where it matters.
        let actual = hex::encode(Sha256::digest(&out.bytes));
        if actual != resolved.component_sha256 {
            return Err(RegistryError::Refused(format!(
                "{oci}: the component read has sha256 {actual}, not its layer's {}",
                resolved.component_sha256
            )));
        }
        Ok(Pulled { bytes: out.bytes, manifest_digest: resolved.manifest_digest, component_sha256: actual })
    })
    .await
}

/// Pushes `component` to `oci` (its tag) in the Wasm OCI layout; `info` goes in the config.
pub async fn push(
    oci: &OciRef,
    component: Vec<u8>,
    info: ComponentInfo,
    options: &Options,
) -> Result<Pushed, RegistryError> {
    if oci.digest.is_some() {
        return Err(RegistryError::Refused(format!("{oci}: push to a tag (oci://HOST/REPO:TAG), not a digest")));
    }
    let client = client(oci, options)?;
    let image = reference(oci);
    let component_sha256 = hex::encode(Sha256::digest(&component));
    let config = WasmConfig::component(format!("sha256:{component_sha256}"), info);
    let config = Config {
        data: serde_json::to_vec(&config).map_err(|err| RegistryError::Refused(err.to_string()))?.into(),
        media_type: layout::CONFIG_MEDIA_TYPE.into(),
        annotations: None,
    };
    let layers =
        [ImageLayer { data: component.into(), media_type: layout::LAYER_MEDIA_TYPE.into(), annotations: None }];
    let manifest = OciImageManifest::build(&layers, &config, None);
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|err| RegistryError::Refused(err.to_string()))?;
    let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(&manifest_bytes)));
    bounded(oci, options, async {
        client
            .push(&image, &layers, config, &options.auth(), Some(manifest))
            .await
            .map_err(|err| explain(oci, options, &err))?;
        // What the registry now serves under the tag: the digest to pin.
        let served = client
            .fetch_manifest_digest(&image, &options.auth())
            .await
            .map_err(|err| explain(oci, options, &err))?;
        if served != manifest_digest {
            tracing::debug!(%served, computed = %manifest_digest, "the registry serves the manifest under another digest");
        }
        Ok(Pushed { manifest_digest: served, component_sha256 })
    })
    .await
}

/// A buffer that refuses to grow past `max` bytes.
struct Bounded {
    bytes: Vec<u8>,
    max: u64,
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if (self.bytes.len() + buf.len()) as u64 > self.max {
            return std::task::Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, "too large")));
        }
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
