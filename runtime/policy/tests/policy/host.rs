//! The policy host against real components built from `plugins/`: the built-ins through Wasm,
//! hostile plugins contained within their limits, hot swap under concurrent calls, and the
//! on-disk compile cache recovering from corrupt and foreign entries.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use perennial_policy::{
    Assignment, Level, LoadError, ModelInfo, PolicyError, PolicyEvents, PolicyHost, PolicyRef, PolicySlot, SampleBatch,
    SelectorKind, SplitterKind, Step, TriggerKind, TriggerStats, builtin,
};

/// Keeps what a policy logs, as the job's events would.
#[derive(Default)]
struct Events(Mutex<Vec<(Level, String)>>);

impl PolicyEvents for Events {
    fn log(&self, level: Level, message: &str) {
        self.0.lock().unwrap().push((level, message.to_owned()));
    }
}

impl Events {
    fn lines(&self) -> Vec<(Level, String)> {
        self.0.lock().unwrap().clone()
    }
}

fn host() -> PolicyHost {
    PolicyHost::new(None, None).unwrap()
}

fn plugin_path(crate_name: &str) -> String {
    builtin::built_plugin_path(crate_name).unwrap_or_else(|| panic!("{crate_name} is built")).to_owned()
}

fn reference(plugin: &str, config: serde_json::Value) -> PolicyRef {
    PolicyRef::new(plugin).with_config(config)
}

fn load<K: perennial_policy::Kind>(reference: &PolicyRef) -> Result<perennial_policy::Policy<K>, LoadError> {
    let valid = reference.validate().map_err(|e| LoadError::new(Step::Reference, PolicyError::Reference(e)))?;
    let bytes = match &valid.source {
        perennial_policy::Source::Builtin(name) => builtin::component(name).unwrap().to_vec(),
        perennial_policy::Source::File(path) => std::fs::read(path).unwrap(),
        other => panic!("unexpected source {other}"),
    };
    host().load_bytes::<K>(&valid, &bytes, Arc::new(Events::default()))
}

fn hostile(config: serde_json::Value) -> (perennial_policy::TriggerPolicy, Arc<Events>) {
    hostile_from(reference(&plugin_path("hostile-trigger"), config))
}

fn hostile_from(reference: PolicyRef) -> (perennial_policy::TriggerPolicy, Arc<Events>) {
    let events = Arc::new(Events::default());
    let valid = reference.validate().unwrap();
    let bytes = std::fs::read(plugin_path("hostile-trigger")).unwrap();
    let policy = host().load_bytes::<TriggerKind>(&valid, &bytes, events.clone()).unwrap();
    (policy, events)
}

fn stats(pending_train: u64) -> TriggerStats {
    TriggerStats { pending_train, ..TriggerStats::default() }
}

fn sedna_trigger() -> perennial_policy::TriggerPolicy {
    load::<TriggerKind>(&reference(
        "builtin:threshold-trigger",
        serde_json::json!({"condition": {"operator": ">", "threshold": 500, "metric": "num_of_samples"}}),
    ))
    .unwrap()
}

#[test]
fn builtin_threshold_trigger_through_wasm() {
    let trigger = sedna_trigger();
    let train = trigger.decide(&stats(501)).unwrap();
    assert!(train.train);
    assert_eq!(train.reason, "num_of_samples 501 > 500");
    assert_eq!(train.recheck_after_secs, Some(60));
    assert!(!trigger.decide(&stats(500)).unwrap().train);

    // A window in the node's local time: 01:30 UTC is 03:30 at UTC+2, inside 02:00-24:00.
    let windowed = load::<TriggerKind>(&reference(
        "builtin:threshold-trigger",
        serde_json::json!({"timer": {"start": "02:00", "end": "24:00"},
                           "condition": {"operator": "ge", "threshold": 10}}),
    ))
    .unwrap();
    let at_0130_utc =
        TriggerStats { pending_train: 10, wall_clock_secs: 1_700_000_000 / 86_400 * 86_400 + 5400, ..stats(0) };
    assert!(!windowed.decide(&at_0130_utc).unwrap().train);
    assert!(windowed.decide(&TriggerStats { utc_offset_secs: 7200, ..at_0130_utc }).unwrap().train);
}

