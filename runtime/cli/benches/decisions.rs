//! Decision records and replay: `cargo bench -p perennial --bench decisions`.
//!
//! - `trigger/{decide,decide-timed,decide+record}`: a threshold-trigger call alone, and with its
//!   record (each wait a new run of its own, written every 100th in a transaction the loop makes
//!   anyway, whose begin and commit are not timed: the costliest case; `decide-timed` is the call
//!   timed the same way); `decide+record-same`: an idle job's wait, the same but the clock, which
//!   only counts in its run.
//! - `trigger/decide+shadow`: the call with a shadow trigger: what the serving side pays is
//!   handing the question to the shadow's thread, after the answer has acted.
//!   `trigger/decide-timed-{alone,beside-shadow}`: the serving call's own latency (only the call
//!   timed), alone and with a shadow asked the same questions. All three as the edge's loop runs:
//!   turns of 100 decisions, and a wait of 1 ms after each, in which the shadow answers (it
//!   starts no call during a turn); how many it answered and skipped is printed. Then the two
//!   latencies in alternation, turn by turn, 1,000 pairs: the difference a shadow makes under the
//!   same moment's load, for a call, the first call of a turn and the others (printed).
//! - `trigger/record-train`: the record of a decision that started a round, inserted in the
//!   transaction that acts on it (the transaction itself is the round's).
//! - `split/10000/{split,record}`: the built-in splitter on 10,000 samples as a Wasm component,
//!   and the record of that split (its batch's range and counts; the assignments are the batch
//!   row's) inserted in the batch's transaction.
//! - `replay/{trigger,split}`: replaying 1,000 trigger records, and 20 batches of 10,000 samples
//!   read back from a dataset file, through the built-ins: decisions per second.

use std::hint::black_box;
use std::io::Write;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput};
use perennial_edge::decisions::{BatchInput, DecidedBy, DecisionKind, Record, SplitCounts};
use perennial_edge::shadow::{self, Question, Shadows};
use perennial_edge::sqlite::Store;
use perennial_edge::{IndexFile, JobSpec, LocalFile, replay};
use perennial_policy::{
    Decision, PolicyEvents, PolicyHost, PolicyRef, SampleBatch, SplitterKind, TriggerKind, TriggerStats,
};

const JOB: &str = "default/bench";
const BATCH: usize = 10_000;

struct Quiet;
impl PolicyEvents for Quiet {
    fn log(&self, _: perennial_policy::Level, _: &str) {}
}

fn host_load<K: perennial_policy::Kind>(name: &str, config: serde_json::Value) -> perennial_policy::Policy<K> {
    let valid = PolicyRef::new(format!("builtin:{name}")).with_config(config).validate().unwrap();
    let bytes = perennial_policy::builtin::component(name).unwrap();
    PolicyHost::new(None, None).unwrap().load_bytes::<K>(&valid, bytes, Arc::new(Quiet)).unwrap()
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("edge.db")).unwrap();
    perennial_edge::register_job(&mut store, JOB, "uid", &JobSpec::default()).unwrap();
    (dir, store)
}

/// Decisions per turn of the loop in the shadow benches, and the loop's wait after each.
const TURN: u64 = 100;
const LOOP_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// Turns of each compared in alternation.
const PAIRS: usize = 1000;

/// What a shadow bench times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Timed {
    /// The serving call, with no shadow.
    Alone,
    /// The serving call, its shadow asked after it (not timed).
    BesideShadow,
    /// The serving call and the hand-off to its shadow.
    WithHandOff,
}

fn with_shadow(timed: Timed) -> bool {
    timed != Timed::Alone
}

