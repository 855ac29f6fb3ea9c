//! Edge benchmarks: `cargo bench -p perennial --bench edge`.
//!
//! - `ingest/{wasm,native}`: from an index of 1,000,000 new 60-byte lines to committed
//!   assignments in SQLite, with the built-in splitter as a Wasm component and with the same
//!   rule computed natively. One core: ingest runs on the calling thread.
//! - trigger latency (printed): from an append that meets the threshold to the Train Ready
//!   report committed, on the local filesystem, through the real job loop (change notification,
//!   ingest, trigger, round file, commit); p50 and p90 over 40 rounds.
//! - idle memory (printed): RSS of a `perennial edge` process running 100 idle jobs.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use perennial::edge::{self, IngestLimits, JobSpec, LocalFile, Split};
use perennial::policy::{PolicyHost, PolicyRef, SplitterKind, TracingEvents, builtin};
use perennial::store::Store;

const LINES: usize = 1_000_000;
const JOB: &str = "default/bench";

fn main() {
    trigger_latency();
    idle_memory();
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
        ("wasm", Split { policy: Some(&policy), train_prob: 0.8 }),
        ("native", Split { policy: None, train_prob: 0.8 }),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let db = dir.path().join(format!("{name}-{}.db", rand_suffix()));
                    let mut store = Store::open(&db).unwrap();
                    edge::register_job(&mut store, JOB, "uid", &JobSpec::default()).unwrap();
                    store
                },
                |mut store| {
                    let mut file = LocalFile { path: index.clone() };
                    let done =
                        edge::ingest(&mut store, JOB, &mut file, false, &split, IngestLimits::default()).unwrap();
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
    use perennial::edge::agent::{self, JobConfig, LoopSettings};
    use perennial::edge::report;
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
        let read_model = agent::model_reader(rt.handle().clone(), None, vec![output.display().to_string()]);
        let mut runners = vec![agent::JobRunner { job, policies, index, output: op, read_model, settings }];
        std::thread::spawn(move || agent::run_jobs(&store, &mut runners, &stop, agent::Wakes::new(), &|| {}, None))
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut file = std::fs::OpenOptions::new().append(true).open(&index).unwrap();
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        // 499 samples: 399 train, one short of the threshold; then a burst of 5 (4 train) meets it.
        let lines: String = (0..499).map(|i| format!("images/{round:04}-{i:04}.jpg,label-{:<30}\n", i % 7)).collect();
        file.write_all(lines.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let reports = report::pending(&store.lock().unwrap(), 1000).unwrap().len();
        let started = Instant::now();
        file.write_all(b"images/a.jpg,1\nimages/b.jpg,0\nimages/c.jpg,1\nimages/d.jpg,1\nimages/e.jpg,0\n").unwrap();
        loop {
            if report::pending(&store.lock().unwrap(), 1000).unwrap().len() > reports {
                latencies.push(started.elapsed());
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "no Train Ready");
            std::thread::sleep(Duration::from_micros(200));
        }
        // The control plane moves the job back to Train/Waiting for the next round.
        perennial::edge::rounds::set_stage(&mut store.lock().unwrap(), JOB, "Train", "Waiting").unwrap();
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

fn idle_memory() {
    const JOBS: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let jobs: Vec<serde_json::Value> = (0..JOBS)
        .map(|i| {
            let index = dir.path().join(format!("data-{i}/index.txt"));
            std::fs::create_dir_all(index.parent().unwrap()).unwrap();
            std::fs::write(&index, "images/a.jpg\nimages/b.jpg\n").unwrap();
            serde_json::json!({
                "name": format!("default/job-{i}"), "uid": format!("uid-{i}"),
                "spec": {"datasetUrl": index, "datasetFormat": "txt",
                         "outputDir": dir.path().join(format!("out-{i}")), "trainProb": 0.8},
                "splitter": {"plugin": "builtin:ratio-split", "config": {"trainProb": 0.8}},
                "trigger": {"plugin": "builtin:threshold-trigger",
                            "config": {"condition": {"operator": ">", "threshold": 500}}},
                "selector": {"plugin": "builtin:metric-select", "config": {"metric": "accuracy"}}
            })
        })
        .collect();
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
