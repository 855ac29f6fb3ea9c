//! The pull path against registries that misbehave: a fake one in a thread, answering HTTP/1.1
//! by hand. Replies far over their bound fail fast, naming the bound, without being held;
//! credentials never go over plain HTTP to another machine's token service, nor with a redirect
//! to another host; a component's digest after `@` and pins that disagree are said as such.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use perennial_oci::{Credentials, OciRef, Options, RegistryError, pull};
use sha2::{Digest as _, Sha256};

struct Request {
    method: String,
    path: String,
    /// Lower-cased header lines.
    headers: Vec<String>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}:");
        self.headers.iter().find_map(|h| h.strip_prefix(&prefix).map(str::trim))
    }
}

enum Reply {
    Full {
        status: &'static str,
        headers: String,
        body: Vec<u8>,
    },
    /// A body of `total` bytes (no length declared), written 64 KiB at a time, never held.
    Endless {
        status: &'static str,
        total: usize,
    },
}

fn full(status: &'static str, body: impl Into<Vec<u8>>) -> Reply {
    Reply::Full { status, headers: String::new(), body: body.into() }
}

/// A fake registry on 127.0.0.1; every request's line and headers are kept.
struct Fake {
    address: String,
    seen: Arc<Mutex<Vec<Request>>>,
}

fn serve(handler: impl Fn(&Request, &str) -> Reply + Send + Sync + 'static) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (handler, kept, me) = (Arc::new(handler), seen.clone(), address.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (handler, kept, me) = (handler.clone(), kept.clone(), me.clone());
            std::thread::spawn(move || answer(stream, &*handler, &kept, &me));
        }
    });
    Fake { address, seen }
}

fn answer(mut stream: TcpStream, handler: &dyn Fn(&Request, &str) -> Reply, seen: &Mutex<Vec<Request>>, me: &str) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let request = Request {
        method: first.next().unwrap_or_default().to_owned(),
        path: first.next().unwrap_or_default().to_owned(),
        headers: lines.filter(|l| !l.is_empty()).map(|l| l.to_ascii_lowercase()).collect(),
    };
    let reply = handler(&request, me);
    seen.lock().unwrap().push(request);
    let _ = match reply {
        Reply::Full { status, headers, body } => stream
            .write_all(
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n", body.len())
                    .as_bytes(),
            )
            .and_then(|()| stream.write_all(&body)),
        Reply::Endless { status, total } => endless(&mut stream, status, total),
    };
}