fn trigger(c: &mut Criterion) {
    let policy = host_load::<TriggerKind>(
        "threshold-trigger",
        serde_json::json!({"condition": {"operator": ">", "threshold": 1_000_000_000}}),
    );
    let by = DecidedBy::of(&policy);
    let (_dir, mut store) = store();
    let mut group = c.benchmark_group("trigger");
    let mut stats = TriggerStats { pending_train: 1, wall_clock_secs: 1_700_000_000, ..TriggerStats::default() };
    group.bench_function("decide", |b| {
        b.iter(|| {
            stats.pending_train += 1;
            policy.decide(black_box(&stats)).unwrap()
        })
    });
    // Written with the next transaction, which the loop makes anyway (the ingest of the batch
    // that changed the stats): a transaction every 100 decisions, its begin and commit not
    // timed (they are the loop's); the calls, the notes in memory and the writes are. The
    // same way of timing, without the record, is `decide-timed`.
    let mut recorder = perennial_edge::decisions::Recorder::default();
    let mut timed = |record: bool, iters: u64| {
        let mut spent = std::time::Duration::ZERO;
        for call in 1..=iters {
            let started = std::time::Instant::now();
            stats.pending_train += 1;
            let decision: Decision = policy.decide(black_box(&stats)).unwrap();
            if record {
                recorder.wait(JOB, 0, &stats, &decision, &by, stats.wall_clock_secs * 1000, 1);
            }
            spent += started.elapsed();
            if record && (call.is_multiple_of(100) || call == iters) {
                let tx = store.write().unwrap();
                let started = std::time::Instant::now();
                recorder.flush(&tx);
                spent += started.elapsed();
                tx.commit().unwrap();
            }
        }
        spent
    };
    group.bench_function("decide-timed", |b| b.iter_custom(|iters| timed(false, iters)));
    group.bench_function("decide+record", |b| b.iter_custom(|iters| timed(true, iters)));
    // An idle job: the same stats but the clock, the same answer: one run, counted in memory.
    group.bench_function("decide+record-same", |b| {
        b.iter(|| {
            stats.wall_clock_secs += 1;
            let decision: Decision = policy.decide(black_box(&stats)).unwrap();
            recorder.wait(JOB, 0, &stats, &decision, &by, stats.wall_clock_secs * 1000, 1);
        })
    });
    // The same with a shadow: the loop hands it the question and goes on; the shadow (here
    // the same trigger) answers on its own thread and its counts go to the store.
    let loaded = shadow::Loaded::Serving { plugin: "builtin:threshold-trigger", digest: "d", config: "c" };
    shadow::loaded(&mut store, JOB, DecisionKind::Trigger, loaded).unwrap();
    let shadow_store = std::sync::Mutex::new(store);
    let shadows = Shadows {
        job: JOB.into(),
        trigger: Some(Arc::new(host_load::<TriggerKind>(
            "threshold-trigger",
            serde_json::json!({"condition": {"operator": ">", "threshold": 400}}),
        ))),
        ..Shadows::default()
    };
    let (queue, worker) = shadow::queue();
    std::thread::scope(|scope| {
        scope.spawn(|| worker.serve(&shadow_store));
        // The first call of each turn, apart (the paired figure below).
        let first_calls = std::cell::Cell::new(std::time::Duration::ZERO);
        // As the edge's loop runs: a turn of decisions (its shadow asked after each acted), then
        // a wait, in which the shadow answers. Only the timed part counts, the same way in each.
        let mut turns = |timed: Timed, iters: u64| {
            let mut spent = std::time::Duration::ZERO;
            for call in 0..iters {
                if call % TURN == 0 {
                    queue.loop_busy();
                }
                stats.pending_train += 1;
                let started = std::time::Instant::now();
                let decision = policy.decide(black_box(&stats)).unwrap();
                let call_time = started.elapsed();
                if call % TURN == 0 {
                    first_calls.set(first_calls.get() + call_time);
                }
                if with_shadow(timed) {
                    queue.ask(&shadows, Question::Trigger { stats: stats.clone(), train: decision.train }, 0);
                }
                spent += if timed == Timed::WithHandOff { started.elapsed() } else { call_time };
                if call % TURN == TURN - 1 || call == iters - 1 {
                    queue.loop_waits();
                    std::thread::sleep(LOOP_WAIT);
                }
            }
            spent
        };
        group.bench_function("decide+shadow", |b| b.iter_custom(|iters| turns(Timed::WithHandOff, iters)));
        group.bench_function("decide-timed-alone", |b| b.iter_custom(|iters| turns(Timed::Alone, iters)));
        group
            .bench_function("decide-timed-beside-shadow", |b| b.iter_custom(|iters| turns(Timed::BesideShadow, iters)));
        // The same two in alternation, under the same moment's load (the cases above run a
        // minute apart on a noisy machine): two turns of each, the second timed (the first
        // after a change lands the shadow's last answers on the other case).
        let mut paired = Vec::with_capacity(PAIRS);
        for _ in 0..PAIRS {
            // Each case's mean call, and its first call of the turn.
            let [(alone, alone_first), (beside, beside_first)] = [Timed::Alone, Timed::BesideShadow].map(|timed| {
                turns(timed, TURN);
                first_calls.set(std::time::Duration::ZERO);
                let mean = turns(timed, TURN).as_secs_f64() * 1e6 / TURN as f64;
                (mean, first_calls.get().as_secs_f64() * 1e6)
            });
            let others = |mean: f64, first: f64| (mean * TURN as f64 - first) / (TURN - 1) as f64;
            paired.push([
                alone,
                beside,
                beside - alone,
                beside_first - alone_first,
                others(beside, beside_first) - others(alone, alone_first),
            ]);
        }
        // The median of one column, and its quartiles.
        let quartiles = |column: usize| {
            let mut values: Vec<f64> = paired.iter().map(|pair| pair[column]).collect();
            values.sort_by(f64::total_cmp);
            [values.len() / 4, values.len() / 2, values.len() * 3 / 4].map(|at| values[at])
        };
        let [_, alone, _] = quartiles(0);
        let [_, beside, _] = quartiles(1);
        println!(
            "trigger serving call in {PAIRS} pairs of turns: {alone:.2} µs alone, {beside:.2} µs beside the shadow (medians)"
        );
        for (column, which) in [(2, "a call"), (3, "the first call of a turn"), (4, "the other calls")] {
            let [low, median, high] = quartiles(column);
            println!("  beside minus alone, {which}: {median:+.2} µs (quartiles {low:+.2} to {high:+.2})");
        }
        drop(queue);
    });
    let mut store = shadow_store.into_inner().unwrap();
    store.flush_records().unwrap();
    if let Some((_, _, counts)) = shadow::all(store.conn()).unwrap().pop() {
        // Whether the waits between turns were enough for the shadow to answer it all.
        println!("trigger shadow beside the turns: {} answered, {} skipped", counts.calls, counts.skipped);
    }

    // One long transaction: the record's insert alone, not the round's commit.
    let record = Record {
        id: 0,
        job: JOB.into(),
        kind: DecisionKind::Trigger,
        at_ms: 1_700_000_000_000,
        last_ms: 1_700_000_000_000,
        repeats: 1,
        policy: by.clone(),
        round: 3,
        input: serde_json::to_value(&stats).unwrap(),
        answer: serde_json::json!({"train": true, "recheckAfterSecs": null}),
        reason: "num_of_samples 501 > 500".into(),
        assignments: None,
        micros: 1,
    };
    let mut recorder = perennial_edge::decisions::Recorder::default();
    let tx = store.write().unwrap();
    group.bench_function("record-train", |b| b.iter(|| recorder.record(&tx, black_box(&record)).unwrap()));
    drop(tx);
    group.finish();
}

