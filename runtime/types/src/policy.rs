//! The policy reference: which plugin a job uses for a decision, and under what limits.
//!
//! ```yaml
//! plugin: builtin:threshold-trigger   # or file:///path.wasm, https://..., s3://bucket/key,
//!                                     # oci://registry.example.org/policies/trigger:1.0
//! sha256: 3f5a...                     # required for https://, s3:// and oci:// (unless the oci://
//!                                     # reference ends in @sha256:MANIFEST); checked when given
//! config: {condition: {operator: ">", threshold: 500}}
//! limits: {timeoutMs: 100, memoryMiB: 32, startTimeoutMs: 2000}
//! onError: fallback                   # or hold
//! ```

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A job's reference to a policy plugin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRef {
    /// `builtin:NAME`, `file:///path`, a plain path, `https://...`, `s3://bucket/key` or
    /// `oci://HOST[:PORT]/REPO[:TAG][@sha256:MANIFEST]`.
    pub plugin: String,
    /// Hex SHA-256 of the component. Required for remote sources (an `oci://` reference pinned by
    /// `@sha256:` needs none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Handed to the plugin's `configure` as JSON. Absent means `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub config: Option<serde_json::Value>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub on_error: OnError,
    /// A candidate that runs beside this policy on the same live inputs and never acts: the
    /// job's status counts how often it agrees. Promote it by making it the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowRef>,
}

/// A shadow policy: a plugin, as a policy names one, with its own limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShadowRef {
    /// `builtin:NAME`, `file:///path`, a plain path, `https://...`, `s3://bucket/key` or
    /// `oci://HOST[:PORT]/REPO[:TAG][@sha256:MANIFEST]`.
    pub plugin: String,
    /// Hex SHA-256 of the component. Required for remote sources (an `oci://` reference pinned by
    /// `@sha256:` needs none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Handed to the plugin's `configure` as JSON. Absent means `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub config: Option<serde_json::Value>,
    #[serde(default)]
    pub limits: Limits,
}

impl ShadowRef {
    /// The shadow as a reference of its own (a failing shadow holds: it never acts anyway).
    pub fn as_policy(&self) -> PolicyRef {
        PolicyRef {
            plugin: self.plugin.clone(),
            sha256: self.sha256.clone(),
            config: self.config.clone(),
            limits: self.limits,
            on_error: OnError::Hold,
            shadow: None,
        }
    }
}

/// What a call may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock time per call, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: u64,
    /// Linear memory of the plugin instance, in MiB.
    #[serde(rename = "memoryMiB", default = "default_memory_mib")]
    #[schemars(range(min = 1, max = MAX_MEMORY_MIB))]
    pub memory_mib: u64,
    /// Wall-clock time a fresh instance may take to start (instantiation and `configure`
    /// together), in milliseconds. A start is rare (the first call, and the next after a failed
    /// one) and a large component's (a Python one's) takes far longer than a call.
    #[serde(default = "default_start_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub start_timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    100
}
fn default_start_timeout_ms() -> u64 {
    2000
}
fn default_memory_mib() -> u64 {
    32
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: default_timeout_ms(),
            memory_mib: default_memory_mib(),
            start_timeout_ms: default_start_timeout_ms(),
        }
    }
}

/// What the job does when the policy fails a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnError {
    /// Decide with the built-in rule for that decision, and say so on the job.
    #[default]
    Fallback,
    /// Make no decision until the policy is fixed or replaced; the job says why.
    Hold,
}

/// Where a plugin comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Builtin(String),
    File(PathBuf),
    Https(String),
    S3(String),
    Oci(OciRef),
}

impl Source {
    pub fn is_remote(&self) -> bool {
        matches!(self, Source::Https(_) | Source::S3(_) | Source::Oci(_))
    }

    /// Whether the source itself names its content by digest (`oci://...@sha256:`).
    pub fn is_pinned(&self) -> bool {
        matches!(self, Source::Oci(oci) if oci.digest.is_some())
    }
}

/// A component in an OCI registry: `oci://HOST[:PORT]/REPO[:TAG][@sha256:MANIFEST]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciRef {
    /// `HOST[:PORT]`.
    pub registry: String,
    /// The repository's path, e.g. `policies/trigger`.
    pub repository: String,
    /// The tag; `latest` when neither a tag nor a digest is given.
    pub tag: Option<String>,
    /// `sha256:HEX`: the manifest's digest.
    pub digest: Option<String>,
}

