//! The link's socket layer: WebSocket over TLS (rustls), the node's bearer token checked in the
//! upgrade request, then the `hello` / `welcome` frames. Thin on purpose: what to answer is
//! decided by [`super::handshake`]; this only moves bytes and says why a connection failed.
//!
//! A bad token is refused before the WebSocket opens (HTTP 401, with the reason as the body);
//! a bad `hello` (an old protocol version, another node's name) gets a `refused` frame and a
//! close. Tokens are kept as SHA-256 digests, so a lookup neither stores nor compares secrets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message as Frame};

use super::handshake::{Accepted, HandshakeError, Welcomed, accept_hello, read_welcome};
use super::messages::{FrameError, MAX_FRAME_BYTES, Message, decode, encode};

pub type ServerStream = WebSocketStream<tokio_rustls::server::TlsStream<TcpStream>>;
pub type ClientStream = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// How long the peer has for the TLS and WebSocket handshakes and its first frame.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{what}: {message}")]
    Tls { what: String, message: String },
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    WebSocket(String),
    /// The other side said no (a bad token, an old version, another node's name).
    #[error("refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the peer closed the link")]
    Closed,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

fn tls_error(what: &str) -> impl FnOnce(rustls::Error) -> LinkError + '_ {
    move |err| LinkError::Tls { what: what.to_owned(), message: err.to_string() }
}

/// The server's TLS: its certificate chain and key, PEM.
pub fn server_tls(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ServerConfig>, LinkError> {
    let pem = |message: String| LinkError::Tls { what: "the link's certificate".into(), message };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|err| pem(format!("not PEM certificates: {err}")))?;
    if chain.is_empty() {
        return Err(pem("no certificate in the PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|err| pem(format!("no private key: {err}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error("TLS versions"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(tls_error("the link's certificate"))?;
    Ok(Arc::new(config))
}

/// The edge's TLS: the CA (PEM) that signed the operator's certificate, and nothing else.
pub fn client_tls(ca_pem: &[u8]) -> Result<Arc<ClientConfig>, LinkError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|err| LinkError::Tls { what: "the CA file".into(), message: err.to_string() })?;
        roots.add(cert).map_err(tls_error("the CA file"))?;
    }
    if roots.is_empty() {
        return Err(LinkError::Tls { what: "the CA file".into(), message: "no certificate in it".into() });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error("TLS versions"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Which node a bearer token belongs to.
#[derive(Default)]
pub struct NodeTokens {
    by_digest: HashMap<[u8; 32], String>,
}

impl NodeTokens {
    /// From (node, token) pairs; empty tokens are ignored.
    pub fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> NodeTokens {
        let by_digest =
            pairs.into_iter().filter(|(_, token)| !token.is_empty()).map(|(n, t)| (digest(t), n.to_owned())).collect();
        NodeTokens { by_digest }
    }

    pub fn node_for(&self, token: &str) -> Option<&str> {
        self.by_digest.get(&digest(token)).map(String::as_str)
    }

    /// Whether the token a connection presented (its [`TokenId`]) still opens `node`'s link.
    pub fn admits(&self, token: &TokenId, node: &str) -> bool {
        self.by_digest.get(&token.0).is_some_and(|found| found == node)
    }
}

/// The token a connection presented, as its digest: checked again when the tokens change, so
/// that a revoked token ends the sessions it opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenId([u8; 32]);

impl TokenId {
    pub fn of(token: &str) -> TokenId {
        TokenId(digest(token.trim()))
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().max_message_size(Some(MAX_FRAME_BYTES)).max_frame_size(Some(MAX_FRAME_BYTES))
}

/// The cloud's side of a new connection: TLS, the token, `hello`. Returns the node, the accepted
/// hello (its `welcome` already sent) and the stream. `last_applied_report` gives a node's report
/// watermark for the welcome.
pub async fn accept(
    tcp: TcpStream,
    tls: &TlsAcceptor,
    tokens: &NodeTokens,
    last_applied_report: impl FnOnce(&str) -> u64,
    heartbeat_secs: u32,
) -> Result<(String, Accepted, ServerStream), LinkError> {
    let (node, _, mut ws) = upgrade(tcp, tls, tokens).await?;
    let accepted = greet(&node, &mut ws, last_applied_report(&node), heartbeat_secs).await?;
    Ok((node, accepted, ws))
}

/// TLS and the WebSocket upgrade, the bearer token checked in it: the token's node, the token's
/// id and the stream.
pub async fn upgrade(
    tcp: TcpStream,
    tls: &TlsAcceptor,
    tokens: &NodeTokens,
) -> Result<(String, TokenId, ServerStream), LinkError> {
    let peer = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let stream = tls.accept(tcp).await.map_err(|err| LinkError::Io(format!("TLS from {peer}"), err))?;
        let mut node = None;
        let mut presented = TokenId([0; 32]);
        // The shape tungstenite's `Callback` asks for.
        #[allow(clippy::result_large_err)]
        let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
            let token = request
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_default();
            match tokens.node_for(token.trim()) {
                Some(found) => {
                    node = Some(found.to_owned());
                    presented = TokenId::of(token);
                    Ok(response)
                }
                None => {
                    tracing::warn!(peer, "link refused: a missing or unknown bearer token");
                    let mut refusal = ErrorResponse::new(Some(
                        "the link needs a node's bearer token: this one is missing or unknown".to_owned(),
                    ));
                    *refusal.status_mut() = StatusCode::UNAUTHORIZED;
                    Err(refusal)
                }
            }
        };
        let ws = tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(ws_config()))
            .await
            .map_err(|err| LinkError::WebSocket(format!("from {peer}: {err}")))?;
        Ok::<_, LinkError>((node.unwrap_or_default(), presented, ws))
    })
    .await
    .map_err(|_| LinkError::Timeout(HANDSHAKE_TIMEOUT))?
}

/// Reads `node`'s `hello` and answers it: `welcome` (with the node's report watermark), or
/// `refused` and a close.
pub async fn greet(
    node: &str,
    ws: &mut ServerStream,
    last_applied_report: u64,
    heartbeat_secs: u32,
) -> Result<Accepted, LinkError> {
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, recv(ws))
        .await
        .map_err(|_| LinkError::Timeout(HANDSHAKE_TIMEOUT))??
        .ok_or(LinkError::Closed)?;
    match accept_hello(node, &first, last_applied_report, heartbeat_secs) {
        Ok(accepted) => {
            send(ws, &accepted.welcome).await?;
            Ok(accepted)
        }
        Err(refused) => {
            tracing::warn!(node, "link refused: {refused}");
            let _ = send(ws, &refused.refusal()).await;
            let _ = ws.close(None).await;
            Err(refused.into())
        }
    }
}

