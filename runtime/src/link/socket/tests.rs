//! Real TLS and real sockets on 127.0.0.1, with a CA made here: the handshake's refusals as the
//! edge sees them, and a first report and its ack over an accepted link.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::*;
use crate::link::handshake::hello;
use crate::link::messages::PROTOCOL_VERSION;

pub(crate) struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA, and a certificate it signed for localhost and 127.0.0.1.
pub(crate) fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("CA");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("params");
    let cert = params.signed_by(&key, &ca).expect("certificate");
    Pki { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
}

/// An operator side that accepts one connection, answers one report with its ack, and hands
/// back what `accept` returned.
async fn operator(pki: &Pki) -> (String, tokio::task::JoinHandle<Result<String, LinkError>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("wss://localhost:{}/v1/link", listener.local_addr().expect("address").port());
    let tls = TlsAcceptor::from(server_tls(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes()).expect("server TLS"));
    let served = tokio::spawn(async move {
        let tokens = NodeTokens::new([("edge-1", "token-one"), ("edge-2", "token-two")]);
        let (tcp, _) = listener.accept().await.expect("accept");
        let (node, _, mut ws) = accept(tcp, &tls, &tokens, |_| 41, 15).await?;
        if let Some(Message::Report { seq, .. }) = recv(&mut ws).await? {
            send(&mut ws, &Message::Ack { seq }).await?;
        }
        Ok(node)
    });
    (url, served)
}

#[tokio::test]
async fn an_accepted_edge_is_welcomed_and_its_reports_acknowledged() {
    let pki = pki();
    let (url, served) = operator(&pki).await;
    let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
    let (welcomed, mut ws) = connect(&url, "token-one", tls, &hello("edge-1", 0)).await.expect("welcomed");
    assert_eq!(welcomed.version, PROTOCOL_VERSION);
    assert_eq!(welcomed.last_applied_report, 41, "the cloud's watermark for this node");
    assert_eq!(welcomed.heartbeat, Duration::from_secs(15));
    send(&mut ws, &Message::Report { seq: 42, body: serde_json::json!({"job": "ml/thermal"}) }).await.expect("sent");
    assert_eq!(recv(&mut ws).await.expect("answer"), Some(Message::Ack { seq: 42 }));
    assert_eq!(served.await.expect("join").expect("served"), "edge-1");
}

#[tokio::test]
async fn a_bad_token_is_refused_before_the_link_opens() {
    let pki = pki();
    let (url, served) = operator(&pki).await;
    let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
    let refused = connect(&url, "not-a-token", tls, &hello("edge-1", 0)).await.expect_err("refused");
    let text = refused.to_string();
    assert!(matches!(refused, LinkError::Refused(_)), "{text}");
    assert!(text.contains("bearer token") && text.contains("401"), "{text}");
    assert!(served.await.expect("join").is_err());
}

#[tokio::test]
async fn a_hello_for_another_node_is_refused_naming_both() {
    let pki = pki();
    let (url, served) = operator(&pki).await;
    let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
    // edge-2's token, edge-1's name: a node may only speak for itself.
    let refused = connect(&url, "token-two", tls, &hello("edge-1", 0)).await.expect_err("refused");
    let text = refused.to_string();
    assert!(text.contains("`edge-1`") && text.contains("`edge-2`"), "{text}");
    assert!(served.await.expect("join").is_err());
}

#[tokio::test]
async fn an_old_protocol_version_is_refused_naming_both_versions() {
    let pki = pki();
    let (url, served) = operator(&pki).await;
    let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
    let old = Message::Hello { version: 0, node: "edge-1".into(), last_applied_desired: 0 };
    let refused = connect(&url, "token-one", tls, &old).await.expect_err("refused");
    let text = refused.to_string();
    assert!(matches!(refused, LinkError::Refused(_)), "{text}");
    assert!(text.contains('0') && text.contains(&PROTOCOL_VERSION.to_string()), "{text}");
    assert!(served.await.expect("join").is_err());
}

#[tokio::test]
async fn an_operator_certificate_from_another_ca_is_not_trusted() {
    let pki = pki();
    let (url, _served) = operator(&pki).await;
    let stranger = self::pki();
    let tls = client_tls(stranger.ca_pem.as_bytes()).expect("client TLS");
    let failed = connect(&url, "token-one", tls, &hello("edge-1", 0)).await.expect_err("untrusted");
    assert!(failed.to_string().contains("TLS"), "{failed}");
}

#[test]
fn bad_pem_is_an_error_naming_the_file() {
    assert!(client_tls(b"not a certificate").unwrap_err().to_string().contains("CA file"));
    let pki = pki();
    let no_key = server_tls(pki.cert_pem.as_bytes(), b"").unwrap_err();
    assert!(no_key.to_string().contains("private key"), "{no_key}");
    let tokens = NodeTokens::new([("edge-1", "t"), ("edge-2", "")]);
    assert_eq!(tokens.node_for("t"), Some("edge-1"));
    assert_eq!(tokens.node_for(""), None, "an empty token opens nothing");
}