#[test]
fn builtin_splitter_and_selectors_through_wasm() {
    let lines: Vec<String> = (0..10).map(|i| format!("sample-{i}")).collect();
    let ratio = load::<SplitterKind>(&reference("builtin:ratio-split", serde_json::json!({"trainProb": 0.8}))).unwrap();
    let assignments = ratio.split(SampleBatch::from_lines(0, &lines).unwrap()).unwrap();
    assert_eq!(assignments.counts(), (8, 2, 0));
    // Counted over the job's stream: samples 0 and 5 go to eval, and a batch of one that starts
    // at sequence number 1 trains (Sedna's per-batch rule would send it to eval).
    let eval: Vec<usize> = (0..10).filter(|i| assignments.get(*i) == Assignment::Eval).collect();
    assert_eq!(eval, [0, 5]);
    let one = ratio.split(SampleBatch::from_lines(1, &lines[1..2]).unwrap()).unwrap();
    assert_eq!(one.get(0), Assignment::Train);
    let per_batch =
        load::<SplitterKind>(&reference("builtin:ratio-split", serde_json::json!({"trainProb": 0.8, "mode": "batch"})))
            .unwrap();
    let sedna = per_batch.split(SampleBatch::from_lines(0, &lines).unwrap()).unwrap();
    assert_eq!((sedna.get(7), sedna.get(8)), (Assignment::Train, Assignment::Eval));
    assert_eq!(per_batch.split(SampleBatch::from_lines(1, &lines[1..2]).unwrap()).unwrap().get(0), Assignment::Eval);

    // Hash mode reads the lines (fetched lazily by the SDK) and does not depend on batching.
    let hash =
        load::<SplitterKind>(&reference("builtin:ratio-split", serde_json::json!({"trainProb": 0.5, "mode": "hash"})))
            .unwrap();
    let whole = hash.split(SampleBatch::from_lines(0, &lines).unwrap()).unwrap().to_vec();
    let mut halves = hash.split(SampleBatch::from_lines(0, &lines[..4]).unwrap()).unwrap().to_vec();
    halves.extend(hash.split(SampleBatch::from_lines(4, &lines[4..]).unwrap()).unwrap().to_vec());
    assert_eq!(whole, halves);
    assert!(hash.split(SampleBatch::new(0)).unwrap().is_empty());

    let model = |url: &str, accuracy: f64| ModelInfo {
        url: url.into(),
        format: "pkl".into(),
        metrics: [("accuracy".to_owned(), accuracy)].into(),
    };
    let candidates = [model("/out/eval/1/a.pkl", 0.7), model("/out/eval/1/b.pkl", 0.9)];
    let first = load::<SelectorKind>(&reference("builtin:first-select", serde_json::json!({}))).unwrap();
    assert_eq!(first.select(None, &candidates).unwrap().deploy, Some(0));
    assert_eq!(first.select(None, &[]).unwrap().deploy, None);
    let best =
        load::<SelectorKind>(&reference("builtin:metric-select", serde_json::json!({"metric": "accuracy"}))).unwrap();
    assert_eq!(best.select(Some(&model("/d", 0.8)), &candidates).unwrap().deploy, Some(1));
    let keep = best.select(Some(&model("/d", 0.95)), &candidates).unwrap();
    assert_eq!(keep.deploy, None);
    assert!(keep.reason.contains("does not beat deployed 0.95"), "{}", keep.reason);
}

#[test]
fn a_policy_of_the_wrong_kind_is_refused_at_load() {
    let err = load::<SplitterKind>(&reference("builtin:threshold-trigger", serde_json::json!({}))).err().unwrap();
    assert_eq!(err.step, Step::Instantiate);
    assert!(err.to_string().contains("is not a splitter policy"), "{err}");
    assert!(err.to_string().contains("perennial:policy/trigger@0.1.0"), "{err}");
}

#[test]
fn a_rejected_config_names_the_step_and_the_field() {
    let err = load::<TriggerKind>(&reference(
        "builtin:threshold-trigger",
        serde_json::json!({"condition": {"operator": "~", "threshold": 1}}),
    ))
    .err()
    .unwrap();
    assert_eq!(err.step, Step::Configure);
    assert!(
        matches!(&err.error, PolicyError::Config(m) if m.starts_with("condition.operator: unknown operator")),
        "{err}"
    );
}