/// The edge's side: connects to `url` (`wss://host:port/path`) with its token, sends `hello`
/// and reads the answer.
pub async fn connect(
    url: &str,
    token: &str,
    tls: Arc<ClientConfig>,
    hello: &Message,
) -> Result<(Welcomed, ClientStream), LinkError> {
    let mut request = url.into_client_request().map_err(|err| LinkError::WebSocket(format!("{url}: {err}")))?;
    let host = request.uri().host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
    let port = request.uri().port_u16().unwrap_or(443);
    if request.uri().scheme_str() != Some("wss") {
        return Err(LinkError::WebSocket(format!("{url}: the link is wss:// only (TLS)")));
    }
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
        .map_err(|_| LinkError::WebSocket("the token has characters a header cannot carry".into()))?;
    request.headers_mut().insert("authorization", bearer);
    let server_name = ServerName::try_from(host.clone())
        .map_err(|err| LinkError::Tls { what: format!("{url}: host"), message: err.to_string() })?;
    let opened = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let tcp = TcpStream::connect((host.as_str(), port)).await.map_err(|err| LinkError::Io(url.to_owned(), err))?;
        let _ = tcp.set_nodelay(true);
        let stream = TlsConnector::from(tls)
            .connect(server_name, tcp)
            .await
            .map_err(|err| LinkError::Io(format!("{url}: TLS"), err))?;
        match tokio_tungstenite::client_async_with_config(request, stream, Some(ws_config())).await {
            Ok((ws, _)) => Ok(ws),
            Err(tungstenite::Error::Http(response)) => {
                let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned();
                Err(LinkError::Refused(format!("{} ({})", body.trim(), response.status())))
            }
            Err(err) => Err(LinkError::WebSocket(format!("{url}: {err}"))),
        }
    })
    .await
    .map_err(|_| LinkError::Timeout(HANDSHAKE_TIMEOUT))?;
    let mut ws = opened?;
    send(&mut ws, hello).await?;
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, recv(&mut ws))
        .await
        .map_err(|_| LinkError::Timeout(HANDSHAKE_TIMEOUT))??
        .ok_or(LinkError::Closed)?;
    if let Message::Refused { reason } = first {
        return Err(LinkError::Refused(reason));
    }
    Ok((read_welcome(&first)?, ws))
}

/// Sends one message as a text frame.
pub async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    message: &Message,
) -> Result<(), LinkError> {
    let text = encode(message)?;
    ws.send(Frame::text(text)).await.map_err(|err| LinkError::WebSocket(err.to_string()))
}

/// The next message; `None` when the peer closed. WebSocket pings are answered by the library;
/// the protocol's own `ping`/`pong` are messages like the others.
pub async fn recv<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
) -> Result<Option<Message>, LinkError> {
    loop {
        match ws.next().await {
            None | Some(Ok(Frame::Close(_))) => return Ok(None),
            Some(Ok(Frame::Text(text))) => return Ok(Some(decode(text.as_str())?)),
            Some(Ok(Frame::Binary(_))) => {
                return Err(LinkError::WebSocket("a binary frame: the link speaks text".into()));
            }
            Some(Ok(_)) => continue,
            Some(Err(err)) => return Err(LinkError::WebSocket(err.to_string())),
        }
    }
}
