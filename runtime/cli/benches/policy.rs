//! Policy host benchmarks: `cargo bench -p perennial --bench policy`.
//!
//! - `trigger/decide`: one call of the built-in threshold trigger.
//! - `split/10000/{wasm,native}-{ratio,hash}`: the built-in splitter on 10,000 60-byte lines,
//!   as a Wasm component and as the same Rust code called natively.
//! - `swap/{memory-cache,disk-cache}`: load a policy whose component is already compiled
//!   (in memory, or in the on-disk cache only) and commit it into a slot: a hot swap.
//! - `compile/cold`: compile a built-in with no cache.
//! - memory per held instance: printed before the timings.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use perennial_guest::Splitter as _;
use perennial_policy::{
    PolicyEvents, PolicyHost, PolicyRef, PolicySlot, SampleBatch, SplitterKind, TriggerKind, TriggerStats, ValidRef,
};

const BATCH: usize = 10_000;

struct Quiet;
impl PolicyEvents for Quiet {
    fn log(&self, _: perennial_policy::Level, _: &str) {}
}

fn events() -> Arc<dyn PolicyEvents> {
    Arc::new(Quiet)
}

fn valid(plugin: &str, config: serde_json::Value) -> ValidRef {
    PolicyRef::new(plugin).with_config(config).validate().expect("valid reference")
}

fn builtin_bytes(name: &str) -> &'static [u8] {
    perennial_policy::builtin::component(name).expect("built-in")
}

/// 10,000 lines of 60 bytes, like a dataset index of image paths and labels.
fn lines() -> Vec<String> {
    (0..BATCH).map(|i| format!("images/train/{i:08}.jpg,label-{:<28}", i % 17)).collect()
}

fn trigger(c: &mut Criterion) {
    let host = PolicyHost::new(None, None).unwrap();
    let reference =
        valid("builtin:threshold-trigger", serde_json::json!({"condition": {"operator": ">", "threshold": 500}}));
    let policy = host.load_bytes::<TriggerKind>(&reference, builtin_bytes("threshold-trigger"), events()).unwrap();
    let stats = TriggerStats { pending_train: 501, wall_clock_secs: 1_700_000_000, ..TriggerStats::default() };
    c.bench_function("trigger/decide", |b| b.iter(|| policy.decide(black_box(&stats)).unwrap()));
}

fn split(c: &mut Criterion) {
    let host = PolicyHost::new(None, None).unwrap();
    let lines = lines();
    assert!(lines.iter().all(|l| l.len() == 60));
    let packed = SampleBatch::from_lines(0, &lines).unwrap();
    let mut group = c.benchmark_group(format!("split/{BATCH}"));
    group.throughput(Throughput::Elements(BATCH as u64));
    for mode in ["ratio", "hash"] {
        let config = serde_json::json!({"trainProb": 0.8, "mode": mode});
        let wasm = host
            .load_bytes::<SplitterKind>(
                &valid("builtin:ratio-split", config.clone()),
                builtin_bytes("ratio-split"),
                events(),
            )
            .unwrap();
        let mut native = ratio_split::RatioSplit::configure(&config.to_string()).unwrap();
        // Same input, same answer.
        let from_wasm = wasm.split(packed.clone()).unwrap().to_vec();
        let from_native = native.split(&perennial_guest::Batch::from_lines(0, &lines));
        assert_eq!(
            from_wasm.iter().map(|a| *a as u8).collect::<Vec<_>>(),
            from_native.iter().map(|a| *a as u8).collect::<Vec<_>>()
        );

        group.bench_function(format!("wasm-{mode}"), |b| {
            b.iter_batched(|| packed.clone(), |batch| wasm.split(batch).unwrap(), BatchSize::LargeInput)
        });
        group.bench_function(format!("native-{mode}"), |b| {
            b.iter_batched(
                || perennial_guest::Batch::from_lines(0, &lines),
                |batch| native.split(&batch),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn swap(c: &mut Criterion) {
    let cache = tempfile::tempdir().unwrap();
    let host = PolicyHost::new(Some(cache.path().to_path_buf()), None).unwrap();
    let old = valid("builtin:ratio-split", serde_json::json!({"trainProb": 0.8}));
    let new = valid("builtin:ratio-split", serde_json::json!({"trainProb": 0.5, "mode": "hash"}));
    let bytes = builtin_bytes("ratio-split");
    let slot = PolicySlot::new(host.load_bytes::<SplitterKind>(&old, bytes, events()).unwrap());
    let mut group = c.benchmark_group("swap");
    group.bench_function("memory-cache", |b| {
        b.iter(|| slot.commit(host.load_bytes::<SplitterKind>(&new, bytes, events()).unwrap()))
    });
    group.bench_function("disk-cache", |b| {
        b.iter(|| {
            host.clear_memory_cache();
            slot.commit(host.load_bytes::<SplitterKind>(&new, bytes, events()).unwrap())
        })
    });
    group.finish();
}

fn compile(c: &mut Criterion) {
    let reference =
        valid("builtin:threshold-trigger", serde_json::json!({"condition": {"operator": ">", "threshold": 500}}));
    let mut group = c.benchmark_group("compile");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    group.bench_function("cold", |b| {
        b.iter(|| {
            let host = PolicyHost::new(None, None).unwrap();
            host.load_bytes::<TriggerKind>(&reference, builtin_bytes("threshold-trigger"), events()).unwrap()
        })
    });
    group.finish();
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// RSS added per held, configured, once-called trigger instance.
fn memory_per_instance() {
    const N: usize = 500;
    let host = PolicyHost::new(None, None).unwrap();
    let reference =
        valid("builtin:threshold-trigger", serde_json::json!({"condition": {"operator": ">", "threshold": 500}}));
    let bytes = builtin_bytes("threshold-trigger");
    let stats = TriggerStats { pending_train: 501, ..TriggerStats::default() };
    // Warm up: the first instance pays for lazy runtime set-up.
    let first = host.load_bytes::<TriggerKind>(&reference, bytes, events()).unwrap();
    first.decide(&stats).unwrap();
    let before = rss_bytes();
    let held: Vec<_> = (0..N)
        .map(|_| {
            let policy = host.load_bytes::<TriggerKind>(&reference, bytes, events()).unwrap();
            policy.decide(&stats).unwrap();
            policy
        })
        .collect();
    let after = rss_bytes();
    println!(
        "memory per held instance: {:.1} KiB ({N} trigger instances)",
        (after - before) as f64 / N as f64 / 1024.0
    );
    drop(held);
}

fn main() {
    memory_per_instance();
    let mut c = Criterion::default().configure_from_args();
    trigger(&mut c);
    split(&mut c);
    swap(&mut c);
    compile(&mut c);
    c.final_summary();
}