/// After a failed call, the same host serves a healthy call, and the failed policy itself
/// answers again from a fresh instance.
fn assert_recovers(policy: &perennial_policy::TriggerPolicy) {
    assert!(sedna_trigger().decide(&stats(501)).unwrap().train);
    let again = policy.decide(&stats(1)).unwrap();
    assert!(again.train && again.reason == "ok", "{again:?}");
}

#[test]
fn an_infinite_loop_is_stopped_at_its_deadline() {
    let (policy, events) = hostile(serde_json::json!({"behaviour": "loop", "onlyWhen": 13}));
    let started = Instant::now();
    let err = policy.decide(&stats(13)).unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err, PolicyError::Timeout { ms: 100 });
    assert_eq!(err.to_string(), "timed out after 100 ms (limits.timeoutMs)");
    assert!(elapsed >= Duration::from_millis(100), "stopped early: {elapsed:?}");
    // The deadline is precise to one epoch tick; the margin is for a loaded CI machine.
    assert!(elapsed < Duration::from_millis(1000), "{elapsed:?}");
    assert!(events.lines().iter().any(|(level, line)| *level == Level::Error && line.contains("timed out")));
    assert_recovers(&policy);
}

#[test]
fn a_plugin_that_waits_on_the_host_is_stopped_not_hung() {
    let (policy, _) = hostile(serde_json::json!({"behaviour": "sleep", "onlyWhen": 13}));
    let started = Instant::now();
    let err = policy.decide(&stats(13)).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(matches!(&err, PolicyError::Trap(m) if m.contains("policies may not wait")), "{err}");
    assert_recovers(&policy);
}

#[test]
fn a_start_slower_than_a_call_has_a_deadline_of_its_own() {
    let bytes = std::fs::read(plugin_path("hostile-trigger")).unwrap();
    let slow = |start_timeout_ms| {
        let mut r =
            reference(&plugin_path("hostile-trigger"), serde_json::json!({"behaviour": "ok", "configureMs": 150}));
        r.limits.timeout_ms = 20;
        r.limits.start_timeout_ms = start_timeout_ms;
        host().load_bytes::<TriggerKind>(&r.validate().unwrap(), &bytes, Arc::new(Events::default()))
    };
    // A 150 ms start within startTimeoutMs: loaded, though each call has 20 ms.
    let policy = slow(2000).unwrap();
    assert!(policy.decide(&stats(1)).unwrap().train);
    // The same start beyond it: refused, naming the limit.
    let err = slow(60).err().unwrap();
    assert_eq!(err, LoadError::new(Step::Configure, PolicyError::StartTimeout { ms: 60 }));
}

#[test]
fn a_loop_in_configure_fails_the_load_at_configure() {
    let events = Arc::new(Events::default());
    let mut r = reference(&plugin_path("hostile-trigger"), serde_json::json!({"behaviour": "loop-in-configure"}));
    r.limits.start_timeout_ms = 50;
    let bytes = std::fs::read(plugin_path("hostile-trigger")).unwrap();
    // Compiled first (a well-behaved load), so that the time below is the start's alone.
    let host = host();
    let ok = reference(&plugin_path("hostile-trigger"), serde_json::json!({"behaviour": "ok"}));
    host.load_bytes::<TriggerKind>(&ok.validate().unwrap(), &bytes, events.clone()).unwrap();
    let started = Instant::now();
    let err = host.load_bytes::<TriggerKind>(&r.validate().unwrap(), &bytes, events).err().unwrap();
    assert_eq!(err, LoadError::new(Step::Configure, PolicyError::StartTimeout { ms: 50 }));
    assert_eq!(
        err.to_string(),
        "loading the policy failed at step `configure`: did not start within 50 ms (limits.startTimeoutMs)"
    );
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}

#[test]
fn a_memory_bomb_hits_the_cap_named_in_the_error() {
    // The cap, not the clock: 32 MiB of allocations may take over the default 100 ms of a call
    // on a loaded machine (CI's, with the suite beside it).
    let mut bomb =
        reference(&plugin_path("hostile-trigger"), serde_json::json!({"behaviour": "alloc", "onlyWhen": 13}));
    bomb.limits.timeout_ms = 2_000;
    let (policy, _) = hostile_from(bomb);
    let started = Instant::now();
    let err = policy.decide(&stats(13)).unwrap_err();
    assert_eq!(err, PolicyError::Memory { mib: 32 });
    assert_eq!(err.to_string(), "exceeded its memory limit of 32 MiB (limits.memoryMiB)");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_recovers(&policy);
}

