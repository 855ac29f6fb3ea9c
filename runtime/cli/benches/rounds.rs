//! The embedded mode's control-plane time of a round: `cargo bench -p perennial --bench rounds`.
//!
//! Jobs run in one `perennial run` (in this process, as the lifecycle bench runs it), each with
//! its own Dataset, and instant workers: a worker's process tells the bench it started (bash's
//! `/dev/tcp`, no extra process), and the bench posts Sedna's report for it at once. Two
//! scenarios, the same procedure:
//!
//! - alone: 1 job, `PERENNIAL_BENCH_ROUNDS_ALONE` rounds (20);
//! - many: 100 jobs (`PERENNIAL_BENCH_JOBS`), `PERENNIAL_BENCH_ROUNDS_MANY` rounds (5), every
//!   job's samples appended at once.
//!
//! `PERENNIAL_BENCH_ONLY=alone|many` runs one of them. A job's round: samples appended -> train
//! worker started, its report -> eval worker started, its report -> inference worker started.
//! Its control-plane time is the sum of the three hops: the workers' own time (started -> report
//! posted) is left out.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../../../tests/support/many_jobs.rs"]
mod many_jobs;

use perennial_embedded::{self as embedded, RunOptions};

/// Samples appended to each job's index a round; the trigger's threshold is 8 train samples.
const SAMPLES: usize = 10;

/// A worker says `<job> <worker name> <LC_SERVER> <OUTPUT_URL>` to the bench, then waits on the
/// connection (which the bench keeps open) until it is stopped: no process but the shell.
fn worker_script(port: u16) -> String {
    format!(
        r#"exec 3<>/dev/tcp/127.0.0.1/{port}; printf '%s %s %s %s\n' "$JOB_NAME" "$WORKER_NAME" "$LC_SERVER" "${{OUTPUT_URL:-none}}" >&3; read -r -u 3"#
    )
}

fn manifests(dir: &Path, jobs: usize, port: u16) {
    let command = format!("[bash, -c, {:?}]", worker_script(port));
    std::fs::write(dir.join("jobs.yaml"), many_jobs::manifests(jobs, &command)).unwrap();
}

/// A worker that said it started, and when the bench heard it.
struct Started {
    at: Instant,
    job: String,
    name: String,
    lc_server: String,
    output: String,
}

/// Accepts the workers' lines, stamped as they arrive.
fn listen(listener: TcpListener, started: mpsc::Sender<Started>) {
    let mut open = Vec::new();
    for stream in listener.incoming().flatten() {
        let at = Instant::now();
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        open.push(stream);
        if let [job, name, lc_server, output] = line.split_whitespace().collect::<Vec<_>>()[..] {
            let worker = Started {
                at,
                job: job.to_owned(),
                name: name.to_owned(),
                lc_server: lc_server.to_owned(),
                output: output.to_owned(),
            };
            if started.send(worker).is_err() {
                return;
            }
        }
    }
}

/// Sedna's report for a worker, sent the way its library sends it; returns the send time.
/// A train worker writes its model first; an eval worker reports on the round's trained model.
fn report(client: &reqwest::blocking::Client, worker: &Started, kind: &str, model: &Path) -> Instant {
    if kind == "train" {
        std::fs::create_dir_all(&worker.output).unwrap();
        std::fs::write(model, "{\"accuracy\": 0.5}").unwrap();
    }
    let body = serde_json::json!({
        "name": worker.name, "namespace": "default", "ownerName": worker.job, "ownerKind": "lifelonglearningjob",
        "kind": kind, "status": "completed",
        "results": [{"format": "json", "url": model, "metrics": {"accuracy": 0.5}}],
    });
    let sent = Instant::now();
    let reply =
        client.post(format!("{}/sedna/workers/{}/info", worker.lc_server, worker.name)).json(&body).send().unwrap();
    assert!(reply.status().is_success(), "{}", reply.text().unwrap_or_default());
    sent
}

/// One job's round as the bench saw it.
#[derive(Default)]
struct JobRound {
    train_started: Option<Instant>,
    train_reported: Option<Instant>,
    eval_started: Option<Instant>,
    eval_reported: Option<Instant>,
    deployed: Option<Instant>,
    /// What the eval worker reports on: the model the round trained.
    train_model: Option<PathBuf>,
}

