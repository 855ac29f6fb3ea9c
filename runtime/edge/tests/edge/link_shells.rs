//! The link's shells end to end on 127.0.0.1: real TLS (a CA made here), real sockets through a
//! proxy that can cut or freeze the connection, the edge's real SQLite store as its outbox and
//! desired state, and a cloud side applying reports to its own SQLite file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::support::link::{Pki, TestCloud, pki};
use perennial_edge::report::{Report, enqueue};
use perennial_edge::sqlite::Store;
use perennial_link::Changes;
use perennial_link::cloud_server::{self, NodeDesired, ServerSettings};
use perennial_link::edge_client::{self, ClientSettings, LinkEvents};
use perennial_link::socket::{NodeTokens, client_tls, server_tls};

const JOB: &str = "ml/thermal";

/// A TCP proxy between the edge and the cloud that can cut every connection through it, or
/// freeze them (a half-open link: sockets open, nothing gets through).
struct Proxy {
    port: u16,
    target: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    frozen: watch::Sender<bool>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let port = listener.local_addr().expect("address").port();
        let target = Arc::new(Mutex::new(target));
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let frozen = watch::channel(false).0;
        let (to, held, freeze) = (target.clone(), connections.clone(), frozen.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let address = *to.lock().unwrap();
                let mut frozen = freeze.subscribe();
                let task = tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(address).await else { return };
                    let (mut a, mut b) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = async { let _ = frozen.wait_for(|frozen| *frozen).await; } => {
                            // Half-open: hold both sockets, move nothing, until cut.
                            std::future::pending::<()>().await;
                        }
                    }
                });
                held.lock().unwrap().push(task);
            }
        });
        Proxy { port, target, connections, frozen }
    }

    fn url(&self) -> String {
        format!("wss://localhost:{}/v1/link", self.port)
    }

    /// Drops every connection through the proxy.
    fn cut(&self) {
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

/// A running cloud server.
struct Cloud {
    address: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// The node tokens it admits (as the operator's Secret would change them).
    tokens: watch::Sender<Arc<NodeTokens>>,
}

async fn start_cloud(pki: &Pki, side: Arc<TestCloud>, heartbeat_secs: u32) -> Cloud {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (tokens, admitted) =
        watch::channel(Arc::new(NodeTokens::new([("edge-1", "token-one"), ("edge-2", "token-two")])));
    let settings = ServerSettings {
        tls: server_tls(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes()).expect("server TLS"),
        tokens: admitted,
        reviewer: None,
        refusals: Default::default(),
        heartbeat_secs,
    };
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(cloud_server::serve(listener, settings, side, stopped));
    Cloud { address, stop, task, tokens }
}

/// What the edge's link said, for the assertions.
#[derive(Default)]
struct Seen {
    up: AtomicBool,
    downs: AtomicU64,
    rejected: Mutex<Vec<(u64, String)>>,
    desired: Mutex<Vec<Changes>>,
    went_down: Mutex<Option<Instant>>,
}

impl LinkEvents for Seen {
    fn desired_applied(&self, changes: &Changes) {
        self.desired.lock().unwrap().push(changes.clone());
    }
    fn connected(&self, up: bool) {
        if !up && self.up.swap(false, Ordering::SeqCst) {
            self.downs.fetch_add(1, Ordering::SeqCst);
            *self.went_down.lock().unwrap() = Some(Instant::now());
        }
        if up {
            self.up.store(true, Ordering::SeqCst);
        }
    }
    fn rejected(&self, seq: u64, reason: &str) {
        self.rejected.lock().unwrap().push((seq, reason.to_owned()));
    }
}

struct Edge {
    store: Arc<Mutex<Store>>,
    outbox: Arc<Notify>,
    seen: Arc<Seen>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start_edge(pki: &Pki, url: String, store: Arc<Mutex<Store>>) -> Edge {
    let settings = ClientSettings {
        url,
        server_name: None,
        token: "token-one".into(),
        tls: client_tls(pki.ca_pem.as_bytes()).expect("client TLS"),
        node: "edge-1".into(),
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        policy_platform: None,
        downloads: None,
    };
    let outbox = Arc::new(Notify::new());
    let seen = Arc::new(Seen::default());
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(edge_client::run(settings, store.clone(), outbox.clone(), seen.clone(), stopped));
    Edge { store, outbox, seen, stop, task }
}

fn report(job: &str, n: u64) -> Report {
    Report {
        job: job.into(),
        job_uid: "uid-1".into(),
        round: n as i64,
        phase: perennial_types::Stage::Train,
        status: perennial_types::Phase::Ready,
        input: None,
        output: None,
        reason: None,
        next_follows: false,
    }
}

fn queue(edge: &Edge, job: &str, n: u64) {
    let mut store = edge.store.lock().unwrap();
    let tx = store.write().expect("tx");
    enqueue(&tx, &report(job, n), n).expect("enqueue");
    tx.commit().expect("commit");
    drop(store);
    edge.outbox.notify_one();
}

fn outbox_len(edge: &Edge) -> i64 {
    edge.store.lock().unwrap().conn().query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0)).unwrap()
}

async fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn one_job() -> NodeDesired {
    let mut desired = NodeDesired::default();
    desired.jobs.insert(JOB.into(), node_job(JOB, "uid-1").into());
    desired
}

fn node_job(key: &str, uid: &str) -> Value {
    let (namespace, name) = key.split_once('/').expect("key");
    json!({
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "config": {
            "name": key, "uid": uid,
            "spec": {"dataset": "ml/readings", "datasetUrl": "/data/index.txt", "datasetFormat": "txt", "outputDir": "/out", "trainProb": 0.8},
            "trigger": {"plugin": "builtin:threshold-trigger"}
        },
        "notice": {"stage": "Train", "round": 0}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_reports_through_twenty_cuts_and_a_cloud_restart_arrive_once_in_order() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
    let mut cloud = start_cloud(&pki, side.clone(), 2).await;
    let proxy = Proxy::start(cloud.address).await;
    let store = Arc::new(Mutex::new(Store::open(&dir.path().join("edge.db")).expect("edge db")));
    let edge = start_edge(&pki, proxy.url(), store);
    const REPORTS: u64 = 10_000;
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Reports keep coming while the link is cut: 20 cuts, one of them a cloud restart.
    let mut queued = 0;
    for cut in 0..20 {
        for _ in 0..REPORTS / 20 {
            queued += 1;
            queue(&edge, JOB, queued);
        }
        // Cut a live link, some way into the batch.
        until("the link up", Duration::from_secs(30), || edge.seen.up.load(Ordering::SeqCst)).await;
        tokio::time::sleep(Duration::from_millis(next() % 40)).await;
        let downs = edge.seen.downs.load(Ordering::SeqCst);
        if cut == 10 {
            cloud.stop.send_replace(true);
            cloud.task.abort();
            let _ = (&mut cloud.task).await;
            cloud = start_cloud(&pki, side.clone(), 2).await;
            *proxy.target.lock().unwrap() = cloud.address;
        }
        proxy.cut();
        // Each cut is noticed before the next: "up" is stale until the edge reads the cut.
        until("the edge to notice the cut", Duration::from_secs(30), || edge.seen.downs.load(Ordering::SeqCst) > downs)
            .await;
    }
    until("every report applied", Duration::from_secs(120), || {
        side.applied().last().is_some_and(|(_, body)| body["round"] == json!(REPORTS))
    })
    .await;
    let applied = side.applied();
    let rounds: Vec<u64> = applied.iter().map(|(_, body)| body["round"].as_u64().expect("round")).collect();
    assert_eq!(rounds, (1..=REPORTS).collect::<Vec<_>>(), "each report applied once, in order");
    assert!(applied.windows(2).all(|w| w[0].0 < w[1].0), "seqs increase");
    until("the outbox emptied by acks", Duration::from_secs(20), || outbox_len(&edge) == 0).await;
    assert!(edge.seen.downs.load(Ordering::SeqCst) >= 20, "the link went down at each of the 20 cuts");
    edge.stop.send_replace(true);
    let _ = edge.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_link_is_detected_within_two_heartbeats_and_reopened() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
    let cloud = start_cloud(&pki, side.clone(), 2).await;
    let proxy = Proxy::start(cloud.address).await;
    let store = Arc::new(Mutex::new(Store::open(&dir.path().join("edge.db")).expect("edge db")));
    let edge = start_edge(&pki, proxy.url(), store);
    until("the link up", Duration::from_secs(10), || edge.seen.up.load(Ordering::SeqCst)).await;
    queue(&edge, JOB, 1);
    until("report 1 applied", Duration::from_secs(10), || side.applied().len() == 1).await;
    // Nothing gets through any more, yet neither socket is closed.
    let frozen_at = Instant::now();
    proxy.freeze(true);
    until("the edge to notice", Duration::from_secs(10), || !edge.seen.up.load(Ordering::SeqCst)).await;
    let noticed = edge.seen.went_down.lock().unwrap().expect("went down") - frozen_at;
    // Two 2 s heartbeats, and a timer's slack on a loaded machine.
    assert!(noticed <= Duration::from_millis(4_500), "dead link noticed after {noticed:?}, over two 2 s heartbeats");
    // New connections get through again; a report queued meanwhile arrives.
    proxy.freeze(false);
    proxy.cut();
    queue(&edge, JOB, 2);
    until("report 2 applied after the reconnect", Duration::from_secs(10), || side.applied().len() == 2).await;
    edge.stop.send_replace(true);
    let _ = edge.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_on_another_nodes_job_is_refused_with_the_reason_and_the_rest_go_on() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
    let cloud = start_cloud(&pki, side.clone(), 2).await;
    let store = Arc::new(Mutex::new(Store::open(&dir.path().join("edge.db")).expect("edge db")));
    let edge = start_edge(&pki, format!("wss://localhost:{}/v1/link", cloud.address.port()), store);
    queue(&edge, JOB, 1);
    queue(&edge, "ml/elsewhere", 2);
    queue(&edge, JOB, 3);
    until("reports 1 and 3 applied", Duration::from_secs(10), || side.applied().len() == 2).await;
    until("the outbox emptied", Duration::from_secs(10), || outbox_len(&edge) == 0).await;
    let rounds: Vec<Value> = side.applied().into_iter().map(|(_, body)| body["round"].clone()).collect();
    assert_eq!(rounds, [json!(1), json!(3)]);
    let rejected = edge.seen.rejected.lock().unwrap().clone();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].1, "job ml/elsewhere does not live on this node: a node reports only on its own jobs");
    edge.stop.send_replace(true);
    let _ = edge.task.await;
}

