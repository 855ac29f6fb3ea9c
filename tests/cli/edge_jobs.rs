//! `perennial edge --jobs FILE` (a node with no cloud) given a job whose policy cannot load: that
//! job is stopped and says why on its status, the node's other jobs run on; a file of which no
//! job can run is refused at once, naming the job and its plugin.

use std::path::Path;
use std::process::{Command, Stdio};
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

#[test]
fn a_job_whose_policy_cannot_load_stops_alone_and_the_others_run() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("not-built-yet.wasm");
    let jobs = serde_json::json!([
        job(root.path(), "broken", &format!("file://{}", missing.display())),
        job(root.path(), "steady", "builtin:threshold-trigger"),
    ]);
    let mut agent = edge(root.path(), &jobs).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while taken(root.path(), "default/steady") < 20 {
        assert!(agent.try_wait().unwrap().is_none(), "the agent exited over another job's policy");
        assert!(Instant::now() < deadline, "the steady job never took its samples");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Why, on the job's status (what the link reports, and `perennial status` shows).
    let db = rusqlite::Connection::open(root.path().join("state/edge.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let rejected: String = db
        .query_row("SELECT rejected FROM policy_health WHERE job = 'default/broken' AND kind = 'trigger'", [], |r| {
            r.get(0)
        })
        .expect("the broken job's trigger on its status");
    assert!(rejected.contains("no such file") && rejected.contains("not-built-yet.wasm"), "{rejected}");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let out = wait_exit(&mut agent, Duration::from_secs(15));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
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
}