impl OciRef {
    /// Parses what follows `oci://`; the error says what is wrong.
    pub fn parse(rest: &str) -> Result<OciRef, String> {
        const FORM: &str = "expected oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]";
        // `USER:PASSWORD@HOST`: refused, and never quoted (a message may be logged or stored in
        // a job's status). A password with a `/` puts the `@` after the first `/`, but then
        // what follows it is no digest: it holds a `/`.
        if has_credentials(rest) {
            return Err(format!(
                "credentials in a reference (USER:PASSWORD@HOST) are refused: put them in the docker config.json; {FORM}"
            ));
        }
        let (registry, path) = rest.split_once('/').ok_or_else(|| format!("no repository; {FORM}"))?;
        let host_ok =
            |host: &str| !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
        // An IPv6 address in brackets: `[::1]:5000`.
        let ipv6_ok = |host: &str| {
            host.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
        };
        let registry_ok = if registry.starts_with('[') {
            match registry.rsplit_once("]:") {
                Some((host, port)) => ipv6_ok(&format!("{host}]")) && port.parse::<u16>().is_ok(),
                None => ipv6_ok(registry),
            }
        } else {
            match registry.rsplit_once(':') {
                Some((host, port)) => host_ok(host) && !port.is_empty() && port.parse::<u16>().is_ok(),
                None => host_ok(registry),
            }
        };
        if !registry_ok {
            return Err(format!("{registry:?} is not a registry host (HOST or HOST:PORT); {FORM}"));
        }
        let (name, digest) = match path.split_once('@') {
            Some((name, digest)) => {
                let hex = digest.strip_prefix("sha256:").ok_or_else(|| format!("digest {digest:?}: {FORM}"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                    return Err(format!("digest {digest:?} is not sha256: and 64 lower-case hex digits"));
                }
                (name, Some(digest.to_owned()))
            }
            None => (path, None),
        };
        // A tag follows the last `:` after the last `/`.
        let (repository, tag) = match name.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => (repository, Some(tag)),
            _ => (name, None),
        };
        let component_ok = |part: &str| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && part.as_bytes()[0].is_ascii_alphanumeric()
        };
        if !repository.split('/').all(component_ok) {
            return Err(format!(
                "repository {repository:?} must be lower-case letters, digits, `.`, `_`, `-` and `/`; {FORM}"
            ));
        }
        if let Some(tag) = tag {
            let ok = !tag.is_empty()
                && tag.len() <= 128
                && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                && !tag.starts_with(['.', '-']);
            if !ok {
                return Err(format!("tag {tag:?} must be letters, digits, `.`, `_`, `-` (at most 128)"));
            }
        }
        Ok(OciRef {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest,
        })
    }

    /// The host without its port (an IPv6 address in its brackets, `[::1]`).
    pub fn host(&self) -> &str {
        if self.registry.starts_with('[') {
            return match self.registry.rsplit_once("]:") {
                Some((host, _)) => &self.registry[..host.len() + 1],
                None => &self.registry,
            };
        }
        match self.registry.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => host,
            _ => &self.registry,
        }
    }

    /// Whether the registry is this machine (`localhost`, `127.x.x.x`, `[::1]`): the only one
    /// reached over plain HTTP unless asked otherwise.
    pub fn is_loopback(&self) -> bool {
        is_this_machine(self.host())
    }
}

/// Whether what follows `oci://` holds credentials (`USER:PASSWORD@HOST`). A password with a
/// `/` puts the `@` after the first `/`, but then what follows it is no digest: it holds a `/`.
fn has_credentials(rest: &str) -> bool {
    // Any `@` but the one before a manifest digest: a password may hold `/` or `:`, so the text
    // is not split at its first `/` (`alice:se/cret@host` would show `alice:se`).
    // A digest is `ALG:ENCODED` after the repository; `HOST:PORT` (a port is all digits) is not.
    let digest_like = |after: &str| {
        after.split_once(':').is_some_and(|(alg, encoded)| {
            !alg.is_empty()
                && alg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b))
                && !encoded.is_empty()
                && !encoded.contains('/')
                && !encoded.bytes().all(|b| b.is_ascii_digit())
        })
    };
    let without_digest = match rest.rsplit_once('@') {
        Some((before, after)) if before.contains('/') && digest_like(after) => before,
        _ => rest,
    };
    without_digest.contains('@')
}