/// A report that waits its turn behind one being applied is offered to the cloud early (where a
/// stage result waits for the next stage's Ready), if it is in the node's scope; all are still
/// applied once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_waiting_behind_another_is_offered_early_and_applied_in_its_turn() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
    *side.apply_delay.lock().unwrap() = Duration::from_millis(300);
    let cloud = start_cloud(&pki, side.clone(), 2).await;
    let store = Arc::new(Mutex::new(Store::open(&dir.path().join("edge.db")).expect("edge db")));
    {
        let mut store = store.lock().unwrap();
        let tx = store.write().expect("tx");
        for (job, n) in [(JOB, 1), (JOB, 2), ("ml/elsewhere", 3)] {
            enqueue(&tx, &report(job, n), n).expect("enqueue");
        }
        tx.commit().expect("commit");
    }
    let edge = start_edge(&pki, format!("wss://localhost:{}/v1/link", cloud.address.port()), store);
    until("the outbox emptied", Duration::from_secs(10), || outbox_len(&edge) == 0).await;
    let rounds: Vec<Value> = side.applied().into_iter().map(|(_, body)| body["round"].clone()).collect();
    assert_eq!(rounds, [json!(1), json!(2)], "in order, once");
    assert_eq!(*side.offered.lock().unwrap(), [2], "the first went at once; another node's job is never offered");
    edge.stop.send_replace(true);
    let _ = edge.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_session_and_opens_no_other() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
    let cloud = start_cloud(&pki, side.clone(), 2).await;
    let store = Arc::new(Mutex::new(Store::open(&dir.path().join("edge.db")).expect("edge db")));
    let edge = start_edge(&pki, format!("wss://localhost:{}/v1/link", cloud.address.port()), store);
    until("the link up", Duration::from_secs(10), || edge.seen.up.load(Ordering::SeqCst)).await;
    // edge-1's token leaves the Secret: its live session ends, and it cannot come back.
    cloud.tokens.send_replace(Arc::new(NodeTokens::new([("edge-2", "token-two")])));
    until("the session ended", Duration::from_secs(10), || !edge.seen.up.load(Ordering::SeqCst)).await;
    queue(&edge, JOB, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!edge.seen.up.load(Ordering::SeqCst) && side.applied().is_empty(), "refused while revoked");
    // Admitted again.
    cloud.tokens.send_replace(Arc::new(NodeTokens::new([("edge-1", "token-one")])));
    until("report 1 applied once admitted again", Duration::from_secs(10), || side.applied().len() == 1).await;
    edge.stop.send_replace(true);
    let _ = edge.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_desired_state_lands_in_the_edge_store_then_its_changes_follow() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
    let cloud = start_cloud(&pki, side.clone(), 2).await;
    let store = Arc::new(Mutex::new(Store::open(&dir.path().join("edge.db")).expect("edge db")));
    let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
    let edge = start_edge(&pki, url.clone(), store.clone());
    let jobs = |store: &Arc<Mutex<Store>>| -> BTreeMap<String, (String, String)> {
        let store = store.lock().unwrap();
        let mut statement = store.conn().prepare("SELECT name, uid, stage FROM jobs").unwrap();
        statement.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?)))).unwrap().collect::<Result<_, _>>().unwrap()
    };
    until("the job registered", Duration::from_secs(10), || jobs(&store).contains_key(JOB)).await;
    assert_eq!(jobs(&store)[JOB], ("uid-1".to_owned(), "Train".to_owned()));
    // A second job arrives, the first moves to Eval; then the first leaves the node.
    let mut next = one_job();
    next.jobs.insert("ml/second".into(), node_job("ml/second", "uid-2").into());
    let mut moved = node_job(JOB, "uid-1");
    // (Round 0: the edge's own; a notice of a round the edge never started holds the job.)
    moved["notice"] = json!({"stage": "Eval", "round": 0});
    next.jobs.insert(JOB.into(), moved.into());
    side.desired.send_replace(Arc::new(next.clone()));
    until("the change applied", Duration::from_secs(10), || {
        jobs(&store).get(JOB).is_some_and(|(_, stage)| stage == "Eval") && jobs(&store).contains_key("ml/second")
    })
    .await;
    next.jobs.remove(JOB);
    side.desired.send_replace(Arc::new(next));
    until("the job forgotten", Duration::from_secs(10), || !jobs(&store).contains_key(JOB)).await;
    // The link's events hear of a change after the store has committed it: on a slow machine
    // (qemu), a poll of the store may see it first.
    until("the change heard", Duration::from_secs(10), || {
        edge.seen.desired.lock().unwrap().last().is_some_and(|c| !c.removed_jobs.is_empty())
    })
    .await;
    let changes = edge.seen.desired.lock().unwrap().clone();
    assert!(changes.windows(2).all(|w| w[0].seq < w[1].seq), "seqs increase: {changes:?}");
    assert_eq!(changes.last().map(|c| c.removed_jobs.clone()), Some(vec![JOB.to_owned()]));
    // A restarted edge says what it applied; the cloud numbers its next full state above it.
    edge.stop.send_replace(true);
    let _ = edge.task.await;
    let last = changes.last().expect("changes").seq;
    let edge = start_edge(&pki, url, store.clone());
    until("a full state again", Duration::from_secs(10), || !edge.seen.desired.lock().unwrap().is_empty()).await;
    assert!(edge.seen.desired.lock().unwrap()[0].seq > last, "numbered above what the edge applied");
    assert_eq!(jobs(&store).keys().cloned().collect::<Vec<_>>(), ["ml/second"]);
    edge.stop.send_replace(true);
    let _ = edge.task.await;
}

