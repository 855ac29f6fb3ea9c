//! The operator's Kubernetes client: kube-rs's, with two layers of our own.
//!
//! - A token file is read trimmed. `kubectl create token NAME > file` ends the token in a
//!   newline, which kube-rs puts in the `Authorization` header as is (client-go trims it): every
//!   call then fails. The file is read again every minute (projected tokens rotate), and a read
//!   that fails keeps the last token, as kube-rs and client-go do.
//! - Every answer's status is seen by [`ApiHealth`], so that `/healthz` and `/readyz` say when the
//!   API server refuses the operator's credentials instead of answering 200 while nothing works;
//!   every request is counted there too, by verb and resource (`/metrics`).
//! - At most [`MAX_IN_FLIGHT`] calls at once; more wait here, in order.
//! - Each call, from when it is sent until its answer's headers come, is the control plane's
//!   work for [`ApiHealth::give_way`]: the compiles for the nodes pause meanwhile, and a little
//!   after ([`perennial_artifact::give_way`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request, Response, header::AUTHORIZATION};
use kube::client::{Body, ClientBuilder};

/// The most calls in flight at once (client-go bounds a controller by rate): a fleet's burst (a
/// thousand nodes reporting at once, each job's first reconcile) waits here rather than in the
/// API server's priority-and-fairness queues, which it overflowed (429s, retried) at 1,000 nodes,
/// the Lease's renewals starved among them. A watch holds its slot only until its headers come.
pub const MAX_IN_FLIGHT: usize = 32;

/// How often a token file is read again.
const TOKEN_RELOAD: Duration = Duration::from_secs(60);
/// Refused credentials this long, with no call accepted in between: `/healthz` fails, so that the
/// kubelet restarts the process (which reads its credentials afresh).
const REFUSED_UNHEALTHY_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the token file {path}: {source}")]
    TokenFile { path: PathBuf, source: std::io::Error },
    #[error("the token file {path} holds no token (empty, or only whitespace)")]
    EmptyToken { path: PathBuf },
    #[error("the token file {path} holds characters a token cannot have (inside the token, not at its ends)")]
    BadToken { path: PathBuf },
    #[error("Kubernetes client: {0}")]
    Kube(#[from] kube::Error),
}

/// A client for `config` whose answers `health` sees.
pub fn build(mut config: kube::Config, health: Arc<ApiHealth>) -> Result<kube::Client, ClientError> {
    // An inline token takes precedence over a file in kube-rs too: only a file is ours to read.
    let token_file = match config.auth_info.token {
        Some(_) => None,
        None => config.auth_info.token_file.take().map(PathBuf::from),
    };
    let token = token_file.map(TokenFile::open).transpose()?.map(Arc::new);
    let builder = ClientBuilder::try_from(config)?;
    let builder = builder.with_layer(&tower::limit::ConcurrencyLimitLayer::new(MAX_IN_FLIGHT));
    // Outside the concurrency limit: a call waiting for its turn is work waiting too.
    let give_way = health.give_way.clone();
    let builder = builder.with_layer(&tower::util::MapFutureLayer::new(move |call| {
        let in_flight = give_way.begin();
        async move {
            let answer = call.await;
            drop(in_flight);
            answer
        }
    }));
    let seen = health.clone();
    let builder = builder.with_layer(&tower::util::MapResponseLayer::new(move |response: Response<_>| {
        seen.answered(response.status().as_u16());
        response
    }));
    let counted = health.clone();
    let builder = builder.with_layer(&tower::util::MapRequestLayer::new(move |mut request: Request<Body>| {
        counted.requests.sent(request.method(), request.uri().path(), request.uri().query());
        if let Some(token) = &token {
            request.headers_mut().insert(AUTHORIZATION, token.header());
        }
        request
    }));
    Ok(builder.build())
}

/// A bearer token read from a file, trimmed, read again every [`TOKEN_RELOAD`].
struct TokenFile {
    path: PathBuf,
    current: Mutex<(HeaderValue, Instant)>,
}

impl TokenFile {
    fn open(path: PathBuf) -> Result<TokenFile, ClientError> {
        let header = read_token(&path)?;
        Ok(TokenFile { path, current: Mutex::new((header, Instant::now())) })
    }

    fn header(&self) -> HeaderValue {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.1.elapsed() >= TOKEN_RELOAD {
            match read_token(&self.path) {
                Ok(header) => current.0 = header,
                Err(err) => tracing::warn!("{err}; the last token read is used"),
            }
            current.1 = Instant::now();
        }
        current.0.clone()
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, ClientError> {
    // A token is a few KiB at most; a bigger file is not one.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| std::io::Read::read_to_string(&mut std::io::Read::take(file, 64 * 1024), &mut text))
        .map_err(|source| ClientError::TokenFile { path: path.to_owned(), source })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ClientError::EmptyToken { path: path.to_owned() });
    }
    let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| ClientError::BadToken { path: path.to_owned() })?;
    header.set_sensitive(true);
    Ok(header)
}

/// What the API server's answers say about the operator's own credentials.
#[derive(Debug, Default)]
pub struct ApiHealth {
    state: Mutex<Answers>,
    /// Every request sent, by verb and resource.
    pub requests: crate::api_requests::ApiRequests,
    /// Told of every call and answer: the control plane's work, which compiles give way to.
    pub give_way: Arc<perennial_artifact::give_way::GiveWay>,
}

#[derive(Debug, Default)]
struct Answers {
    /// Since when every answer has been 401; `None` once one was not.
    refused_since: Option<Instant>,
}

impl ApiHealth {
    pub(crate) fn answered(&self, status: u16) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // 401: the credentials themselves (a 403 is RBAC refusing one call, which a restart does
        // not mend). Any other answer clears: one call accepted means the credentials work.
        if status == 401 {
            if state.refused_since.is_none() {
                tracing::warn!(status, "the API server refuses the operator's credentials");
            }
            state.refused_since.get_or_insert_with(Instant::now);
        } else if state.refused_since.take().is_some() {
            tracing::info!("the API server accepts the operator's credentials again");
        }
    }

    /// The last answers were all refusals: not ready (a Service sends no edge here).
    pub fn refused(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).refused_since.is_some()
    }

    /// Refused for a whole [`REFUSED_UNHEALTHY_AFTER`]: not alive (restart me).
    pub fn refused_too_long(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.refused_since.is_some_and(|since| since.elapsed() >= REFUSED_UNHEALTHY_AFTER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_ending_in_a_newline_is_read_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "abc.def\n").expect("write");
        let header = read_token(&path).expect("a token");
        assert_eq!(header.to_str().expect("ascii"), "Bearer abc.def");
        assert!(header.is_sensitive(), "never printed");
    }

    #[test]
    fn an_empty_or_broken_token_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, " \n").expect("write");
        let err = read_token(&path).expect_err("empty").to_string();
        assert!(err.contains("token") && err.contains("no token"), "{err}");
        std::fs::write(&path, "abc\ndef\n").expect("write");
        let err = read_token(&path).expect_err("a newline inside").to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        let err = read_token(&dir.path().join("missing")).expect_err("missing").to_string();
        assert!(err.contains("missing"), "{err}");
    }

    #[test]
    fn refusals_until_an_accepted_call() {
        let health = ApiHealth::default();
        assert!(!health.refused(), "nothing seen yet");
        health.answered(200);
        health.answered(401);
        assert!(health.refused());
        assert!(!health.refused_too_long(), "not for a minute yet");
        health.answered(404);
        assert!(!health.refused(), "an answer that is not a refusal clears");
    }
}