/// A plugin reference as it may be shown (a status, a message, a log): an `oci://` one holding
/// credentials is not.
pub fn shown_plugin(plugin: &str) -> std::borrow::Cow<'_, str> {
    match plugin.trim().strip_prefix("oci://") {
        Some(rest) if has_credentials(rest) => "oci://(a reference holding credentials: not shown)".into(),
        _ => plugin.into(),
    }
}

/// Whether `host` (a name, an IPv4 address, or an IPv6 one, bracketed or not) names this machine
/// by itself: `localhost`, `127.x.x.x`, `::1`. A name is not resolved.
pub fn is_this_machine(host: &str) -> bool {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Builtin(name) => write!(f, "builtin:{name}"),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Https(url) | Source::S3(url) => f.write_str(url),
            Source::Oci(oci) => oci.fmt(f),
        }
    }
}

/// Limits a reference may ask for.
/// The built-in policies (`builtin:NAME`); the policy host embeds each one's component.
pub const BUILTIN_POLICIES: &[&str] = &["threshold-trigger", "ratio-split", "first-select", "metric-select"];

pub const MAX_TIMEOUT_MS: u64 = 60_000;
pub const MAX_MEMORY_MIB: u64 = 4096;

/// A reference that has been checked: its source parsed, its digest well formed.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidRef {
    pub source: Source,
    /// Lower-case hex.
    pub sha256: Option<String>,
    /// The JSON text handed to `configure`.
    pub config: String,
    pub limits: Limits,
    pub on_error: OnError,
}

impl PolicyRef {
    /// A reference to `plugin` with defaults for everything else.
    pub fn new(plugin: impl Into<String>) -> Self {
        PolicyRef {
            plugin: plugin.into(),
            sha256: None,
            config: None,
            limits: Limits::default(),
            on_error: OnError::default(),
            shadow: None,
        }
    }

    pub fn with_config(mut self, config: serde_json::Value) -> Self {
        self.config = Some(config);
        self
    }

    /// Checks the reference; the error names the field (`plugin`, `sha256`, `limits.timeoutMs`,
    /// ...) and what is wrong with it.
    pub fn validate(&self) -> Result<ValidRef, String> {
        if let Some(shadow) = &self.shadow {
            shadow.as_policy().validate().map_err(|err| format!("shadow.{err}"))?;
        }
        let source = parse_source(&self.plugin).map_err(|err| format!("plugin: {err}"))?;
        let sha256 = match &self.sha256 {
            Some(hex) => {
                let hex = hex.trim().to_ascii_lowercase();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("sha256: {:?} is not 64 hex digits", self.sha256.as_deref().unwrap_or("")));
                }
                Some(hex)
            }
            None if source.is_remote() && !source.is_pinned() => {
                let how = if matches!(source, Source::Oci(_)) {
                    " (the component's, as `perennial plugin push` prints it), or end the reference in @sha256:MANIFEST"
                } else {
                    ""
                };
                return Err(format!("sha256: required for a remote plugin ({source}){how}"));
            }
            None => None,
        };
        if !(1..=MAX_TIMEOUT_MS).contains(&self.limits.timeout_ms) {
            return Err(format!("limits.timeoutMs: {} is outside 1..={MAX_TIMEOUT_MS}", self.limits.timeout_ms));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.limits.start_timeout_ms) {
            let ms = self.limits.start_timeout_ms;
            return Err(format!("limits.startTimeoutMs: {ms} is outside 1..={MAX_TIMEOUT_MS}"));
        }
        if !(1..=MAX_MEMORY_MIB).contains(&self.limits.memory_mib) {
            return Err(format!("limits.memoryMiB: {} is outside 1..={MAX_MEMORY_MIB}", self.limits.memory_mib));
        }
        let config = match &self.config {
            None | Some(serde_json::Value::Null) => "{}".to_owned(),
            Some(value) => value.to_string(),
        };
        Ok(ValidRef { source, sha256, config, limits: self.limits, on_error: self.on_error })
    }
}

