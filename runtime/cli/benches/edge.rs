//! Edge benchmarks: `cargo bench -p perennial --bench edge`.
//!
//! - `ingest/{wasm,native}`: from an index of 1,000,000 new 60-byte lines to committed
//!   assignments in SQLite, with the built-in splitter as a Wasm component and with the same
//!   rule computed natively. One core: ingest runs on the calling thread.
//! - trigger latency (printed): from an append that meets the threshold to the Train Ready
//!   report committed, on the local filesystem, through the real job loop (change notification,
//!   ingest, trigger, round file, commit); p50 and p90 over 40 rounds.
//! - idle memory (printed): RSS of a `perennial edge` process running 100 idle jobs.
//! - linked memory (printed): RSS of a `perennial edge` process linked to a cloud served here
//!   (`cloud_server::serve` on 127.0.0.1, TLS from a CA made here), with no jobs and with 100
//!   idle jobs in its desired state.
//! - deploy memory (printed): the peak RSS above idle and the wall time of deploying a 2 GiB
//!   sparse model and a 1 GiB dense one, local to local, through the job's model copier; with
//!   `PERENNIAL_BENCH_DEPLOY_WHOLE=1` also of the whole-file read it replaced (needs ~4 GiB).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use perennial_edge::sqlite::Store;
use perennial_edge::{self as edge, IngestLimits, JobSpec, LocalFile, Split};
use perennial_policy::{PolicyHost, PolicyRef, SplitterKind, TracingEvents, builtin};

const LINES: usize = 1_000_000;
const JOB: &str = "default/bench";

