//! The link's socket layer: WebSocket over TLS (rustls), the node's bearer token checked in the
//! upgrade request, then the `hello` / `welcome` frames. Thin on purpose: what to answer is
//! decided by [`super::handshake`]; this only moves bytes and says why a connection failed.
//!
//! A bad token is refused before the WebSocket opens (HTTP 401, with the reason as the body);
//! a bad `hello` (an old protocol version, another node's name) gets a `refused` frame and a
//! close. Tokens are kept as SHA-256 digests, so a lookup neither stores nor compares secrets.
//!
//! Two kinds of token open the link: a node's static token ([`NodeTokens`], systemd nodes), or
//! a token a [`Reviewer`] checks asynchronously (the operator's: a projected ServiceAccount
//! token, through the TokenReview API). tungstenite's upgrade callback is synchronous, so the
//! upgrade request's head is read here first (bounded in size and time), the token decided,
//! and the stream handed to tungstenite with those bytes replayed ([`Replayed`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::Frame as WsFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::{self, Message as Frame};

use super::handshake::{Accepted, HandshakeError, Welcomed, accept_hello, read_welcome};
use super::messages::{FrameError, MAX_FRAME_BYTES, Message, decode, encode};

pub type ServerStream = WebSocketStream<Replayed<tokio_rustls::server::TlsStream<TcpStream>>>;
pub type ClientStream = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// How long the peer has for the TLS and WebSocket handshakes and its first frame.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most an upgrade request's head (request line and headers) may take, in bytes: a
/// projected ServiceAccount token is about a kilobyte.
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenId([u8; 32]);

impl TokenId {
    pub fn of(token: &str) -> TokenId {
        TokenId(digest(token.trim()))
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A connection's read buffer. tungstenite's default (128 KiB, for high read loads) held per
/// connection was most of an operator's memory at fleet size; the link carries a few small messages
/// a minute (a heartbeat, a report, a job's desired state: under 2 KiB each), and a larger frame
/// grows the buffer as it needs. 8 KiB held 8 MiB at 1,000 nodes (heaptrack).
const READ_BUFFER_BYTES: usize = 2 * 1024;

/// The largest frame sent: a longer message goes in fragments of this. tungstenite keeps each
/// connection's write buffer (and the peer its read buffer) at the largest frame it ever
/// handled, for the connection's life: an artifact's megabyte chunk sent whole would stay held
/// per node that fetched one (gigabytes at fleet size).
pub const FRAGMENT_BYTES: usize = 16 * 1024;

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
        .read_buffer_size(READ_BUFFER_BYTES)
        // Written once a fragment is buffered, so the buffer stays about a fragment's size.
        .write_buffer_size(FRAGMENT_BYTES)
}

/// Checks a bearer token that is not one of the static node tokens (e.g. through the
/// Kubernetes TokenReview API): the node it proves, or why it is refused (said to the peer in
/// the 401's body). `peer` is for logs; an implementation never logs the token.
pub trait Reviewer: Send + Sync {
    fn review<'a>(&'a self, token: &'a str, peer: &'a str) -> ReviewFuture<'a>;

    /// Resolves, with why, once what admitted the token no longer holds (the agent's pod it was
    /// bound to is gone): the session it opened ends. By default, never.
    fn revoked(&self, _token: &TokenId) -> RevokedFuture {
        Box::pin(std::future::pending())
    }
}

/// What [`Reviewer::review`] returns: the node, or the refusal's reason.
pub type ReviewFuture<'a> = Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>>;

/// What [`Reviewer::revoked`] returns: why the session ends.
pub type RevokedFuture = Pin<Box<dyn Future<Output = String> + Send + 'static>>;

/// How a connection proved its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A static node token: checked again when the tokens change ([`NodeTokens::admits`]).
    Static(TokenId),
    /// A token a [`Reviewer`] admitted: followed by [`Reviewer::revoked`].
    Reviewed(TokenId),
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
    let (node, _, mut ws) = upgrade(tcp, tls, tokens, None).await?;
    let accepted = greet(&node, &mut ws, last_applied_report(&node), heartbeat_secs).await?;
    Ok((node, accepted, ws))
}