/// Parses a plugin source: `builtin:NAME`, `file:///abs`, a plain path, `https://`, `s3://`,
/// `oci://`.
pub fn parse_source(plugin: &str) -> Result<Source, String> {
    let plugin = plugin.trim();
    if plugin.is_empty() {
        return Err("empty; use builtin:NAME, a path, file://, https://, s3:// or oci://".into());
    }
    if let Some(name) = plugin.strip_prefix("builtin:") {
        if !BUILTIN_POLICIES.contains(&name) {
            return Err(format!("unknown built-in {name:?}; built-ins are {}", BUILTIN_POLICIES.join(", ")));
        }
        return Ok(Source::Builtin(name.to_owned()));
    }
    match plugin.split_once("://") {
        None => Ok(Source::File(PathBuf::from(plugin))),
        Some(("file", path)) if path.starts_with('/') => Ok(Source::File(PathBuf::from(path))),
        Some(("file", _)) => Err("a file:// URL needs an absolute path (file:///path/plugin.wasm)".into()),
        Some(("https", rest)) if !rest.is_empty() => Ok(Source::Https(plugin.to_owned())),
        Some(("s3", rest)) if rest.split_once('/').is_some_and(|(b, k)| !b.is_empty() && !k.is_empty()) => {
            Ok(Source::S3(plugin.to_owned()))
        }
        Some(("s3", _)) => Err("expected s3://bucket/key".into()),
        Some(("oci", rest)) => OciRef::parse(rest).map(Source::Oci),
        Some(("http", _)) => Err("plain http:// is not allowed; use https:// with sha256".into()),
        Some((scheme, _)) => {
            Err(format!("unsupported scheme `{scheme}`; use builtin:NAME, a path, file://, https://, s3:// or oci://"))
        }
    }
}

/// A policy's health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum PolicyHealth {
    /// Loaded and answering.
    #[default]
    Serving,
    /// Its last call failed; the job fell back to the built-in rule or holds (see `message`).
    Failing,
    /// It could not be loaded; the previous one (or the built-in rule) serves.
    LoadFailed,
}

/// A job's policies as it runs them, by kind. Boxed: a map's node has room for eleven entries,
/// which held inline were 4 KiB a job in the operator's job store (a fleet's operator holds every
/// job), for the three a job has.
pub type PolicyStatuses = std::collections::BTreeMap<String, Box<PolicyStatus>>;

/// One policy as the job runs it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    pub plugin: String,
    /// SHA-256 of the component serving.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// The first 12 hex digits of the SHA-256 of the config it was configured with: a config
    /// edit shows here even when the component is the same.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config: String,
    #[serde(default)]
    pub health: PolicyHealth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Its last decision that acted (a round started, a model deployed or kept), with the
    /// policy's own reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<PolicyDecision>,
    /// The shadow running beside it, and how often it agreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowStatus>,
    /// A new policy being loaded (fetched, compiled, started) to replace it, which serves on
    /// until the new one serves or is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loading: Option<PolicyLoading>,
}

/// A policy being loaded in place of the serving one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyLoading {
    pub plugin: String,
    /// SHA-256 of its component, once fetched (or as the reference pins it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// Since when, RFC 3339 (UTC).
    pub since: String,
}

/// A shadow policy as the job shows it: what runs, and its record against the serving policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowStatus {
    pub plugin: String,
    /// SHA-256 of its component (empty when it could not be loaded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config: String,
    /// Calls on live inputs since it was loaded, and how they compared with the serving answer.
    #[serde(default)]
    pub calls: u64,
    #[serde(default)]
    pub agreed: u64,
    #[serde(default)]
    pub disagreed: u64,
    /// Calls that trapped, timed out or ran out of memory.
    #[serde(default)]
    pub failed: u64,
    /// Inputs it was not asked about: it was still busy with earlier ones (the serving policy
    /// never waits for it).
    #[serde(default)]
    pub skipped: u64,
    /// Why it does not run (it could not be loaded), or its last fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_disagreement: Option<ShadowDisagreement>,
}

/// The last input on which a shadow answered otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowDisagreement {
    /// The input, in a few words.
    pub input: String,
    /// The serving policy's answer, and the shadow's with its reason.
    pub answer: String,
    pub shadow_answer: String,
    pub reason: String,
    /// When, RFC 3339 (UTC).
    pub time: String,
}

/// A decision a policy made, as the job shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecision {
    /// `train`, `deploy N` (the index of the candidate deployed) or `keep`.
    pub answer: String,
    /// The policy's reason, as it gave it.
    pub reason: String,
    /// When, RFC 3339 (UTC).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub time: String,
}

/// A short digest of a policy's config, as [`PolicyStatus::config`] shows it.
pub fn config_digest(config: Option<&serde_json::Value>) -> String {
    let text = match config {
        None | Some(serde_json::Value::Null) => "{}".to_owned(),
        Some(value) => value.to_string(),
    };
    config_text_digest(&text)
}