/// The hops of every job-round, and each round's whole wall time.
#[derive(Default)]
struct Figures {
    to_train: Vec<Duration>,
    to_eval: Vec<Duration>,
    to_inference: Vec<Duration>,
    control_plane: Vec<Duration>,
    wall: Vec<Duration>,
}

fn scenario(name: &str, jobs: usize, rounds: usize) {
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    manifests(&dir, jobs, port);
    let indexes: Vec<PathBuf> = (0..jobs)
        .map(|i| {
            let folder = state.join(format!("data/{i}"));
            std::fs::create_dir_all(&folder).unwrap();
            let index = folder.join("index.txt");
            std::fs::write(&index, "").unwrap();
            index
        })
        .collect();
    let (started_tx, started) = mpsc::channel();
    std::thread::spawn(move || listen(listener, started_tx));
    let stop = Arc::new(AtomicBool::new(false));
    let options = RunOptions {
        // As `perennial run` starts it: workers are then started without a fork of this process.
        reaper: Some(PathBuf::from(env!("CARGO_BIN_EXE_perennial"))),
        ..RunOptions::local(vec![dir.clone()], state.clone())
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = {
        let stop = stop.clone();
        runtime.spawn(async move { embedded::run(options, stop).await })
    };
    let client = reqwest::blocking::Client::new();
    let mut figures = Figures::default();
    for round in 0..rounds {
        let appended = Instant::now();
        for (i, index) in indexes.iter().enumerate() {
            let lines: String = (0..SAMPLES).map(|n| format!("images/{i}-{round:04}-{n}.jpg\n")).collect();
            std::fs::OpenOptions::new().append(true).open(index).unwrap().write_all(lines.as_bytes()).unwrap();
        }
        let mut seen: HashMap<String, JobRound> = HashMap::new();
        let mut deployed = 0;
        while deployed < jobs {
            let worker = started.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
                panic!("{name}: round {round}: {deployed} of {jobs} jobs deployed, nothing more in 120 s")
            });
            let job = seen.entry(worker.job.clone()).or_default();
            if worker.name.starts_with("train-worker") {
                job.train_started = Some(worker.at);
                let model = PathBuf::from(&worker.output).join("model.json");
                job.train_reported = Some(report(&client, &worker, "train", &model));
                job.train_model = Some(model);
            } else if worker.name.starts_with("eval-worker") {
                job.eval_started = Some(worker.at);
                let model = job.train_model.clone().expect("an eval worker after its round's train worker");
                job.eval_reported = Some(report(&client, &worker, "eval", &model));
            } else if worker.name.starts_with("inferworker") {
                job.deployed = Some(worker.at);
                deployed += 1;
            }
        }
        figures.wall.push(appended.elapsed());
        for job in seen.values() {
            let (Some(train), Some(train_reported), Some(eval), Some(eval_reported), Some(deployed)) =
                (job.train_started, job.train_reported, job.eval_started, job.eval_reported, job.deployed)
            else {
                panic!("{name}: round {round}: a job was deployed without a train and an eval worker");
            };
            let hops = [train - appended, eval - train_reported, deployed - eval_reported];
            figures.to_train.push(hops[0]);
            figures.to_eval.push(hops[1]);
            figures.to_inference.push(hops[2]);
            figures.control_plane.push(hops.iter().sum());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    runtime.block_on(run).unwrap().unwrap();
    println!("{name}: {jobs} job(s), {rounds} round(s)");
    print_times("  control plane of a job's round", figures.control_plane);
    print_times("  samples appended -> train worker started", figures.to_train);
    print_times("  train report -> eval worker started", figures.to_eval);
    print_times("  eval report -> inference worker started", figures.to_inference);
    print_times("  a whole round (appended -> every job deployed)", figures.wall);
}

fn print_times(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms over {}",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3,
        times.len()
    );
}

fn main() {
    perennial_tls::install_crypto_provider(); // reqwest has no rustls provider of its own
    let number = |name: &str, default: usize| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(default)
    };
    let only = std::env::var("PERENNIAL_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "alone" {
        scenario("alone", 1, number("PERENNIAL_BENCH_ROUNDS_ALONE", 20));
    }
    if only.is_empty() || only == "many" {
        scenario("many", number("PERENNIAL_BENCH_JOBS", 100), number("PERENNIAL_BENCH_ROUNDS_MANY", 5));
    }
}