/// TLS and the WebSocket upgrade, the bearer token checked in it: a static node token first,
/// then `reviewer` (if any). Returns the token's node, how it was proved and the stream.
pub async fn upgrade(
    tcp: TcpStream,
    tls: &TlsAcceptor,
    tokens: &NodeTokens,
    reviewer: Option<&dyn Reviewer>,
) -> Result<(String, Credential, ServerStream), LinkError> {
    let peer = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut stream = tls.accept(tcp).await.map_err(|err| LinkError::Io(format!("TLS from {peer}"), err))?;
        let head = read_request_head(&mut stream, &peer).await?;
        let token = bearer_token(&head).unwrap_or_default();
        let verdict = match (tokens.node_for(&token), reviewer) {
            (Some(node), _) => Ok((node.to_owned(), Credential::Static(TokenId::of(&token)))),
            (None, _) if token.is_empty() => Err("the link needs a node's bearer token: none was sent".to_owned()),
            (None, Some(reviewer)) => {
                reviewer.review(&token, &peer).await.map(|node| (node, Credential::Reviewed(TokenId::of(&token))))
            }
            (None, None) => Err("the link needs a node's bearer token: this one is missing or unknown".to_owned()),
        };
        if let Err(reason) = &verdict {
            // Summed up by the server's refusals (a line a minute), not a line each.
            tracing::debug!(peer, "link refused: {reason}");
        }
        // The shape tungstenite's `Callback` asks for.
        #[allow(clippy::result_large_err)]
        let answer = |_: &Request, response: Response| -> Result<Response, ErrorResponse> {
            match &verdict {
                Ok(_) => Ok(response),
                Err(reason) => {
                    let mut refusal = ErrorResponse::new(Some(reason.clone()));
                    *refusal.status_mut() = StatusCode::UNAUTHORIZED;
                    Err(refusal)
                }
            }
        };
        let replayed = Replayed::new(head, stream);
        let ws = match tokio_tungstenite::accept_hdr_async_with_config(replayed, answer, Some(ws_config())).await {
            Ok(ws) => ws,
            // Refused: tungstenite answered 401 and says so; the reason is ours.
            Err(_) if verdict.is_err() => {
                return Err(LinkError::Refused(verdict.err().unwrap_or_default()));
            }
            Err(err) => return Err(LinkError::WebSocket(format!("from {peer}: {err}"))),
        };
        match verdict {
            Ok((node, credential)) => Ok((node, credential, ws)),
            // tungstenite answered 401 and returned an error above; this is a safeguard.
            Err(reason) => Err(LinkError::Refused(reason)),
        }
    })
    .await
    .map_err(|_| LinkError::Timeout(HANDSHAKE_TIMEOUT))?
}

