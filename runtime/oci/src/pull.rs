//! The pull path's registry client (what nodes, `perennial run`, the operator and `plugin pull`
//! use), on reqwest: every reply is read with a size bound ([`MAX_MANIFEST_BYTES`],
//! [`MAX_TOKEN_BYTES`], [`MAX_ERROR_BYTES`], the component's limit), chunk by chunk, so a
//! registry cannot make the process hold more; the caller puts the whole operation, reading and
//! checking included, under its timeout.
//!
//! Authentication: the registry's `WWW-Authenticate` challenge on a 401, `Bearer` (a token from
//! its realm, asked with the credentials if any) or `Basic`. Credentials never go over plain HTTP
//! to a token realm on another machine, and a redirect to another host never carries the
//! `Authorization` header (reqwest drops it, and on a change of scheme too).

use base64::Engine as _;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Client, Method, Response, StatusCode, Url};
use serde::Deserialize;

use crate::registry::{CONNECT_TIMEOUT, Options, READ_TIMEOUT, RegistryError, cause, denied, unanswered};
use perennial_types::policy::{OciRef, is_this_machine};

/// The most a manifest may be (containers/image's `MaxManifestBodySize`).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// The most a token service's reply may be.
pub const MAX_TOKEN_BYTES: usize = 1 << 20;
/// The most of an error reply read (the rest is not).
pub const MAX_ERROR_BYTES: usize = 64 << 10;

/// The manifests asked for: OCI's and docker's v2 (what registries serve an artifact as).
const MANIFEST_TYPES: &str =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// One reference's requests, with the authorization its registry asked for once obtained.
pub(crate) struct Session<'a> {
    http: Client,
    base: String,
    oci: &'a OciRef,
    options: &'a Options,
    auth: Option<HeaderValue>,
    challenged: bool,
}

#[derive(Deserialize)]
struct Envelope {
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct TokenReply {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

impl Challenge {
    /// `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"`; `None` for anything else.
    pub(crate) fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, params) = header.split_once(char::is_whitespace).unwrap_or((header, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let (mut realm, mut service, mut scope) = (None, None, None);
        let mut rest = params.trim();
        while !rest.is_empty() {
            let (key, after) = rest.split_once('=')?;
            let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
            let after = after.trim_start();
            let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            } else {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim(), &after[end..])
            };
            match key.as_str() {
                "realm" => realm = Some(value.to_owned()),
                "service" => service = Some(value.to_owned()),
                "scope" => scope = Some(value.to_owned()),
                _ => {}
            }
            rest = next.trim_start().trim_start_matches(',').trim_start();
        }
        Some(Challenge::Bearer { realm: realm?, service, scope })
    }
}

/// Whether credentials may go to the token `realm` of `oci`'s registry: over HTTPS, or over
/// plain HTTP to this machine (by its name or address, never a name resolved) or to the registry's
/// own host when plain HTTP to it was asked for (`--insecure`).
pub(crate) fn realm_may_have_credentials(realm: &Url, oci: &OciRef, plain_http: bool) -> bool {
    match realm.scheme() {
        "https" => true,
        "http" => {
            // This machine's realm only for a registry on this machine: a remote registry naming
            // `http://127.0.0.1:PORT` would have them sent in clear to whatever listens there.
            let host = realm.host_str().unwrap_or_default();
            (is_this_machine(host) && oci.is_loopback()) || (plain_http && host.eq_ignore_ascii_case(oci.host()))
        }
        _ => false,
    }
}

/// The HTTP client: timeouts to connect and per read; redirects followed at most 5 times, never
/// from HTTPS to plain HTTP.
pub(crate) fn http_client() -> Result<Client, String> {
    perennial_tls::install_crypto_provider();
    Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .user_agent(concat!("perennial/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let from_https = attempt.previous().last().is_some_and(|url| url.scheme() == "https");
            if attempt.previous().len() > 5 {
                attempt.error("more than 5 redirects")
            } else if from_https && attempt.url().scheme() != "https" {
                attempt.error("a redirect from HTTPS to plain HTTP")
            } else {
                attempt.follow()
            }
        }))
        .build()
        .map_err(|err| cause(&err))
}