fn lines() -> Vec<String> {
    (0..BATCH).map(|i| format!("images/train/{i:08}.jpg,label-{:<28}", i % 17)).collect()
}

fn split(c: &mut Criterion) {
    let policy = host_load::<SplitterKind>("ratio-split", serde_json::json!({"trainProb": 0.8}));
    let lines = lines();
    let packed = SampleBatch::from_lines(0, &lines).unwrap();
    let assignments = policy.split(packed.clone()).unwrap();
    let (train, eval, skip) = assignments.counts();
    let input = BatchInput {
        batch: 1,
        first_seq: 0,
        count: BATCH as u64,
        start: 0,
        end: 610_000,
        checksum: "0".repeat(32),
        train_prob: None,
    };
    let record = Record {
        id: 0,
        job: JOB.into(),
        kind: DecisionKind::Splitter,
        at_ms: 1_700_000_000_000,
        last_ms: 1_700_000_000_000,
        repeats: 1,
        policy: DecidedBy::of(&policy),
        round: 0,
        input: serde_json::to_value(&input).unwrap(),
        answer: serde_json::to_value(SplitCounts { train: train as u64, eval: eval as u64, skip: skip as u64 })
            .unwrap(),
        reason: String::new(),
        assignments: None,
        micros: 1,
    };
    let (_dir, mut store) = store();
    let mut group = c.benchmark_group(format!("split/{BATCH}"));
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("split", |b| {
        b.iter_batched(|| packed.clone(), |batch| policy.split(batch).unwrap(), BatchSize::LargeInput)
    });
    let mut recorder = perennial_edge::decisions::Recorder::default();
    let tx = store.write().unwrap();
    group.bench_function("record", |b| b.iter(|| recorder.record(&tx, black_box(&record)).unwrap()));
    drop(tx);
    group.finish();
}