fn main() {
    // `PERENNIAL_BENCH_ONLY=deploy|trigger|memory|ingest` runs one part.
    let only = std::env::var("PERENNIAL_BENCH_ONLY").unwrap_or_default();
    let runs = |part: &str| only.is_empty() || only == part;
    // First: the process's peak memory is still its own.
    if runs("deploy") {
        deploy_memory();
    }
    if runs("trigger") {
        trigger_latency();
    }
    if runs("memory") {
        idle_memory();
        linked_memory();
    }
    if !runs("ingest") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index.txt");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&index).unwrap());
    for i in 0..LINES {
        // 59 characters and a newline.
        writeln!(file, "images/train/{i:08}.jpg,label-{:<27}", i % 17).unwrap();
    }
    file.flush().unwrap();
    drop(file);

    let valid =
        PolicyRef::new("builtin:ratio-split").with_config(serde_json::json!({"trainProb": 0.8})).validate().unwrap();
    let policy = PolicyHost::new(None, None)
        .unwrap()
        .load_bytes::<SplitterKind>(
            &valid,
            builtin::component("ratio-split").unwrap(),
            Arc::new(TracingEvents { job: JOB.into() }),
        )
        .unwrap();

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(LINES as u64)).sample_size(10).measurement_time(Duration::from_secs(20));
    for (name, split) in [
        ("wasm", Split { policy: Some(&policy), train_prob: 0.8, shadow: None }),
        ("native", Split { policy: None, train_prob: 0.8, shadow: None }),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let db = dir.path().join(format!("{name}-{}.db", rand_suffix()));
                    let mut store = Store::open(&db).unwrap();
                    edge::register_job(&mut store, JOB, "uid", &JobSpec::default()).unwrap();
                    Mutex::new(store)
                },
                |store| {
                    let mut file = LocalFile { path: index.clone() };
                    let done = edge::ingest(&store, JOB, &mut file, false, &split, IngestLimits::default()).unwrap();
                    assert_eq!(done.samples, LINES as u64);
                    store
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
    c.final_summary();
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn trigger_latency() {
    use perennial_edge::agent::{self, JobConfig, LoopSettings};
    use perennial_edge::model_copy::model_copier;
    use perennial_edge::report;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    const ROUNDS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index.txt");
    std::fs::write(&index, "").unwrap();
    let output = dir.path().join("output");
    let job: JobConfig = serde_json::from_value(serde_json::json!({
        "name": JOB, "uid": "uid",
        "spec": {"datasetUrl": index, "datasetFormat": "txt", "outputDir": output, "trainProb": 0.8},
        "splitter": {"plugin": "builtin:ratio-split", "config": {"trainProb": 0.8}},
        "trigger": {"plugin": "builtin:threshold-trigger",
                    "config": {"checkPeriodSeconds": 60, "condition": {"operator": ">=", "threshold": 400}}}
    }))
    .unwrap();
    let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
    edge::register_job(&mut store, JOB, "uid", &job.spec).unwrap();
    let store = Arc::new(Mutex::new(store));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = PolicyHost::new(None, None).unwrap();
    let policies = rt.block_on(agent::load_policies(&host, &job)).unwrap();
    let op = {
        let _guard = rt.enter();
        opendal::blocking::Operator::new(edge::output::output_operator(output.to_str().unwrap(), None).unwrap())
            .unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    // The stat fallback is slow (10 s): the change notification must do the work.
    let settings = LoopSettings { poll: Duration::from_secs(10), ..LoopSettings::default() };
    let worker = {
        let (store, stop, job) = (store.clone(), stop.clone(), job.clone());
        let index = Box::new(edge::LocalFile { path: index.clone() });
        let output = output.display().to_string();
        let copy_model = model_copier(rt.handle().clone(), None, output.clone(), vec![output]);
        let mut runners = vec![agent::JobRunner { job, policies, index, output: op, copy_model, settings }];
        std::thread::spawn(move || agent::run_jobs(&store, &mut runners, &stop, agent::Wakes::new(), &|| {}, None))
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut file = std::fs::OpenOptions::new().append(true).open(&index).unwrap();
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        // 490 samples: 392 train (±1, Sedna's rule over the whole stream), short of the threshold;
        // then a burst of 15 (12 train) meets it.
        let lines: String = (0..490).map(|i| format!("images/{round:04}-{i:04}.jpg,label-{:<30}\n", i % 7)).collect();
        file.write_all(lines.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let reports = report::pending(&store.lock().unwrap(), 1000).unwrap().len();
        let started = Instant::now();
        let burst: String = (0..15).map(|i| format!("images/{round:04}-burst-{i:02}.jpg,{}\n", i % 2)).collect();
        file.write_all(burst.as_bytes()).unwrap();
        loop {
            if report::pending(&store.lock().unwrap(), 1000).unwrap().len() > reports {
                latencies.push(started.elapsed());
                break;
            }
            if started.elapsed() > Duration::from_secs(5) {
                let store = store.lock().unwrap();
                let why = perennial_edge::rounds::waiting_reasons(&store).unwrap();
                panic!("round {round}: no Train Ready within 5 s; the job waits: {why:?}");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // The control plane moves the job back to Train/Waiting for the next round.
        perennial_edge::rounds::set_stage(
            &mut store.lock().unwrap(),
            JOB,
            perennial_types::Stage::Train,
            perennial_types::Phase::Waiting,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    file.write_all(b"wake\n").unwrap();
    let _ = worker.join();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "trigger latency, append -> Train Ready committed: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms ({ROUNDS} rounds)",
        ms(latencies[ROUNDS / 2]),
        ms(latencies[ROUNDS * 9 / 10]),
        ms(latencies[ROUNDS - 1])
    );
}

/// The job config of idle job `i`: its own index file of two samples, under `dir`.
fn idle_job(dir: &std::path::Path, i: usize) -> serde_json::Value {
    let index = dir.join(format!("data-{i}/index.txt"));
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    std::fs::write(&index, "images/a.jpg\nimages/b.jpg\n").unwrap();
    serde_json::json!({
        "name": format!("default/job-{i}"), "uid": format!("uid-{i}"),
        "spec": {"datasetUrl": index, "datasetFormat": "txt",
                 "outputDir": dir.join(format!("out-{i}")), "trainProb": 0.8},
        "splitter": {"plugin": "builtin:ratio-split", "config": {"trainProb": 0.8}},
        "trigger": {"plugin": "builtin:threshold-trigger",
                    "config": {"condition": {"operator": ">", "threshold": 500}}},
        "selector": {"plugin": "builtin:metric-select", "config": {"metric": "accuracy"}}
    })
}

/// The `VmRSS` line of process `pid`, in kB (0 if it is gone).
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A `kB` line (`VmRSS`, `VmHWM`) of this process's status, in kB.
fn own_status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `deploy` and prints its peak RSS above the RSS before it (the peak is reset first
/// through `/proc/self/clear_refs`) and its wall time.
fn measure_deploy(what: &str, deploy: impl FnOnce() -> u64, deployed: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;

    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let idle = own_status_kb("VmRSS");
    let started = std::time::Instant::now();
    let bytes = deploy();
    let took = started.elapsed();
    let peak = own_status_kb("VmHWM");
    let blocks = std::fs::metadata(deployed).map(|m| m.blocks()).unwrap_or(0);
    println!(
        "deploy, {what}: peak RSS {:.1} MiB above idle ({:.1} MiB idle{}), {:.0} ms, {:.0} MiB/s of model, \
         {:.1} MiB allocated for {:.0} MiB",
        peak.saturating_sub(idle) as f64 / 1024.0,
        idle as f64 / 1024.0,
        if reset { "" } else { "; peak not reset: an upper bound" },
        took.as_secs_f64() * 1e3,
        bytes as f64 / (1 << 20) as f64 / took.as_secs_f64(),
        blocks as f64 * 512.0 / (1 << 20) as f64,
        bytes as f64 / (1 << 20) as f64,
    );
}

fn deploy_memory() {
    use perennial_edge::model_copy::model_copier;
    use std::os::unix::fs::FileExt;

    const SPARSE: u64 = 2 << 30;
    const DENSE: usize = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("output");
    std::fs::create_dir_all(output.join("eval/1")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let output_dir = output.display().to_string();
    let copy = model_copier(rt.handle().clone(), None, output_dir.clone(), vec![output_dir.clone()]);
    let deployed = output.join("deploy/index.pkl");

    // As eval reported it in issue #32: 2 GiB, mostly a hole, a few extents written.
    let sparse = output.join("eval/1/sparse.pkl");
    let file = std::fs::File::create(&sparse).unwrap();
    file.set_len(SPARSE).unwrap();
    for at in [0, 1 << 20, 1 << 30, SPARSE - (4 << 20)] {
        file.write_all_at(&[0x5a; 1 << 20], at).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    let url = sparse.display().to_string();
    measure_deploy("2 GiB sparse (4 MiB written)", || copy(&url, "deploy/index.pkl").unwrap(), &deployed);

    let dense = output.join("eval/1/dense.pkl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&dense).unwrap());
    let block: Vec<u8> = (0..1 << 20).map(|i: usize| (i % 251) as u8).collect();
    for _ in 0..DENSE >> 20 {
        file.write_all(&block).unwrap();
    }
    file.into_inner().unwrap().sync_all().unwrap();
    let url = dense.display().to_string();
    measure_deploy("1 GiB dense", || copy(&url, "deploy/index.pkl").unwrap(), &deployed);

    if std::env::var("PERENNIAL_BENCH_DEPLOY_WHOLE").is_ok_and(|v| v == "1") {
        // What deploy did before: the whole model read into memory, then written through OpenDAL.
        let op = {
            let _guard = rt.enter();
            opendal::blocking::Operator::new(edge::output::output_operator(&output_dir, None).unwrap()).unwrap()
        };
        let url = sparse.display().to_string();
        let whole = || {
            let limit = perennial_storage::ReadLimit { max_bytes: 4 << 30, ..perennial_storage::ReadLimit::DEFAULT };
            let bytes = rt.block_on(perennial_storage::read_limited(&url, None, limit)).unwrap();
            let size = bytes.len() as u64;
            op.write("deploy/index.pkl", bytes).unwrap();
            size
        };
        measure_deploy("2 GiB sparse, the whole-file read it replaced", whole, &deployed);
    }
}

fn idle_memory() {
    const JOBS: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let jobs: Vec<serde_json::Value> = (0..JOBS).map(|i| idle_job(dir.path(), i)).collect();
    let jobs_file = dir.path().join("jobs.json");
    std::fs::write(&jobs_file, serde_json::Value::Array(jobs).to_string()).unwrap();
    // The first start compiles the policies into the cache; the second is the steady state.
    for start in ["first start (compiling)", "restart (compile cache warm)"] {
        let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(["edge", "--bind-address", "127.0.0.1", "--bind-port", "0"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--jobs")
            .arg(&jobs_file)
            .env("RUST_LOG", "error")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(6));
        let status = std::fs::read_to_string(format!("/proc/{}/status", agent.id())).unwrap_or_default();
        let rss = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: ?").to_owned();
        let _ = agent.kill();
        let _ = agent.wait();
        println!(
            "idle memory, perennial edge with {JOBS} idle jobs, {start}: {}",
            rss.trim_start_matches("VmRSS:").trim()
        );
    }
}

/// The cloud's side of the link for the bench, in memory: each node's watermark, and one
/// desired state for every node.
struct BenchCloud {
    watermarks: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    desired: tokio::sync::watch::Sender<Arc<perennial_link::cloud_server::NodeDesired>>,
    /// Sessions started (each asks for its node's desired state once it is accepted).
    sessions: std::sync::atomic::AtomicUsize,
}

impl perennial_link::cloud_server::CloudSide for BenchCloud {
    async fn last_applied_report(&self, node: &str) -> Result<u64, String> {
        Ok(self.watermarks.lock().unwrap().get(node).copied().unwrap_or(0))
    }

    async fn apply(&self, node: &str, seq: u64, _body: serde_json::Value) -> perennial_link::cloud_server::Applied {
        let mut watermarks = self.watermarks.lock().unwrap();
        let watermark = watermarks.entry(node.to_owned()).or_default();
        *watermark = (*watermark).max(seq);
        perennial_link::cloud_server::Applied::Applied
    }

    fn desired(&self, _node: &str) -> tokio::sync::watch::Receiver<Arc<perennial_link::cloud_server::NodeDesired>> {
        self.sessions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.desired.subscribe()
    }
}

fn linked_memory() {
    use perennial_link::cloud_server::{self, NodeDesired, ServerSettings};
    use perennial_link::socket::{NodeTokens, server_tls};
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    use tokio::sync::watch;

    const JOBS: usize = 100;
    const NODE: &str = "edge-1";
    const TOKEN: &str = "bench-token";
    let dir = tempfile::tempdir().unwrap();

    // A CA, and the cloud's certificate for localhost signed by it.
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let side = Arc::new(BenchCloud {
        watermarks: Default::default(),
        desired: watch::channel(Arc::new(NodeDesired::default())).0,
        sessions: Default::default(),
    });
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let settings = ServerSettings {
        tls: server_tls(cert.pem().as_bytes(), key.serialize_pem().as_bytes()).unwrap(),
        tokens: watch::channel(Arc::new(NodeTokens::new([(NODE, TOKEN)]))).1,
        reviewer: None,
        refusals: Default::default(),
        heartbeat_secs: 15,
    };
    let (stop, stopped) = watch::channel(false);
    let server = rt.spawn(cloud_server::serve(listener, settings, side.clone(), stopped));

    let jobs_in = |state: &std::path::Path| -> i64 {
        let Ok(conn) =
            rusqlite::Connection::open_with_flags(state.join("edge.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        else {
            return 0;
        };
        let _ = conn.busy_timeout(Duration::from_secs(5));
        conn.query_row("SELECT COUNT(*) FROM jobs", [], |row| row.get(0)).unwrap_or(0)
    };
    // Starts the agent on `state`, waits until its session with the cloud started and `jobs`
    // jobs are registered in its state, then ~2 s more; prints its RSS and kills it.
    let measure = |state: &std::path::Path, jobs: i64, what: &str| {
        let sessions = side.sessions.load(Ordering::SeqCst);
        let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(["edge", "--bind-address", "127.0.0.1", "--bind-port", "0"])
            .args(["--cloud-url", &format!("wss://localhost:{port}/v1/link")])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--ca-file")
            .arg(&ca_file)
            .args(["--node-name", NODE])
            .arg("--state-dir")
            .arg(state)
            .env("RUST_LOG", "error")
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while side.sessions.load(Ordering::SeqCst) == sessions || jobs_in(state) < jobs {
            assert!(agent.try_wait().unwrap().is_none(), "perennial edge exited ({what})");
            assert!(Instant::now() < deadline, "perennial edge did not settle ({what})");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(2));
        let rss = rss_kb(agent.id());
        let _ = agent.kill();
        let _ = agent.wait();
        println!("edge agent RSS, linked, {what}: {:.1} MB ({rss} kB)", rss as f64 / 1024.0);
    };

    // (a) Linked, nothing desired.
    measure(&dir.path().join("state-idle"), 0, "idle");

    // (b) Linked, 100 idle jobs desired, each with its own index file. The first start
    // compiles the policies into the cache; the restart (jobs from its own state, the cloud
    // sending the same desired state) is the steady state.
    let mut desired = NodeDesired::default();
    for i in 0..JOBS {
        let job = serde_json::json!({
            "metadata": {"namespace": "default", "name": format!("job-{i}"), "uid": format!("uid-{i}")},
            "config": idle_job(dir.path(), i)
        });
        desired.jobs.insert(format!("default/job-{i}"), job.into());
    }
    side.desired.send_replace(Arc::new(desired));
    let state = dir.path().join("state-jobs");
    for start in ["first start (compiling)", "restart (compile cache warm)"] {
        measure(&state, JOBS as i64, &format!("{JOBS} jobs, {start}"));
    }

    stop.send_replace(true);
    let _ = rt.block_on(server);
}
