//! Stage hop latency of the embedded mode: `cargo bench -p perennial --bench lifecycle`.
//!
//! From a worker's report (the HTTP POST to the worker API, as Sedna's library sends it) to the
//! next stage's worker process started (the first thing it does is note the time), through the
//! whole path: the worker API commits the report, the control plane applies it (stage machine),
//! tells the edge, the edge writes the eval set or runs the selector and copies the model,
//! reports Ready, and the control plane starts the worker. Two hops per round: train report →
//! eval worker, eval report → inference worker. Sedna waits for 10 s ticks on these hops.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use perennial_embedded::{self as embedded, RunOptions};

const ROUNDS: usize = 40;

/// Each worker writes `<name> <start ns> <LC_SERVER> <OUTPUT_URL>` to `started/<name>`, then waits.
const WORKER: &str = r#"t=$(date +%s%N); mkdir -p "$PERENNIAL_STATE_DIR/started"; printf '%s %s %s %s\n' "$WORKER_NAME" "$t" "$LC_SERVER" "${OUTPUT_URL:-none}" > "$PERENNIAL_STATE_DIR/started/.$WORKER_NAME"; mv "$PERENNIAL_STATE_DIR/started/.$WORKER_NAME" "$PERENNIAL_STATE_DIR/started/$WORKER_NAME"; exec sleep 600"#;

fn manifests(dir: &Path) {
    let container = |name: &str| {
        format!(
            "        containers:\n          - name: {name}\n            image: none\n            command: [\"sh\", \"-c\", {WORKER:?}]\n"
        )
    };
    let text = format!(
        "apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata: {{name: bench, namespace: default}}
spec: {{url: data/index.txt, format: txt, nodeName: local}}
---
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {{name: bench, namespace: default}}
spec:
  dataset: {{name: bench, trainProb: 0.8}}
  outputDir: output
  trainSpec:
    trigger: {{condition: {{operator: '>=', threshold: 8, metric: num_of_samples}}}}
    template:
      spec:
{}  evalSpec:
    template:
      spec:
{}  deploySpec:
    template:
      spec:
{}",
        container("train"),
        container("eval"),
        container("inference")
    );
    std::fs::write(dir.join("job.yaml"), text).unwrap();
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

struct Started {
    name: String,
    at_ns: u128,
    lc_server: String,
    output: String,
}

/// Waits for a worker of `kind` (`train-worker`, `eval-worker`, `inferworker`) not seen before.
fn next_worker(dir: &Path, kind: &str, seen: &mut Vec<String>) -> Started {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(kind) && !seen.contains(&name) {
                    let text = std::fs::read_to_string(entry.path()).unwrap();
                    let mut parts = text.split_whitespace();
                    let started = Started {
                        name: parts.next().unwrap().to_owned(),
                        at_ns: parts.next().unwrap().parse().unwrap(),
                        lc_server: parts.next().unwrap().to_owned(),
                        output: parts.next().unwrap().to_owned(),
                    };
                    seen.push(name);
                    return started;
                }
            }
        }
        assert!(Instant::now() < deadline, "no {kind} started");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Sedna's report, sent the way its library sends it; returns the send time.
fn report(client: &reqwest::blocking::Client, worker: &Started, kind: &str, accuracy: f64) -> u128 {
    let model = PathBuf::from(&worker.output).join("model.json");
    std::fs::create_dir_all(&worker.output).unwrap();
    std::fs::write(&model, format!("{{\"accuracy\": {accuracy}}}")).unwrap();
    let body = serde_json::json!({
        "name": worker.name, "namespace": "default", "ownerName": "bench", "ownerKind": "lifelonglearningjob",
        "kind": kind, "status": "completed",
        "results": [{"format": "json", "url": model, "metrics": {"accuracy": accuracy}}],
    });
    let sent = now_ns();
    let reply =
        client.post(format!("{}/sedna/workers/{}/info", worker.lc_server, worker.name)).json(&body).send().unwrap();
    assert!(reply.status().is_success(), "{}", reply.text().unwrap_or_default());
    sent
}

fn main() {
    if let Ok(dir) = std::env::var("BENCH_WRITE_MANIFESTS") {
        return manifests(Path::new(&dir));
    }
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    manifests(&dir);
    std::fs::create_dir_all(state.join("data")).unwrap();
    let index = state.join("data/index.txt");
    std::fs::write(&index, "").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let options = RunOptions::local(vec![dir.clone()], state.clone());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = {
        let stop = stop.clone();
        runtime.spawn(async move { embedded::run(options, stop).await })
    };
    perennial_tls::install_crypto_provider(); // reqwest has no rustls provider of its own
    let client = reqwest::blocking::Client::new();
    let started_dir = state.join("started");
    let mut seen = Vec::new();
    let (mut to_eval, mut to_inference) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Ten new samples: eight for training, past the threshold.
        let mut lines = String::new();
        for i in 0..10 {
            lines.push_str(&format!("images/{round:04}-{i}.jpg\n"));
        }
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&index).unwrap().write_all(lines.as_bytes()).unwrap();
        let train = next_worker(&started_dir, "train-worker", &mut seen);
        let sent = report(&client, &train, "train", 0.5);
        let eval = next_worker(&started_dir, "eval-worker", &mut seen);
        to_eval.push(Duration::from_nanos((eval.at_ns.saturating_sub(sent)) as u64));
        let sent = report(&client, &eval, "eval", 0.5 + round as f64 / 1000.0);
        let inference = next_worker(&started_dir, "inferworker", &mut seen);
        to_inference.push(Duration::from_nanos((inference.at_ns.saturating_sub(sent)) as u64));
    }
    let swaps = hot_swaps(&dir, &state);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    runtime.block_on(run).unwrap().unwrap();
    report_times("policy edited in the manifest -> the new policy serving", swaps);
    report_times("train report -> eval worker started", to_eval);
    report_times("eval report -> inference worker started", to_inference);
}

fn report_times(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms over {} times",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3,
        times.len()
    );
}

/// Edits the job's trigger back and forth between Sedna's rule and a plugin file, and times each
/// edit until the edge serves the new policy (its digest recorded after the swap).
fn hot_swaps(dir: &Path, state: &Path) -> Vec<Duration> {
    let job = dir.join("job.yaml");
    let original = std::fs::read_to_string(&job).unwrap();
    let plugin = perennial_policy::builtin::built_plugin_path("count-or-age-trigger").unwrap();
    let with_plugin = original.replace(
        "metric: num_of_samples}}",
        &format!("metric: num_of_samples}}, policy: {{plugin: {plugin:?}, config: {{samples: 8, maxAgeHours: 1}}}}}}"),
    );
    assert_ne!(with_plugin, original);
    let edge = rusqlite::Connection::open(state.join("edge.db")).unwrap();
    let serving = || -> Option<String> {
        edge.query_row("SELECT digest FROM policy_health WHERE kind = 'trigger'", [], |r| r.get(0)).ok().flatten()
    };
    let mut times = Vec::new();
    for i in 0..20 {
        let before = serving();
        let text = if i % 2 == 0 { &with_plugin } else { &original };
        let started = Instant::now();
        std::fs::write(&job, text).unwrap();
        while serving() == before {
            assert!(started.elapsed() < Duration::from_secs(10), "swap {i} never served");
            std::thread::sleep(Duration::from_micros(500));
        }
        times.push(started.elapsed());
    }
    times
}
