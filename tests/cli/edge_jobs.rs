//! `perennial edge --jobs FILE` (a node with no cloud) given a job whose policy cannot load: that
//! job is stopped and says why on its status, the node's other jobs run on; a file of which no
//! job can run is refused at once, naming the job and its plugin (and so is a file of no job); a
//! compile cache that keeps nothing costs a warning, not the policies.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::embedded::{dies_with_its_test, wait_exit};

/// A job of `name` on its own index, its trigger `trigger`.
fn job(root: &Path, name: &str, trigger: &str) -> serde_json::Value {
    let index = root.join(format!("data/{name}/index.txt"));
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    let samples: String = (0..20).map(|i| format!("images/{i:08}.jpg {}\n", i % 5)).collect();
    std::fs::write(&index, samples).unwrap();
    serde_json::json!({
        "name": format!("default/{name}"),
        "uid": format!("uid-{name}"),
        "spec": {"datasetUrl": index, "datasetFormat": "txt", "outputDir": root.join(format!("out/{name}")),
                 "trainProb": 0.8},
        "trigger": {"plugin": trigger, "config": {"checkPeriodSeconds": 1,
                    "condition": {"operator": ">=", "threshold": 1000}}}
    })
}

fn edge(root: &Path, jobs: &serde_json::Value) -> Command {
    std::fs::write(root.join("jobs.json"), jobs.to_string()).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_perennial"));
    dies_with_its_test(&mut command)
        .args(["edge", "--bind-address", "127.0.0.1", "--bind-port", "0", "--poll-ms", "50"])
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--jobs")
        .arg(root.join("jobs.json"))
        .arg("--cache-dir")
        .arg(root.join("cache"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// The samples a job has taken (its split done), as the node's store says.
fn taken(root: &Path, job: &str) -> i64 {
    let Ok(db) = rusqlite::Connection::open(root.join("state/edge.db")) else { return 0 };
    let _ = db.busy_timeout(Duration::from_secs(1));
    db.query_row("SELECT cursor_samples FROM jobs WHERE name = ?1", [job], |r| r.get(0)).unwrap_or(0)
}

/// Waits (up to 60 s) until `job` has taken its 20 samples, the agent running all along.
fn wait_for_samples(root: &Path, job: &str, agent: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while taken(root, job) < 20 {
        assert!(agent.try_wait().unwrap().is_none(), "the agent exited before {job} took its samples");
        assert!(Instant::now() < deadline, "{job} never took its samples");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the agent as its service manager would (SIGTERM): it ends cleanly; its log.
fn stop(mut agent: Child) -> String {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let out = wait_exit(&mut agent, Duration::from_secs(15));
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    log
}

#[test]
fn a_job_whose_policy_cannot_load_stops_alone_and_the_others_run() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("not-built-yet.wasm");
    let jobs = serde_json::json!([
        job(root.path(), "broken", &format!("file://{}", missing.display())),
        job(root.path(), "steady", "builtin:threshold-trigger"),
    ]);
    let mut agent = edge(root.path(), &jobs).spawn().unwrap();
    wait_for_samples(root.path(), "default/steady", &mut agent);
    // Why, on the job's status (what the link reports, and `perennial status` shows).
    let db = rusqlite::Connection::open(root.path().join("state/edge.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let rejected: String = db
        .query_row("SELECT rejected FROM policy_health WHERE job = 'default/broken' AND kind = 'trigger'", [], |r| {
            r.get(0)
        })
        .expect("the broken job's trigger on its status");
    assert!(rejected.contains("no such file") && rejected.contains("not-built-yet.wasm"), "{rejected}");
    let log = stop(agent);
    assert_eq!(log.matches("job default/broken cannot run on this node yet").count(), 1, "said once: {log}");
}

#[test]
fn a_jobs_file_of_which_no_job_can_run_is_refused_naming_the_job_and_plugin() {
    let root = tempfile::tempdir().unwrap();
    let jobs = serde_json::json!([job(root.path(), "broken", "builtin:no-such-policy")]);
    let out = edge(root.path(), &jobs).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("no job of --jobs can run") && log.contains("default/broken"), "{log}");
    assert!(log.contains("no-such-policy"), "{log}");

    // Nor is a file that holds no job at all.
    let out = edge(root.path(), &serde_json::json!([])).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("jobs.json: the list holds no job"), "{log}");

    // Nor a job that brings registry logins of its own (the operator's, from imagePullSecrets).
    let mut forged = job(root.path(), "forged", "builtin:threshold-trigger");
    forged["registryAuth"] = serde_json::json!({"withheld": ["registry.example.org"]});
    let out = edge(root.path(), &serde_json::json!([forged])).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("job default/forged: registryAuth is the operator's"), "{log}");
}

/// The compile cache entries in `cache` (their file names).
fn cache_entries(cache: &Path) -> Vec<String> {
    let names = std::fs::read_dir(cache).map(|dir| dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()));
    names.into_iter().flatten().filter(|name| name.ends_with(".cwasm")).collect()
}

/// A compile cache that keeps nothing (a read-only or full filesystem; here each entry's name is
/// taken by a folder, which even root cannot write over): the policies compile all the same,
/// and the agent says so once.
#[test]
fn a_compile_cache_that_keeps_nothing_still_serves_the_policies() {
    let root = tempfile::tempdir().unwrap();
    let jobs = serde_json::json!([job(root.path(), "steady", "builtin:threshold-trigger")]);
    // A first agent, to learn the names its compiles are kept under.
    let mut first = edge(root.path(), &jobs).spawn().unwrap();
    wait_for_samples(root.path(), "default/steady", &mut first);
    stop(first);
    let entries = cache_entries(&root.path().join("cache"));
    assert!(!entries.is_empty(), "the first agent kept its compiles");

    let second_root = tempfile::tempdir().unwrap();
    for name in &entries {
        std::fs::create_dir_all(second_root.path().join("cache").join(name).join("taken")).unwrap();
    }
    let jobs = serde_json::json!([job(second_root.path(), "steady", "builtin:threshold-trigger")]);
    let mut second = edge(second_root.path(), &jobs).spawn().unwrap();
    wait_for_samples(second_root.path(), "default/steady", &mut second);
    let log = stop(second);
    assert_eq!(log.matches("the compile cache keeps nothing").count(), 1, "said once: {log}");
}

/// Standalone, a job whose policy's registry is not up yet (a node whose network comes up after
/// the agent) is tried again until it is, and then runs; the other jobs run meanwhile.
#[test]
fn a_job_whose_registry_comes_up_late_starts_when_it_does() {
    let _turn = crate::support::moments::heavy_turn();
    let mut registry = crate::support::registry::Registry::start();
    let component = perennial_policy::builtin::built_plugin_path("threshold-trigger").unwrap();
    let reference = format!("{}:v1", registry.reference("policies/trigger"));
    let nobody = tempfile::tempdir().unwrap();
    let pushed = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["plugin", "push", component, &reference])
        .env("DOCKER_CONFIG", nobody.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&pushed.stdout).into_owned();
    assert!(pushed.status.success(), "{printed}{}", String::from_utf8_lossy(&pushed.stderr));
    let sha256 = printed.lines().find_map(|l| l.trim().strip_prefix("sha256 ")).unwrap().trim().to_owned();
    registry.stop();

    let root = tempfile::tempdir().unwrap();
    let mut late = job(root.path(), "late", &reference);
    late["trigger"]["sha256"] = sha256.into();
    let jobs = serde_json::json!([late, job(root.path(), "steady", "builtin:threshold-trigger")]);
    let mut agent = edge(root.path(), &jobs).env("DOCKER_CONFIG", nobody.path()).spawn().unwrap();
    wait_for_samples(root.path(), "default/steady", &mut agent);
    assert_eq!(taken(root.path(), "default/late"), 0, "the late job waits for its registry");
    registry.resume();
    wait_for_samples(root.path(), "default/late", &mut agent);
    let log = stop(agent);
    assert_eq!(log.matches("cannot run on this node yet").count(), 1, "said once: {log}");
    assert!(log.contains("the job came to this node"), "{log}");
}