fn replays(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    // 1,000 trigger records, pending growing by 10 each.
    let trigger = host_load::<TriggerKind>(
        "threshold-trigger",
        serde_json::json!({"condition": {"operator": ">", "threshold": 500}}),
    );
    let records: Vec<Record> = (0..1000u64)
        .map(|i| {
            let stats = TriggerStats { pending_train: (i * 10) % 600, ..TriggerStats::default() };
            Record {
                id: i as i64 + 1,
                job: JOB.into(),
                kind: DecisionKind::Trigger,
                at_ms: i * 1000,
                last_ms: i * 1000,
                repeats: 1,
                policy: DecidedBy::default(),
                round: (i / 60) as i64,
                input: serde_json::to_value(&stats).unwrap(),
                answer: serde_json::json!({"train": stats.pending_train > 400, "recheckAfterSecs": null}),
                reason: String::new(),
                assignments: None,
                micros: 1,
            }
        })
        .collect();
    group.throughput(Throughput::Elements(records.len() as u64));
    group.bench_function("trigger/1000", |b| {
        b.iter(|| replay::triggers(&records, 5, &mut |stats| trigger.decide(stats).map_err(|e| e.to_string())))
    });

    // 20 batches of 10,000 samples in a dataset file, Sedna's rule recorded natively.
    let splitter = host_load::<SplitterKind>("ratio-split", serde_json::json!({"trainProb": 0.8}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.txt");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut batches = Vec::new();
    let mut offset = 0u64;
    for batch in 0..20u64 {
        let start = offset;
        let mut bytes = Vec::new();
        for i in 0..BATCH as u64 {
            writeln!(bytes, "images/train/{:08}.jpg,label-{:<28}", batch * BATCH as u64 + i, i % 17).unwrap();
        }
        file.write_all(&bytes).unwrap();
        offset += bytes.len() as u64;
        let end = offset - 1; // the last sample's text ends before its newline
        let checksum = perennial_edge::ingest::batch_checksum(&bytes[..bytes.len() - 1]);
        let input = BatchInput {
            batch: batch as i64 + 1,
            first_seq: batch * BATCH as u64,
            count: BATCH as u64,
            start,
            end,
            checksum: hex::encode(&checksum),
            train_prob: Some(0.8),
        };
        batches.push(Record {
            id: batch as i64 + 1,
            job: JOB.into(),
            kind: DecisionKind::Splitter,
            at_ms: 0,
            last_ms: 0,
            repeats: 1,
            policy: DecidedBy::native_split(0.8),
            round: 0,
            input: serde_json::to_value(&input).unwrap(),
            answer: serde_json::json!({"train": 0, "eval": 0, "skip": 0}),
            reason: String::new(),
            assignments: None,
            micros: 1,
        });
    }
    file.flush().unwrap();
    drop(file);
    let mut index = LocalFile { path: path.clone() };
    let check = replay::splits(
        &batches,
        5,
        &mut |input| replay::read_batch(&mut index as &mut dyn IndexFile, input, false, 1 << 20),
        &mut |batch| splitter.split(batch).map_err(|e| e.to_string()),
    );
    assert!(check.agrees() && check.decisions == 20, "{check:?}");
    group.throughput(Throughput::Elements(batches.len() as u64));
    group.sample_size(20);
    group.bench_function("split/20x10000", |b| {
        b.iter(|| {
            replay::splits(
                &batches,
                5,
                &mut |input| replay::read_batch(&mut index as &mut dyn IndexFile, input, false, 1 << 20),
                &mut |batch| splitter.split(batch).map_err(|e| e.to_string()),
            )
        })
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    trigger(&mut c);
    split(&mut c);
    replays(&mut c);
    c.final_summary();
}