/// Artifacts (policies the operator compiled for the node's platform) fetched over the real
/// link: chunked, resumed after a cut, verified by digest.
mod artifacts {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use perennial_edge::sqlite::Store;
    use perennial_link::cloud_server::ARTIFACT_SENDS_AT_ONCE;
    use perennial_link::edge_client::{self, ClientSettings};
    use perennial_link::handshake::hello;
    use perennial_link::socket::NodeTokens;
    use perennial_link::socket::{self, client_tls};
    use perennial_link::{ARTIFACT_CHUNK_BYTES, DownloadError, Downloads, Message, PolicyPlatform, sha256_hex};
    use tokio::sync::{Notify, watch};

    use super::{Edge, JOB, Proxy, Seen, one_job, queue, start_cloud, until};
    use crate::support::link::{Pki, TestCloud, pki};

    const MIB: usize = 1 << 20;

    fn platform() -> PolicyPlatform {
        PolicyPlatform {
            platform: "aarch64-unknown-linux-gnu".into(),
            fingerprint: "wasmtime-48.0.8-test".into(),
            compiles: false,
        }
    }

    /// `len` bytes that are not all alike, and their name.
    fn artifact(len: usize, seed: u8) -> (String, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| ((i * 7 + i / 4096) as u8).wrapping_add(seed)).collect();
        (sha256_hex(&bytes), bytes)
    }

    /// An edge whose hello says `policy_platform`, fetching into `downloads`.
    fn start_fetching_edge(
        pki: &Pki,
        url: String,
        dir: &std::path::Path,
        policy_platform: Option<PolicyPlatform>,
    ) -> (Edge, Arc<Downloads>) {
        start_fetching_node(pki, url, dir, policy_platform, ("edge-1", "token-one"))
    }

    /// [`start_fetching_edge`] as `node`, with its token.
    fn start_fetching_node(
        pki: &Pki,
        url: String,
        dir: &std::path::Path,
        policy_platform: Option<PolicyPlatform>,
        (node, token): (&str, &str),
    ) -> (Edge, Arc<Downloads>) {
        let downloads = Downloads::new(dir.join("artifacts")).expect("downloads");
        let store = Arc::new(Mutex::new(Store::open(&dir.join("edge.db")).expect("edge db")));
        let settings = ClientSettings {
            url,
            server_name: None,
            token: token.into(),
            tls: client_tls(pki.ca_pem.as_bytes()).expect("client TLS"),
            node: node.into(),
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            policy_platform,
            downloads: Some(downloads.clone()),
        };
        let outbox = Arc::new(Notify::new());
        let seen = Arc::new(Seen::default());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(edge_client::run(settings, store.clone(), outbox.clone(), seen.clone(), stopped));
        (Edge { store, outbox, seen, stop, task }, downloads)
    }

    fn fetch(
        downloads: &Arc<Downloads>,
        sha256: &str,
        size: usize,
        wait: Duration,
    ) -> tokio::task::JoinHandle<Result<Vec<u8>, DownloadError>> {
        let (downloads, sha256) = (downloads.clone(), sha256.to_owned());
        tokio::spawn(async move { downloads.get(&sha256, size as u64, wait).await })
    }

    fn files(downloads: &Downloads) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(downloads.dir())
            .expect("dir")
            .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn gets(side: &TestCloud) -> Vec<(String, u64, usize, usize)> {
        side.artifact_gets.lock().unwrap().clone()
    }

    async fn stop(edge: Edge) {
        edge.stop.send_replace(true);
        let _ = edge.task.await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_5_mib_artifact_arrives_intact_in_chunks_while_reports_flow() {
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        let (sha, bytes) = artifact(5 * MIB, 1);
        side.artifacts.lock().unwrap().insert(sha.clone(), bytes.clone());
        // A slow store: each chunk takes a while, and the link goes on meanwhile.
        *side.artifact_delay.lock().unwrap() = Duration::from_millis(250);
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
        let (edge, downloads) = start_fetching_edge(&pki, url, dir.path(), Some(platform()));
        let fetched = fetch(&downloads, &sha, 6 * MIB, Duration::from_secs(20));
        until("the first chunk served", Duration::from_secs(10), || !gets(&side).is_empty()).await;
        queue(&edge, JOB, 1);
        until("report 1 applied", Duration::from_secs(10), || side.applied().len() == 1).await;
        let served_by_then = gets(&side).len();
        let got = fetched.await.expect("join").expect("the artifact");
        assert!(served_by_then < 5, "the report was applied while the artifact came ({served_by_then} chunks served)");
        assert!(got == bytes, "the artifact arrived intact");
        let offsets: Vec<u64> = gets(&side).iter().map(|get| get.1).collect();
        assert_eq!(
            offsets,
            (0..5).map(|n| (n * ARTIFACT_CHUNK_BYTES) as u64).collect::<Vec<_>>(),
            "five chunks, in order"
        );
        assert_eq!(files(&downloads), [format!("{sha}.bin")]);
        assert!(std::fs::read(downloads.dir().join(format!("{sha}.bin"))).expect("read") == bytes);
        assert_eq!(*side.platforms.lock().unwrap(), [("edge-1".to_owned(), Some(platform()))]);
        stop(edge).await;
    }

    /// A fleet fetching a new policy at once: the cloud reads (and holds, until sent) at most
    /// `ARTIFACT_SENDS_AT_ONCE` chunks, whatever the number of nodes; each node gets it whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_fetching_at_once_costs_the_cloud_a_bounded_number_of_chunks() {
        const NODES: usize = 20;
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        // One small chunk each, read slowly: the reads of all nodes overlap (under emulation too).
        let (sha, bytes) = artifact(64 * 1024, 5);
        side.artifacts.lock().unwrap().insert(sha.clone(), bytes.clone());
        *side.artifact_delay.lock().unwrap() = Duration::from_secs(1);
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let nodes: Vec<(String, String)> = (0..NODES).map(|n| (format!("node-{n}"), format!("token-{n}"))).collect();
        let tokens = NodeTokens::new(nodes.iter().map(|(node, token)| (node.as_str(), token.as_str())));
        cloud.tokens.send_replace(Arc::new(tokens));
        let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
        let mut edges = Vec::new();
        for (node, token) in &nodes {
            let folder = dir.path().join(node);
            std::fs::create_dir_all(&folder).expect("a node's folder");
            edges.push(start_fetching_node(&pki, url.clone(), &folder, Some(platform()), (node, token)));
        }
        // Every node linked, then all ask at once.
        let connected = || side.platforms.lock().unwrap().len() >= NODES;
        until("every node linked", Duration::from_secs(120), connected).await;
        let fetches: Vec<_> =
            edges.iter().map(|(_, downloads)| fetch(downloads, &sha, bytes.len(), Duration::from_secs(120))).collect();
        for fetched in fetches {
            assert!(fetched.await.expect("join").expect("the artifact") == bytes, "every node gets it whole");
        }
        let most = side.most_read_at_once.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            (2..=ARTIFACT_SENDS_AT_ONCE).contains(&most),
            "{most} chunks read at once for {NODES} nodes (at most {ARTIFACT_SENDS_AT_ONCE})"
        );
        for (edge, _) in edges {
            stop(edge).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_download_cut_midway_resumes_from_the_offset_it_reached() {
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        let (sha, bytes) = artifact(5 * MIB, 2);
        side.artifacts.lock().unwrap().insert(sha.clone(), bytes.clone());
        *side.artifact_delay.lock().unwrap() = Duration::from_millis(100);
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let proxy = Proxy::start(cloud.address).await;
        let (edge, downloads) = start_fetching_edge(&pki, proxy.url(), dir.path(), Some(platform()));
        let fetched = fetch(&downloads, &sha, 5 * MIB, Duration::from_secs(20));
        let part = downloads.dir().join(format!("{sha}.part"));
        let length = || std::fs::metadata(&part).map_or(0, |meta| meta.len());
        until("two chunks written", Duration::from_secs(10), || length() >= 2 * MIB as u64).await;
        let (reached, connections) = (length(), side.platforms.lock().unwrap().len());
        proxy.cut();
        let got = fetched.await.expect("join").expect("the artifact, after the cut");
        assert!(got == bytes, "the artifact arrived intact");
        assert!(edge.seen.downs.load(Ordering::SeqCst) >= 1, "the link was cut");
        let gets = gets(&side);
        let after = gets.iter().find(|get| get.3 >= connections).expect("asked again after the cut");
        assert!(after.1 > 0 && after.1 >= reached, "resumed from {} (had {reached}), not from the start", after.1);
        let served: usize = gets.iter().map(|get| get.2).sum();
        assert!(served < 2 * bytes.len(), "{served} bytes served for {} bytes", bytes.len());
        assert_eq!(files(&downloads), [format!("{sha}.bin")]);
        stop(edge).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_with_another_digest_are_refused_and_the_next_get_fetches_again() {
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        let (sha, _) = artifact(MIB + MIB / 2, 3);
        let (other, wrong) = artifact(MIB + MIB / 2, 4);
        side.artifacts.lock().unwrap().insert(sha.clone(), wrong);
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
        let (edge, downloads) = start_fetching_edge(&pki, url, dir.path(), Some(platform()));
        let wait = Duration::from_secs(10);
        let err = downloads.get(&sha, 2 * MIB as u64, wait).await.expect_err("another digest");
        assert_eq!(err, DownloadError::Digest { expected: sha.clone(), actual: other.clone() });
        assert!(files(&downloads).is_empty(), "nothing kept: {:?}", files(&downloads));
        let err = downloads.get(&sha, 2 * MIB as u64, wait).await.expect_err("another digest again");
        assert!(err.to_string().contains(&format!("have SHA-256 {other} instead")), "{err}");
        let from_the_start = gets(&side).iter().filter(|get| get.1 == 0).count();
        assert_eq!(from_the_start, 2, "the second get fetched again from the start: {:?}", gets(&side));
        assert!(files(&downloads).is_empty(), "nothing kept: {:?}", files(&downloads));
        stop(edge).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_artifact_is_missing_with_the_clouds_reason() {
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
        let (edge, downloads) = start_fetching_edge(&pki, url, dir.path(), Some(platform()));
        let (sha, _) = artifact(100, 5);
        let err = downloads.get(&sha, 1000, Duration::from_secs(10)).await.expect_err("missing");
        let reason = format!("no artifact {sha} here");
        assert_eq!(err, DownloadError::Missing { sha256: sha.clone(), reason: reason.clone() });
        assert_eq!(err.to_string(), format!("artifact {sha}: the operator cannot send it: {reason}"));
        assert!(files(&downloads).is_empty());
        stop(edge).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_edge_that_names_no_platform_never_asks_for_an_artifact() {
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        let (sha, bytes) = artifact(1000, 6);
        side.artifacts.lock().unwrap().insert(sha.clone(), bytes);
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
        let (edge, downloads) = start_fetching_edge(&pki, url, dir.path(), None);
        until("the link up", Duration::from_secs(10), || edge.seen.up.load(Ordering::SeqCst)).await;
        let err = downloads.get(&sha, 1000, Duration::from_secs(1)).await.expect_err("never asked");
        assert_eq!(err.to_string(), format!("artifact {sha} not received in 1s: is the link to the operator up?"));
        assert!(gets(&side).is_empty(), "asked: {:?}", gets(&side));
        assert_eq!(*side.platforms.lock().unwrap(), [("edge-1".to_owned(), None)]);
        // The link itself works as ever.
        queue(&edge, JOB, 1);
        until("report 1 applied", Duration::from_secs(10), || side.applied().len() == 1).await;
        stop(edge).await;
    }

    /// The cloud's side of the frames, spoken by hand: an edge that named no platform, or asks by
    /// something that is no digest, is cut off; one that named its platform is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_cloud_answers_artifact_gets_only_from_an_edge_that_named_its_platform() {
        let pki = pki();
        let dir = tempfile::tempdir().expect("tempdir");
        let side = Arc::new(TestCloud::new(&dir.path().join("cloud.db"), one_job()));
        let (sha, bytes) = artifact(3000, 7);
        side.artifacts.lock().unwrap().insert(sha.clone(), bytes.clone());
        let cloud = start_cloud(&pki, side.clone(), 2).await;
        let url = format!("wss://localhost:{}/v1/link", cloud.address.port());
        let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
        // (its platform, the name asked for, answered)
        let cases = [
            (None, sha.clone(), false),
            (Some(platform()), "ABC".to_owned(), false),
            (Some(platform()), sha.clone(), true),
        ];
        for (said, asked, answered) in cases {
            let (_, mut ws) = socket::connect(&url, None, "token-one", tls.clone(), &hello("edge-1", 0, said))
                .await
                .expect("welcomed");
            assert!(matches!(socket::recv(&mut ws).await, Ok(Some(Message::Desired { .. }))));
            socket::send(&mut ws, &Message::ArtifactGet { sha256: asked.clone(), offset: 1000 }).await.expect("sent");
            let next = tokio::time::timeout(Duration::from_secs(5), socket::recv(&mut ws))
                .await
                .expect("an answer or a close");
            if answered {
                let Ok(Some(Message::ArtifactChunk { sha256, offset, total, data })) = next else { panic!("{next:?}") };
                assert_eq!((sha256, offset, total), (sha.clone(), 1000, 3000));
                use base64::Engine as _;
                assert!(base64::engine::general_purpose::STANDARD.decode(data).expect("base64") == bytes[1000..]);
            } else {
                assert!(matches!(next, Ok(None) | Err(_)), "{asked}: the connection ends, got {next:?}");
            }
        }
    }
}

/// The socket layer alone: the handshake's refusals as the edge sees them, and a first report
/// and its ack over an accepted link.
mod handshake {
    use std::time::Duration;

    use perennial_link::Message;
    use perennial_link::PROTOCOL_VERSION;
    use perennial_link::handshake::hello;
    use perennial_link::socket::{LinkError, NodeTokens, accept, client_tls, connect, recv, send, server_tls};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use crate::support::link::{Pki, pki};

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
        let (welcomed, mut ws) =
            connect(&url, None, "token-one", tls, &hello("edge-1", 0, None)).await.expect("welcomed");
        assert_eq!(welcomed.version, PROTOCOL_VERSION);
        assert_eq!(welcomed.last_applied_report, 41, "the cloud's watermark for this node");
        assert_eq!(welcomed.heartbeat, Duration::from_secs(15));
        send(&mut ws, &Message::Report { seq: 42, body: serde_json::json!({"job": "ml/thermal"}) })
            .await
            .expect("sent");
        assert_eq!(recv(&mut ws).await.expect("answer"), Some(Message::Ack { seq: 42 }));
        assert_eq!(served.await.expect("join").expect("served"), "edge-1");
    }

    #[tokio::test]
    async fn a_bad_token_is_refused_before_the_link_opens() {
        let pki = pki();
        let (url, served) = operator(&pki).await;
        let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
        let refused = connect(&url, None, "not-a-token", tls, &hello("edge-1", 0, None)).await.expect_err("refused");
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
        let refused = connect(&url, None, "token-two", tls, &hello("edge-1", 0, None)).await.expect_err("refused");
        let text = refused.to_string();
        assert!(text.contains("`edge-1`") && text.contains("`edge-2`"), "{text}");
        assert!(served.await.expect("join").is_err());
    }

    #[tokio::test]
    async fn an_old_protocol_version_is_refused_naming_both_versions() {
        let pki = pki();
        let (url, served) = operator(&pki).await;
        let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
        let old = Message::Hello { version: 0, node: "edge-1".into(), last_applied_desired: 0, policy_platform: None };
        let refused = connect(&url, None, "token-one", tls, &old).await.expect_err("refused");
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
        let failed = connect(&url, None, "token-one", tls, &hello("edge-1", 0, None)).await.expect_err("untrusted");
        assert!(failed.to_string().contains("TLS"), "{failed}");
    }

    #[tokio::test]
    async fn the_certificate_must_carry_the_server_name_given_in_place_of_the_urls_host() {
        let pki = pki();
        let tls = client_tls(pki.ca_pem.as_bytes()).expect("client TLS");
        // The name given is what is checked, though the URL's host is in the certificate.
        let (url, _served) = operator(&pki).await;
        let failed = connect(&url, Some("link.example.com"), "token-one", tls.clone(), &hello("edge-1", 0, None))
            .await
            .expect_err("the certificate does not name link.example.com");
        assert!(failed.to_string().contains("TLS"), "{failed}");
        // Dialled by address (as through a NodePort), checked against the name given.
        let (url, served) = operator(&pki).await;
        let by_address = url.replace("wss://localhost:", "wss://127.0.0.1:");
        let (_, mut ws) = connect(&by_address, Some("localhost"), "token-one", tls, &hello("edge-1", 0, None))
            .await
            .expect("welcomed");
        send(&mut ws, &Message::Report { seq: 42, body: serde_json::json!({"job": "ml/thermal"}) })
            .await
            .expect("report");
        assert_eq!(served.await.expect("join").expect("served"), "edge-1");
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
}