/// A registry's error text, made safe to show: one line, at most 200 characters.
fn shown_text(text: &str) -> String {
    let mut shown: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(200).collect();
    if text.chars().count() > 200 {
        shown.push('…');
    }
    shown
}

impl<'a> Session<'a> {
    pub(crate) fn new(oci: &'a OciRef, options: &'a Options) -> Result<Session<'a>, RegistryError> {
        let http = http_client().map_err(|err| RegistryError::Refused(format!("no HTTP client for {oci}: {err}")))?;
        let scheme = if options.plain_http || oci.is_loopback() { "http" } else { "https" };
        Ok(Session { http, base: format!("{scheme}://{}", oci.registry), oci, options, auth: None, challenged: false })
    }

    fn transport(&self, err: &reqwest::Error) -> RegistryError {
        // A redirect refused (to plain HTTP, or too many) is the registry's doing, not a network
        // fault: no kept copy stands in for it.
        if err.is_redirect() {
            return RegistryError::Refused(format!(
                "the registry {} redirected {} wrongly: {}",
                self.oci.registry,
                self.oci,
                cause(err)
            ));
        }
        unanswered(&self.oci.registry, err)
    }

    /// `METHOD /v2/REPO/PATH`, authorized as the registry asks (once).
    async fn send(&mut self, method: Method, path: &str, accept: Option<&str>) -> Result<Response, RegistryError> {
        let url = format!("{}/v2/{}/{path}", self.base, self.oci.repository);
        loop {
            let mut request = self.http.request(method.clone(), &url);
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            if let Some(auth) = &self.auth {
                request = request.header(AUTHORIZATION, auth.clone());
            }
            let response = request.send().await.map_err(|err| self.transport(&err))?;
            if response.status() != StatusCode::UNAUTHORIZED || self.challenged {
                return Ok(response);
            }
            self.challenged = true;
            let challenge = response.headers().get(WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            drop(response);
            self.authorize(challenge.as_deref()).await?;
        }
    }

    /// Obtains what the challenge asks for, or refuses.
    async fn authorize(&mut self, challenge: Option<&str>) -> Result<(), RegistryError> {
        let oci = self.oci;
        let credentials = self.options.credentials.as_ref();
        match challenge.and_then(Challenge::parse) {
            None => Err(denied(oci, self.options)),
            Some(Challenge::Basic) => {
                let Some(creds) = credentials else { return Err(denied(oci, self.options)) };
                let login =
                    base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", creds.username, creds.password));
                let mut value = HeaderValue::from_str(&format!("Basic {login}"))
                    .map_err(|_| RegistryError::Refused(format!("{oci}: the credentials are not a header value")))?;
                value.set_sensitive(true);
                self.auth = Some(value);
                Ok(())
            }
            Some(Challenge::Bearer { realm, service, scope }) => {
                let shown_realm = shown_text(&realm);
                let mut url = Url::parse(&realm).map_err(|_| {
                    RegistryError::Refused(format!(
                        "the registry {} names the token service {shown_realm:?}, which is not a URL",
                        oci.registry
                    ))
                })?;
                if credentials.is_some() && !realm_may_have_credentials(&url, oci, self.options.plain_http) {
                    return Err(RegistryError::Refused(format!(
                        "the registry {} names the token service {shown_realm}: plain HTTP to another machine, \
                         where the credentials from {} would travel readable; they are not sent",
                        oci.registry,
                        crate::registry::shown(&self.options.credentials_from)
                    )));
                }
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(service) = &service {
                        query.append_pair("service", service);
                    }
                    let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", oci.repository));
                    query.append_pair("scope", &scope);
                }
                let mut request = self.http.get(url);
                if let Some(creds) = credentials {
                    request = request.basic_auth(&creds.username, Some(&creds.password));
                }
                let response = request.send().await.map_err(|err| self.transport(&err))?;
                let status = response.status();
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                    return Err(denied(oci, self.options));
                }
                if status.is_server_error() {
                    return Err(RegistryError::Unreachable(format!(
                        "the token service {shown_realm} of the registry {} failed (HTTP {})",
                        oci.registry,
                        status.as_u16()
                    )));
                }
                if !status.is_success() {
                    return Err(RegistryError::Refused(format!(
                        "the token service {shown_realm} of the registry {} answered HTTP {} for {oci}",
                        oci.registry,
                        status.as_u16()
                    )));
                }
                let body = self.read_limited(response, MAX_TOKEN_BYTES, "token service's reply").await?;
                let reply: TokenReply = serde_json::from_slice(&body).map_err(|_| {
                    RegistryError::Refused(format!("the token service {shown_realm} sent no JSON token reply"))
                })?;
                let token =
                    reply.token.or(reply.access_token).filter(|token| !token.is_empty()).ok_or_else(|| {
                        RegistryError::Refused(format!("the token service {shown_realm} sent no token"))
                    })?;
                let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                    RegistryError::Refused(format!("the token service {shown_realm} sent a token that is not a header"))
                })?;
                value.set_sensitive(true);
                self.auth = Some(value);
                Ok(())
            }
        }
    }

    /// The response if it is a success; otherwise what it says, its body read at most
    /// [`MAX_ERROR_BYTES`].
    async fn success(&self, response: Response) -> Result<Response, RegistryError> {
        let (oci, registry) = (self.oci, &self.oci.registry);
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let code = status.as_u16();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(denied(oci, self.options));
        }
        if status.is_server_error() {
            return Err(RegistryError::Unreachable(format!("the registry {registry} failed (HTTP {code})")));
        }
        let (body, cut) = read_prefix(response, MAX_ERROR_BYTES).await;
        let cut = if cut {
            format!(" (its error reply is more than {MAX_ERROR_BYTES} bytes: the rest was not read)")
        } else {
            String::new()
        };
        let Ok(envelope) = serde_json::from_slice::<Envelope>(&body) else {
            return Err(if status == StatusCode::NOT_FOUND {
                RegistryError::Refused(format!("{oci} is not in the registry (HTTP 404){cut}"))
            } else {
                RegistryError::Refused(format!("the registry {registry} answered HTTP {code} for {oci}{cut}"))
            });
        };
        if envelope.errors.iter().any(|e| matches!(e.code.as_str(), "UNAUTHORIZED" | "DENIED")) {
            return Err(denied(oci, self.options));
        }
        let codes: Vec<String> = envelope
            .errors
            .iter()
            .take(5)
            .map(|e| format!("{}: {}", shown_text(&e.code), shown_text(&e.message)))
            .collect();
        let unknown = envelope
            .errors
            .iter()
            .any(|e| matches!(e.code.as_str(), "MANIFEST_UNKNOWN" | "NAME_UNKNOWN" | "BLOB_UNKNOWN"));
        Err(if unknown || (codes.is_empty() && status == StatusCode::NOT_FOUND) {
            RegistryError::Refused(format!("{oci} is not in the registry ({}){cut}", codes.join("; ")))
        } else {
            RegistryError::Refused(format!(
                "the registry {registry} refused {oci}: HTTP {code} {}{cut}",
                codes.join("; ")
            ))
        })
    }

    /// The body, refused beyond `max` bytes (by its declared length before reading any).
    async fn read_limited(&self, mut response: Response, max: usize, what: &str) -> Result<Vec<u8>, RegistryError> {
        let too_large = || {
            RegistryError::Refused(format!(
                "{}: the registry's {what} is more than the {max} bytes ({} KiB) one may be; it is not read",
                self.oci,
                max / 1024
            ))
        };
        if response.content_length().is_some_and(|len| len > max as u64) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|err| self.transport(&err))? {
            if body.len() + chunk.len() > max {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The manifest the reference names: its bytes (at most [`MAX_MANIFEST_BYTES`]).
    pub(crate) async fn manifest(&mut self) -> Result<Vec<u8>, RegistryError> {
        let oci = self.oci;
        let reference = oci.digest.clone().or_else(|| oci.tag.clone()).unwrap_or_else(|| "latest".into());
        let response = self.send(Method::GET, &format!("manifests/{reference}"), Some(MANIFEST_TYPES)).await?;
        let status = response.status();
        let response = match self.success(response).await {
            Ok(response) => response,
            // A digest that names a blob, not a manifest (the component's sha256 after `@`): some
            // registries fail (5xx) on it. Said as what it is, not as the registry being down.
            Err(RegistryError::Unreachable(why)) if status.is_server_error() && oci.digest.is_some() => {
                let digest = oci.digest.as_deref().unwrap_or_default();
                let blob = self.send(Method::HEAD, &format!("blobs/{digest}"), None).await;
                if blob.is_ok_and(|blob| blob.status().is_success()) {
                    return Err(RegistryError::Refused(format!(
                        "{oci}: {digest} names a blob in the repository (a component's sha256?), not a manifest: \
                         after @ goes the manifest's digest; pin the component's with sha256:"
                    )));
                }
                return Err(RegistryError::Unreachable(why));
            }
            Err(err) => return Err(err),
        };
        self.read_limited(response, MAX_MANIFEST_BYTES, "manifest").await
    }

    /// Streams the blob `digest` into `sink`: refused past `max` bytes.
    pub(crate) async fn blob(
        &mut self,
        digest: &str,
        max: u64,
        mut sink: impl FnMut(&[u8]),
    ) -> Result<u64, RegistryError> {
        let oci = self.oci;
        let response = self.send(Method::GET, &format!("blobs/{digest}"), None).await?;
        let mut response = self.success(response).await?;
        let too_large =
            || RegistryError::Refused(format!("{oci}: the component is more than the {max} bytes a policy may be"));
        if response.content_length().is_some_and(|len| len > max) {
            return Err(too_large());
        }
        let mut read = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(|err| self.transport(&err))? {
            read += chunk.len() as u64;
            if read > max {
                return Err(too_large());
            }
            sink(&chunk);
        }
        Ok(read)
    }
}

/// At most `max` bytes of the body, and whether there was more (not read). Errors end it.
async fn read_prefix(mut response: Response, max: usize) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = max - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return (body, true);
        }
        body.extend_from_slice(&chunk);
    }
    (body, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oci(reference: &str) -> OciRef {
        OciRef::parse(reference).unwrap()
    }

    #[test]
    fn challenges() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(
            Challenge::parse("bearer realm=https://h/t, service=s"),
            Some(Challenge::Bearer { realm: "https://h/t".into(), service: Some("s".into()), scope: None })
        );
        assert_eq!(Challenge::parse(r#"Basic realm="perennial-test""#), Some(Challenge::Basic));
        assert_eq!(Challenge::parse("Bearer service=s"), None, "no realm");
        assert_eq!(Challenge::parse("Negotiate"), None);
    }

    #[test]
    fn credentials_go_over_plain_http_only_to_this_machine() {
        let url = |text: &str| Url::parse(text).unwrap();
        let remote = oci("registry.example.org/p");
        assert!(realm_may_have_credentials(&url("https://auth.example.com/token"), &remote, false));
        assert!(!realm_may_have_credentials(&url("http://auth.example.com/token"), &remote, false));
        assert!(!realm_may_have_credentials(&url("http://auth.example.com/token"), &remote, true));
        assert!(!realm_may_have_credentials(&url("http://registry.example.org/token"), &remote, false));
        assert!(realm_may_have_credentials(&url("http://registry.example.org/token"), &remote, true), "--insecure");
        assert!(!realm_may_have_credentials(&url("ftp://auth.example.com/token"), &remote, false));
        // A remote registry naming a realm on this machine: whatever listens there is no one's.
        assert!(!realm_may_have_credentials(&url("http://127.0.0.1:5001/token"), &remote, false));
        assert!(!realm_may_have_credentials(&url("http://localhost/token"), &remote, true));
        let local = oci("127.0.0.1:5000/p");
        assert!(realm_may_have_credentials(&url("http://127.0.0.1:5001/token"), &local, false));
        assert!(realm_may_have_credentials(&url("http://localhost:5001/token"), &local, false));
        assert!(realm_may_have_credentials(&url("http://[::1]:5001/token"), &local, false));
        assert!(!realm_may_have_credentials(&url("http://192.0.2.1/token"), &local, false));
    }
}
