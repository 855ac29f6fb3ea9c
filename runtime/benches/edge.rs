//! Edge benchmarks: `cargo bench -p perennial --bench edge`.
//!
//! - `ingest/{wasm,native}`: from an index of 1,000,000 new 60-byte lines to committed
//!   assignments in SQLite, with the built-in splitter as a Wasm component and with the same
//!   rule computed natively. One core: ingest runs on the calling thread.

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