/// Reads the upgrade request's head (up to its blank line, at most [`MAX_REQUEST_HEAD`] bytes):
/// the bytes read, which may run past the head.
async fn read_request_head<S: AsyncRead + Unpin>(stream: &mut S, peer: &str) -> Result<Vec<u8>, LinkError> {
    let mut head = Vec::with_capacity(2048);
    let mut chunk = [0u8; 2048];
    loop {
        let read = stream.read(&mut chunk).await.map_err(|err| LinkError::Io(format!("request from {peer}"), err))?;
        if read == 0 {
            return Err(LinkError::Closed);
        }
        head.extend_from_slice(&chunk[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        match httparse::Request::new(&mut headers).parse(&head) {
            Ok(httparse::Status::Complete(_)) => return Ok(head),
            Ok(httparse::Status::Partial) if head.len() < MAX_REQUEST_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err(LinkError::WebSocket(format!(
                    "from {peer}: the upgrade request's head is over {MAX_REQUEST_HEAD} bytes"
                )));
            }
            Err(err) => return Err(LinkError::WebSocket(format!("from {peer}: not an HTTP upgrade request: {err}"))),
        }
    }
}

/// The `Authorization: Bearer` token of a complete request head.
fn bearer_token(head: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    request.parse(head).ok()?;
    let value = request.headers.iter().find(|h| h.name.eq_ignore_ascii_case("authorization"))?.value;
    let value = std::str::from_utf8(value).ok()?;
    Some(value.strip_prefix("Bearer ")?.trim().to_owned())
}

/// A stream whose first bytes are some already read from it (the upgrade request's head).
pub struct Replayed<S> {
    head: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replayed<S> {
    pub fn new(head: Vec<u8>, inner: S) -> Replayed<S> {
        Replayed { head, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let take = (self.head.len() - self.at).min(buf.remaining());
            let from = self.at;
            buf.put_slice(&self.head[from..from + take]);
            self.at += take;
            if self.at == self.head.len() {
                self.head = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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
/// and reads the answer. The certificate must name `server_name`, or else the URL's host.
pub async fn connect(
    url: &str,
    server_name: Option<&str>,
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
    let server_name = ServerName::try_from(server_name.unwrap_or(&host).to_owned()).map_err(|err| LinkError::Tls {
        what: format!("{url}: the certificate's name {}", server_name.unwrap_or(&host)),
        message: err.to_string(),
    })?;
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
    send_text(ws, encode(message)?).await
}

/// Sends a message already encoded (by [`encode`]): in fragments of [`FRAGMENT_BYTES`] when it
/// is larger (one message to the peer all the same).
pub async fn send_text<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    text: String,
) -> Result<(), LinkError> {
    let failed = |err: tungstenite::Error| LinkError::WebSocket(err.to_string());
    if text.len() <= FRAGMENT_BYTES {
        return ws.send(Frame::text(text)).await.map_err(failed);
    }
    // Slices of one buffer: the fragments copy nothing.
    let text = tungstenite::Bytes::from(text);
    let mut opcode = OpCode::Data(Data::Text);
    for start in (0..text.len()).step_by(FRAGMENT_BYTES) {
        let end = (start + FRAGMENT_BYTES).min(text.len());
        let fragment = WsFrame::message(text.slice(start..end), opcode, end == text.len());
        // `feed` waits while the socket is full: the write buffer never holds more than a fragment
        // beyond its threshold.
        ws.feed(Frame::Frame(fragment)).await.map_err(failed)?;
        opcode = OpCode::Data(Data::Continue);
    }
    ws.flush().await.map_err(failed)
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

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[test]
    fn the_bearer_token_is_read_from_the_request_head() {
        let head = |auth: &str| format!("GET /v1/link HTTP/1.1\r\nHost: x\r\n{auth}Upgrade: websocket\r\n\r\n");
        let cases = [
            ("Authorization: Bearer abc.def\r\n", Some("abc.def")),
            ("authorization: Bearer  spaced \r\n", Some("spaced")),
            ("Authorization: Basic abc\r\n", None),
            ("", None),
        ];
        for (auth, want) in cases {
            assert_eq!(bearer_token(head(auth).as_bytes()).as_deref(), want, "{auth:?}");
        }
    }

    #[tokio::test]
    async fn the_head_is_bounded_and_replayed_before_the_rest() {
        let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nafter";
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        tokio::io::AsyncWriteExt::write_all(&mut client, request).await.expect("write");
        drop(client);
        let head = read_request_head(&mut server, "peer").await.expect("a head");
        let mut replayed = Replayed::new(head, server);
        let mut all = Vec::new();
        replayed.read_to_end(&mut all).await.expect("read");
        assert_eq!(all, request, "every byte, in order");

        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_REQUEST_HEAD));
        tokio::io::AsyncWriteExt::write_all(&mut client, long.as_bytes()).await.expect("write");
        let err = read_request_head(&mut server, "peer").await.expect_err("too long");
        assert!(err.to_string().contains("over 16384 bytes"), "{err}");
        let (mut client, mut server) = tokio::io::duplex(1024);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"\x16\x03\x01 not http\r\n\r\n").await.expect("write");
        let err = read_request_head(&mut server, "peer").await.expect_err("not HTTP");
        assert!(err.to_string().contains("not an HTTP upgrade request"), "{err}");
    }

    /// A message larger than a fragment reaches the peer whole, though no frame on the wire is
    /// larger than a fragment (the peer here refuses any larger frame); a small one in one frame.
    #[tokio::test]
    async fn a_long_message_goes_in_fragments_and_arrives_whole() {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut server = WebSocketStream::from_raw_socket(server, Role::Server, Some(ws_config())).await;
        // A frame's header is at most 14 bytes.
        let strict = ws_config().max_frame_size(Some(FRAGMENT_BYTES + 14));
        let mut client = WebSocketStream::from_raw_socket(client, Role::Client, Some(strict)).await;
        let data: String = (0..3 * FRAGMENT_BYTES + 100).map(|n| char::from(b'a' + (n % 26) as u8)).collect();
        let long = Message::ArtifactMissing { sha256: "0".repeat(64), reason: data };
        let short = Message::Ping { nonce: 7 };
        let sending = async {
            send(&mut server, &long).await.expect("the long one");
            send(&mut server, &short).await.expect("the short one");
        };
        let receiving = async {
            let first = recv(&mut client).await.expect("a message whole").expect("not closed");
            let second = recv(&mut client).await.expect("a message").expect("not closed");
            (first, second)
        };
        let ((), (first, second)) = tokio::join!(sending, receiving);
        assert_eq!(first, long);
        assert_eq!(second, short);
    }
}