fn endless(stream: &mut TcpStream, status: &str, total: usize) -> std::io::Result<()> {
    stream.write_all(format!("HTTP/1.1 {status}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let chunk = vec![b'a'; 64 << 10];
    let mut sent = 0;
    while sent < total {
        stream.write_all(&chunk)?;
        sent += chunk.len();
    }
    Ok(())
}

fn oci(reference: &str) -> OciRef {
    OciRef::parse(reference).unwrap()
}

fn options(credentials: Option<(&str, &str)>) -> Options {
    let mut options = Options::anonymous(64 << 20, Duration::from_secs(60));
    options.credentials =
        credentials.map(|(user, password)| Credentials { username: user.into(), password: password.into() });
    options.credentials_from = "/nowhere/config.json".into();
    options
}

const HUNDRED_MIB: usize = 100 << 20;

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A Wasm artifact's manifest whose one layer is `component`.
fn manifest(component: &[u8]) -> Vec<u8> {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.wasm.config.v0+json", "digest": format!("sha256:{}", sha256(b"{}")), "size": 2},
        "layers": [{"mediaType": "application/wasm", "digest": format!("sha256:{}", sha256(component)), "size": component.len()}],
    })
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn a_manifest_over_its_bound_fails_fast_naming_the_bound() {
    let fake = serve(|_, _| Reply::Endless { status: "200 OK", total: HUNDRED_MIB });
    let started = Instant::now();
    let err = pull(&oci(&format!("{}/huge:v1", fake.address)), None, &options(None)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let RegistryError::Refused(text) = &err else { panic!("{err:?}") };
    assert!(text.contains("the registry's manifest is more than the 4194304 bytes"), "{text}");
}

#[tokio::test]
async fn an_error_reply_over_its_bound_is_cut_and_said() {
    let fake = serve(|_, _| Reply::Endless { status: "404 Not Found", total: HUNDRED_MIB });
    let started = Instant::now();
    let err = pull(&oci(&format!("{}/huge:v1", fake.address)), None, &options(None)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let text = err.to_string();
    assert!(text.contains("huge:v1 is not in the registry (HTTP 404)"), "{text}");
    assert!(text.contains("more than 65536 bytes"), "{text}");
}

#[tokio::test]
async fn a_token_reply_over_its_bound_is_refused() {
    let fake = serve(|request, me| {
        if request.path.starts_with("/token") {
            Reply::Endless { status: "200 OK", total: HUNDRED_MIB }
        } else {
            Reply::Full {
                status: "401 Unauthorized",
                headers: format!("WWW-Authenticate: Bearer realm=\"http://{me}/token\",service=\"fake\"\r\n"),
                body: Vec::new(),
            }
        }
    });
    let started = Instant::now();
    let err = pull(&oci(&format!("{}/p:v1", fake.address)), None, &options(None)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(err.to_string().contains("token service's reply is more than the 1048576 bytes"), "{err}");
}

/// A registry whose token service (on `realm`, or its own `/token`) wants ann's password.
fn bearer_registry(component: Vec<u8>, realm: Option<&'static str>, blob_elsewhere: Option<String>) -> Fake {
    let manifest = manifest(&component);
    serve(move |request, me| {
        let realm = realm.map_or_else(|| format!("http://{me}/token"), str::to_owned);
        if request.path.starts_with("/token") {
            use base64::Engine as _;
            let login = base64::engine::general_purpose::STANDARD.encode("ann:pw");
            return if request.header("authorization") == Some(&format!("basic {}", login.to_ascii_lowercase())) {
                full("200 OK", r#"{"access_token": "tok-123"}"#)
            } else {
                full("401 Unauthorized", "")
            };
        }
        if request.header("authorization") != Some("bearer tok-123") {
            return Reply::Full {
                status: "401 Unauthorized",
                headers: format!(
                    "WWW-Authenticate: Bearer realm=\"{realm}\",service=\"fake\",scope=\"repository:p:pull\"\r\n"
                ),
                body: br#"{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}"#.to_vec(),
            };
        }
        let digest = format!("sha256:{}", sha256(&manifest));
        match request.path.as_str() {
            "/v2/p/manifests/v1" => full("200 OK", manifest.clone()),
            path if path == format!("/v2/p/manifests/{digest}") => full("200 OK", manifest.clone()),
            path if path.starts_with("/v2/p/blobs/") => match &blob_elsewhere {
                Some(to) => Reply::Full {
                    status: "307 Temporary Redirect",
                    headers: format!("Location: {to}\r\n"),
                    body: Vec::new(),
                },
                None => full("200 OK", component.clone()),
            },
            _ => full("404 Not Found", r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no"}]}"#),
        }
    })
}

#[tokio::test]
async fn a_bearer_token_for_the_credentials_and_the_pins() {
    let component = b"\0asm a component".to_vec();
    let fake = bearer_registry(component.clone(), None, None);
    let ann = options(Some(("ann", "pw")));
    let pulled = pull(&oci(&format!("{}/p:v1", fake.address)), Some(&sha256(&component)), &ann).await.unwrap();
    assert_eq!(pulled.bytes, component);
    assert_eq!(pulled.manifest_digest, format!("sha256:{}", sha256(&manifest(&component))));

    // A tag pinned to other content: it moved.
    let other = "0".repeat(64);
    let err = pull(&oci(&format!("{}/p:v1", fake.address)), Some(&other), &ann).await.unwrap_err();
    assert!(err.to_string().contains("(did the tag move?)"), "{err}");
    // By the manifest's digest with another sha256: the pins disagree; nothing moved.
    let pinned = oci(&format!("{}/p@{}", fake.address, pulled.manifest_digest));
    let err = pull(&pinned, Some(&other), &ann).await.unwrap_err();
    assert!(matches!(err, RegistryError::PinsDisagree { .. }), "{err:?}");
    assert!(err.to_string().contains("the two pins disagree") && !err.to_string().contains("move"), "{err}");

    // Without credentials, or with wrong ones: refused, naming the user, never the password.
    let err = pull(&oci(&format!("{}/p:v1", fake.address)), None, &options(None)).await.unwrap_err();
    assert!(err.to_string().contains("/nowhere/config.json has no credentials for"), "{err}");
    let err = pull(&oci(&format!("{}/p:v1", fake.address)), None, &options(Some(("ann", "wrong-pw")))).await;
    let err = err.unwrap_err().to_string();
    assert!(err.contains("refused the credentials of user \"ann\"") && !err.contains("wrong-pw"), "{err}");
}

#[tokio::test]
async fn credentials_never_go_over_plain_http_to_another_machine() {
    let fake = bearer_registry(b"x".to_vec(), Some("http://auth.example.invalid/token"), None);
    let err = pull(&oci(&format!("{}/p:v1", fake.address)), None, &options(Some(("ann", "pw")))).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("names the token service http://auth.example.invalid/token"), "{text}");
    assert!(text.contains("they are not sent") && !text.contains("pw"), "{text}");
    assert!(fake.seen.lock().unwrap().iter().all(|r| !r.path.starts_with("/token")));
}

#[tokio::test]
async fn a_redirect_to_another_host_carries_no_authorization() {
    let component = b"\0asm redirected".to_vec();
    let storage_component = component.clone();
    let storage = serve(move |_, _| full("200 OK", storage_component.clone()));
    // `localhost` is another host than `127.0.0.1` to the client, though the same machine.
    let port = storage.address.rsplit_once(':').unwrap().1;
    let fake = bearer_registry(component.clone(), None, Some(format!("http://localhost:{port}/blob")));
    let pulled = pull(&oci(&format!("{}/p:v1", fake.address)), None, &options(Some(("ann", "pw")))).await.unwrap();
    assert_eq!(pulled.bytes, component);
    let seen = storage.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].header("authorization").is_none(), "{:?}", seen[0].headers);
    assert_eq!(seen[0].method, "GET");
}

#[tokio::test]
async fn a_components_digest_after_the_at_is_said_to_be_one() {
    let blob = format!("sha256:{}", "ab".repeat(32));
    let digest = blob.clone();
    let fake = serve(move |request, _| {
        if request.path == format!("/v2/p/blobs/{digest}") && request.method == "HEAD" {
            full("200 OK", "")
        } else {
            full("500 Internal Server Error", "oops")
        }
    });
    let err = pull(&oci(&format!("{}/p@{blob}", fake.address)), None, &options(None)).await.unwrap_err();
    let RegistryError::Refused(text) = &err else { panic!("not refused: {err:?}") };
    assert!(text.contains("names a blob in the repository"), "{text}");
    // A registry failing on any manifest: it failed.
    let failing = serve(|_, _| full("500 Internal Server Error", "oops"));
    let err = pull(&oci(&format!("{}/p:v1", failing.address)), None, &options(None)).await.unwrap_err();
    assert!(matches!(&err, RegistryError::Unreachable(t) if t.contains("failed (HTTP 500)")), "{err:?}");
}

#[tokio::test]
async fn localhost_is_this_machine() {
    let component = b"\0asm local".to_vec();
    let manifest = manifest(&component);
    let fake = serve(move |request, _| match request.path.as_str() {
        "/v2/p/manifests/v1" => full("200 OK", manifest.clone()),
        _ => full("200 OK", component.clone()),
    });
    let port = fake.address.rsplit_once(':').unwrap().1;
    let pulled = pull(&oci(&format!("localhost:{port}/p:v1")), None, &options(None)).await.unwrap();
    assert_eq!(pulled.bytes, b"\0asm local");
}