/// [`config_digest`] of the JSON text handed to `configure` ([`ValidRef::config`]).
pub fn config_text_digest(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(text.as_bytes())[..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(yaml_like_json: serde_json::Value) -> Result<ValidRef, String> {
        let parsed: PolicyRef = serde_json::from_value(yaml_like_json).map_err(|e| e.to_string())?;
        parsed.validate()
    }

    #[test]
    fn defaults() {
        let valid = reference(serde_json::json!({"plugin": "builtin:ratio-split"})).unwrap();
        assert_eq!(valid.source, Source::Builtin("ratio-split".into()));
        assert_eq!(valid.limits, Limits { timeout_ms: 100, memory_mib: 32, start_timeout_ms: 2000 });
        assert_eq!(valid.on_error, OnError::Fallback);
        assert_eq!(valid.config, "{}");
    }

    #[test]
    fn a_shadow_is_checked_like_a_policy_and_its_errors_say_so() {
        let shadow = |shadow: serde_json::Value| {
            reference(serde_json::json!({"plugin": "builtin:ratio-split", "shadow": shadow}))
        };
        assert!(shadow(serde_json::json!({"plugin": "builtin:ratio-split", "config": {"trainProb": 0.5}})).is_ok());
        let err = shadow(serde_json::json!({"plugin": "builtin:ratio-split", "limits": {"timeoutMs": 0}})).unwrap_err();
        assert!(err.starts_with("shadow.limits.timeoutMs: 0 is outside"), "{err}");
        let err = shadow(serde_json::json!({"plugin": "https://example.org/p.wasm"})).unwrap_err();
        assert!(err.starts_with("shadow.sha256: required"), "{err}");
        // A shadow has no onError (it never acts) and no shadow of its own.
        let err = shadow(serde_json::json!({"plugin": "builtin:ratio-split", "onError": "hold"})).unwrap_err();
        assert!(err.contains("unknown field `onError`"), "{err}");
    }

    #[test]
    fn sources() {
        let cases: &[(&str, Result<Source, &str>)] = &[
            ("builtin:threshold-trigger", Ok(Source::Builtin("threshold-trigger".into()))),
            ("builtin:nope", Err("unknown built-in \"nope\"; built-ins are ")),
            ("./p.wasm", Ok(Source::File("./p.wasm".into()))),
            ("file:///opt/p.wasm", Ok(Source::File("/opt/p.wasm".into()))),
            ("file://p.wasm", Err("a file:// URL needs an absolute path")),
            ("https://example.org/p.wasm", Ok(Source::Https("https://example.org/p.wasm".into()))),
            ("s3://bucket/p.wasm", Ok(Source::S3("s3://bucket/p.wasm".into()))),
            ("s3://bucket", Err("expected s3://bucket/key")),
            ("http://example.org/p.wasm", Err("plain http:// is not allowed")),
            ("ftp://registry/p", Err("unsupported scheme `ftp`")),
            ("", Err("empty")),
        ];
        for (plugin, expected) in cases {
            match (parse_source(plugin), expected) {
                (Ok(got), Ok(want)) => assert_eq!(&got, want, "{plugin}"),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{plugin}: {got}"),
                (got, want) => panic!("{plugin}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn oci_references() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let oci = |registry: &str, repository: &str, tag: Option<&str>, digest: Option<&str>| {
            Source::Oci(OciRef {
                registry: registry.into(),
                repository: repository.into(),
                tag: tag.map(Into::into),
                digest: digest.map(Into::into),
            })
        };
        let pinned = format!("oci://127.0.0.1:5000/team/trigger:v1@{digest}");
        assert_eq!(parse_source(&pinned), Ok(oci("127.0.0.1:5000", "team/trigger", Some("v1"), Some(&digest))));
        assert_eq!(parse_source(&pinned).unwrap().to_string(), pinned);
        assert_eq!(parse_source("oci://ghcr.io/org/p"), Ok(oci("ghcr.io", "org/p", None, None)));
        assert_eq!(parse_source("oci://localhost:5000/p:1.0"), Ok(oci("localhost:5000", "p", Some("1.0"), None)));
        for (bad, why) in [
            ("oci://ghcr.io", "no repository"),
            ("oci:///p", "\"\" is not a registry host"),
            ("oci://host:port/p", "\"host:port\" is not a registry host"),
            ("oci://ghcr.io/Org/p", "repository \"Org/p\" must be lower-case"),
            ("oci://ghcr.io/p:", "tag \"\" must be"),
            ("oci://ghcr.io/p@sha256:abc", "digest \"sha256:abc\" is not sha256: and 64"),
            ("oci://ghcr.io/p@md5:abc", "digest \"md5:abc\""),
            ("oci://[::1/p", "\"[::1\" is not a registry host"),
        ] {
            let err = parse_source(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        // This machine, by name or address, IPv6 too.
        for (reference, host) in [
            ("oci://localhost:5000/p", "localhost"),
            ("oci://127.0.0.2/p", "127.0.0.2"),
            ("oci://[::1]:5000/p", "[::1]"),
        ] {
            let Ok(Source::Oci(oci)) = parse_source(reference) else { panic!("{reference}") };
            assert_eq!(oci.host(), host);
            assert!(oci.is_loopback(), "{reference}");
        }
        let Ok(Source::Oci(v6)) = parse_source("oci://[::1]:5000/p:v1") else { panic!() };
        assert_eq!((v6.registry.as_str(), v6.tag.as_deref()), ("[::1]:5000", Some("v1")));
        assert!(!is_this_machine("ghcr.io") && !is_this_machine("10.0.0.1") && is_this_machine("::1"));
        assert_eq!(shown_plugin("oci://ghcr.io/p:v1"), "oci://ghcr.io/p:v1");
        // Credentials in a reference: refused, never quoted.
        for bad in [
            "oci://alice:Secret@127.0.0.1:45002/p:v1",
            "oci://alice:Se/cret@127.0.0.1:45002/p:v1",
            "oci://alice:Secret@host",
            "oci://alice:Se/cret@host",
            "oci://alice:Se/cret@host:5000",
            "oci://alice:pw@host/p@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "oci://alice@host/p",
        ] {
            let err = parse_source(bad).unwrap_err();
            assert!(err.starts_with("credentials in a reference (USER:PASSWORD@HOST) are refused"), "{bad}: {err}");
            assert!(!err.contains("alice") && !err.contains("Se"), "{bad}: {err}");
            assert!(!shown_plugin(bad).contains("alice"), "{bad}");
        }
        let err = reference(serde_json::json!({"plugin": "oci://ghcr.io//p"})).unwrap_err();
        assert!(err.starts_with("plugin: repository"), "{err}");
        let err = reference(serde_json::json!({"plugin": "oci://ghcr.io/p:v1"})).unwrap_err();
        assert!(err.starts_with("sha256: required for a remote plugin (oci://ghcr.io/p:v1)"), "{err}");
        assert!(err.contains("@sha256:"), "{err}");
        assert!(reference(serde_json::json!({"plugin": format!("oci://ghcr.io/p@{digest}")})).is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let sha = "ab".repeat(32);
        let cases = [
            (serde_json::json!({"plugin": "https://x.org/p.wasm"}), "sha256: required for a remote plugin"),
            (serde_json::json!({"plugin": "s3://b/p.wasm", "sha256": "xyz"}), "sha256: \"xyz\" is not 64 hex digits"),
            (
                serde_json::json!({"plugin": "builtin:ratio-split", "limits": {"timeoutMs": 0}}),
                "limits.timeoutMs: 0 is outside",
            ),
            (
                serde_json::json!({"plugin": "builtin:ratio-split", "limits": {"memoryMiB": 100000}}),
                "limits.memoryMiB: 100000 is outside",
            ),
            (serde_json::json!({"plugin": "builtin:nope"}), "plugin: unknown built-in"),
            (serde_json::json!({"plugin": "builtin:ratio-split", "onError": "explode"}), "unknown variant `explode`"),
        ];
        for (json, expected) in cases {
            let err = reference(json.clone()).unwrap_err();
            assert!(err.contains(expected), "{json}: {err}");
        }
        let ok = reference(serde_json::json!({"plugin": "s3://b/p.wasm", "sha256": sha.to_uppercase()})).unwrap();
        assert_eq!(ok.sha256.as_deref(), Some(sha.as_str()));
    }

    #[test]
    fn config_is_passed_as_json_text() {
        let valid =
            reference(serde_json::json!({"plugin": "builtin:ratio-split", "config": {"trainProb": 0.8}})).unwrap();
        assert_eq!(valid.config, r#"{"trainProb":0.8}"#);
    }
}