#[test]
fn a_panic_is_reported_with_its_message() {
    let (policy, events) = hostile(serde_json::json!({"behaviour": "panic", "onlyWhen": 13}));
    let err = policy.decide(&stats(13)).unwrap_err();
    match &err {
        PolicyError::Panic(message) => {
            assert!(message.starts_with("hostile plugin panics on purpose (at "), "{message}")
        }
        other => panic!("expected a panic, got {other:?}"),
    }
    assert!(events.lines().iter().any(|(_, line)| line.contains("stderr:") && line.contains("panicked")));
    assert_recovers(&policy);
}

#[test]
fn a_plugin_cannot_read_files_open_sockets_or_see_the_environment() {
    let (reader, _) = hostile(serde_json::json!({"behaviour": "read-file"}));
    let answer = reader.decide(&stats(1)).unwrap();
    assert!(!answer.train, "{answer:?}");
    assert!(answer.reason.starts_with("read-file denied: "), "{answer:?}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (connector, _) = hostile(serde_json::json!({"behaviour": "connect", "address": address}));
    let answer = connector.decide(&stats(1)).unwrap();
    assert!(!answer.train, "{answer:?}");
    assert!(answer.reason.starts_with("connect denied: "), "{answer:?}");
    assert_eq!(listener.accept().unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "nothing connected");

    // SAFETY (edition 2024 marks set_var unsafe): tests in this file do not read this variable.
    unsafe { std::env::set_var("PERENNIAL_TEST_SECRET", "should-not-leak") };
    let (env, _) = hostile(serde_json::json!({"behaviour": "env"}));
    assert_eq!(env.decide(&stats(1)).unwrap().reason, "0 environment variables");
}

#[test]
fn logs_and_output_are_attributed_and_capped() {
    // The cap is checked here, not the time limit: 100,000 log calls can take longer than the
    // default 100 ms on a loaded machine.
    let mut flooding = reference(&plugin_path("hostile-trigger"), serde_json::json!({"behaviour": "log-flood"}));
    flooding.limits.timeout_ms = 2_000;
    let (flood, events) = hostile_from(flooding);
    assert_eq!(flood.decide(&stats(1)).unwrap().reason, "flooded");
    let lines = events.lines();
    assert_eq!(lines.iter().filter(|(l, m)| *l == Level::Info && m.starts_with("line ")).count(), 100);
    assert!(lines.iter().any(|(l, m)| *l == Level::Warn && m == "99900 more log lines dropped (limit 100 per call)"));

    let (printer, events) = hostile(serde_json::json!({"behaviour": "print"}));
    printer.decide(&stats(1)).unwrap();
    let lines = events.lines();
    assert!(lines.contains(&(Level::Info, "stdout: hello from stdout".into())), "{lines:?}");
    assert!(lines.contains(&(Level::Warn, "stderr: hello from stderr".into())), "{lines:?}");
}

#[test]
fn wrong_answers_are_errors_not_panics() {
    let splitter = |behaviour: &str| {
        let path = plugin_path("hostile-splitter");
        let valid = reference(&path, serde_json::json!({"behaviour": behaviour})).validate().unwrap();
        host().load_bytes::<SplitterKind>(&valid, &std::fs::read(&path).unwrap(), Arc::new(Events::default())).unwrap()
    };
    let batch = || SampleBatch::from_lines(0, &["a", "b", "c"]).unwrap();
    assert_eq!(
        splitter("wrong-length").split(batch()).unwrap_err(),
        PolicyError::BadAnswer("split returned 2 assignments for 3 samples".into())
    );
    assert_eq!(
        splitter("bad-byte").split(batch()).unwrap_err(),
        PolicyError::BadAnswer("split returned 7 for sample 0, which is no assignment (0, 1 or 2)".into())
    );
    assert_eq!(splitter("all-skip").split(batch()).unwrap().counts(), (0, 0, 3));

    let path = plugin_path("hostile-selector");
    let valid = reference(&path, serde_json::json!({})).validate().unwrap();
    let selector =
        host().load_bytes::<SelectorKind>(&valid, &std::fs::read(&path).unwrap(), Arc::new(Events::default())).unwrap();
    let candidates = [ModelInfo::default(), ModelInfo::default()];
    assert_eq!(
        selector.select(None, &candidates).unwrap_err(),
        PolicyError::BadAnswer("select chose candidate 2 of 2".into())
    );
    assert!(sedna_trigger().decide(&stats(501)).unwrap().train, "the host carries on");
}

#[test]
fn the_digest_is_checked_and_remote_plugins_need_one() {
    let path = plugin_path("hostile-selector");
    let bytes = std::fs::read(&path).unwrap();
    let mut wrong = reference(&format!("file://{path}"), serde_json::json!({}));
    wrong.sha256 = Some("00".repeat(32));
    let err = host()
        .load_bytes::<SelectorKind>(&wrong.validate().unwrap(), &bytes, Arc::new(Events::default()))
        .err()
        .unwrap();
    assert_eq!(err.step, Step::Verify);
    assert!(err.to_string().contains("but the reference says 0000"), "{err}");

    let mut remote = reference("https://plugins.example.org/p.wasm", serde_json::json!({}));
    assert!(remote.validate().unwrap_err().starts_with("sha256: required for a remote plugin"));
    remote.sha256 = Some("ab".repeat(32));
    assert!(remote.validate().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_fetches_a_file_plugin_and_reports_a_missing_one() {
    let path = plugin_path("count-or-age-trigger");
    let bytes = std::fs::read(&path).unwrap();
    let digest = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    let mut r = reference(&format!("file://{path}"), serde_json::json!({"samples": 3, "maxAgeHours": 1}));
    r.sha256 = Some(digest.clone());
    let policy = host().load::<TriggerKind>(&r, Arc::new(Events::default())).await.unwrap();
    assert_eq!(policy.info().digest, digest);
    assert!(policy.decide(&stats(3)).unwrap().train);

    let missing = host()
        .load::<TriggerKind>(&reference("/nonexistent/plugin.wasm", serde_json::json!({})), Arc::new(Events::default()))
        .await
        .err()
        .unwrap();
    assert_eq!(missing.step, Step::Fetch);
    assert!(missing.to_string().contains("/nonexistent/plugin.wasm"), "{missing}");
}

#[test]
fn hot_swap_under_concurrent_calls_loses_no_call_and_never_mixes() {
    let bytes = builtin::component("ratio-split").unwrap();
    let events: Arc<dyn PolicyEvents> = Arc::new(Events::default());
    let host = host();
    let old_ref = reference("builtin:ratio-split", serde_json::json!({"trainProb": 1.0})).validate().unwrap();
    let slot = Arc::new(PolicySlot::new(host.load_bytes::<SplitterKind>(&old_ref, bytes, events.clone()).unwrap()));
    let lines: Arc<Vec<String>> = Arc::new((0..1000).map(|i| format!("line {i}")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));

    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (slot, lines, stop, calls) = (slot.clone(), lines.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let (mut old, mut new) = (0usize, 0usize);
                while !stop.load(Ordering::Relaxed) {
                    let counts = slot.current().split(SampleBatch::from_lines(0, &lines).unwrap()).unwrap().counts();
                    calls.fetch_add(1, Ordering::Relaxed);
                    match counts {
                        (1000, 0, 0) => {
                            assert_eq!(new, 0, "an old answer after a new one");
                            old += 1;
                        }
                        (0, 0, 1000) => new += 1,
                        mixed => panic!("one call mixed two policies: {mixed:?}"),
                    }
                }
                (old, new)
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(150));
    // A failed preparation leaves the old policy serving.
    let bad =
        reference(&plugin_path("hostile-splitter"), serde_json::json!({"behaviour": "nonsense"})).validate().unwrap();
    let hostile_bytes = std::fs::read(plugin_path("hostile-splitter")).unwrap();
    let err = host.load_bytes::<SplitterKind>(&bad, &hostile_bytes, events.clone()).err().unwrap();
    assert_eq!(err.step, Step::Configure);
    std::thread::sleep(Duration::from_millis(50));
    // A good one replaces it between two calls.
    let good =
        reference(&plugin_path("hostile-splitter"), serde_json::json!({"behaviour": "all-skip"})).validate().unwrap();
    let next = host.load_bytes::<SplitterKind>(&good, &hostile_bytes, events).unwrap();
    let calls_at_swap = calls.load(Ordering::Relaxed);
    slot.commit(next);
    std::thread::sleep(Duration::from_millis(150));
    stop.store(true, Ordering::Relaxed);

    let (mut old, mut new) = (0, 0);
    for worker in workers {
        let (o, n) = worker.join().expect("no call failed or mixed");
        old += o;
        new += n;
    }
    assert_eq!(old + new, calls.load(Ordering::Relaxed), "every call answered");
    assert!(old >= calls_at_swap && old > 0 && new > 0, "old {old}, new {new}, at swap {calls_at_swap}");
    assert_eq!(slot.current().info().source, plugin_path("hostile-splitter"));
}

#[test]
fn corrupt_and_foreign_cache_entries_are_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let events: Arc<dyn PolicyEvents> = Arc::new(Events::default());
    let trigger_ref =
        reference("builtin:threshold-trigger", serde_json::json!({"condition": {"operator": ">", "threshold": 500}}))
            .validate()
            .unwrap();
    let select_ref = reference("builtin:first-select", serde_json::json!({})).validate().unwrap();
    let trigger_bytes = builtin::component("threshold-trigger").unwrap();
    let select_bytes = builtin::component("first-select").unwrap();
    let fresh_host = || PolicyHost::new(Some(dir.path().to_path_buf()), None).unwrap();

    let first = fresh_host().load_bytes::<TriggerKind>(&trigger_ref, trigger_bytes, events.clone()).unwrap();
    assert!(!first.info().from_cache);
    let entry = fresh_host().disk_cache_path(&first.info().digest).unwrap();
    assert!(entry.exists());
    let cached = fresh_host().load_bytes::<TriggerKind>(&trigger_ref, trigger_bytes, events.clone()).unwrap();
    assert!(cached.info().from_cache, "a new host reads the disk cache");

    // Corrupt: flip bytes in the middle of the compiled code.
    let mut data = std::fs::read(&entry).unwrap();
    let middle = data.len() / 2;
    for byte in &mut data[middle..middle + 64] {
        *byte ^= 0xff;
    }
    std::fs::write(&entry, &data).unwrap();
    let recovered = fresh_host().load_bytes::<TriggerKind>(&trigger_ref, trigger_bytes, events.clone()).unwrap();
    assert!(!recovered.info().from_cache, "a corrupt entry is not trusted");
    assert!(recovered.decide(&stats(501)).unwrap().train);
    assert!(
        fresh_host().load_bytes::<TriggerKind>(&trigger_ref, trigger_bytes, events.clone()).unwrap().info().from_cache
    );

    // Truncated.
    std::fs::write(&entry, &data[..100]).unwrap();
    let recovered = fresh_host().load_bytes::<TriggerKind>(&trigger_ref, trigger_bytes, events.clone()).unwrap();
    assert!(!recovered.info().from_cache);

    // Foreign: a sound entry of another component under this digest's name.
    let other = fresh_host().load_bytes::<SelectorKind>(&select_ref, select_bytes, events.clone()).unwrap();
    let other_entry = fresh_host().disk_cache_path(&other.info().digest).unwrap();
    std::fs::copy(&other_entry, &entry).unwrap();
    let recovered = fresh_host().load_bytes::<TriggerKind>(&trigger_ref, trigger_bytes, events.clone()).unwrap();
    assert!(!recovered.info().from_cache, "an entry of another component is not used");
    assert!(recovered.decide(&stats(501)).unwrap().train);
}

/// `perennial decisions` records a call's own time: a fresh instance's start (after an idle one
/// was dropped) is not in it.
#[test]
fn a_calls_time_leaves_out_the_start_of_a_fresh_instance() {
    let (policy, _) = hostile(serde_json::json!({"behaviour": "ok", "configureMs": 200}));
    policy.reset(); // as the agent drops an idle job's instances
    let started = Instant::now();
    assert!(policy.decide(&stats(1)).unwrap().train);
    let whole = started.elapsed();
    assert!(whole >= Duration::from_millis(200), "the call started a fresh instance first: {whole:?}");
    let call = Duration::from_micros(policy.last_call_micros());
    assert!(call < Duration::from_millis(100), "the call alone took {call:?} of {whole:?}");
    // A warm call: its own time again, and a new one each call.
    assert!(policy.decide(&stats(1)).unwrap().train);
    assert!(Duration::from_micros(policy.last_call_micros()) < Duration::from_millis(100));
}
