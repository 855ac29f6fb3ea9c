//! Plugin authors' components, made as `perennial plugin new` makes them and built with each
//! language's own tools: `cargo bench -p perennial --bench authors`.
//!
//! Per language (a trigger): the component's size, its cold compile time and the compiling
//! process's peak memory, a call's time (`perennial plugin bench`); then the RSS of a
//! `perennial run` serving one Python policy, and the longest gap in another job's decisions
//! while a job swaps to a Python policy that was never compiled (3 times, a fresh cache each).
//! Needs componentize-py and npm on the PATH (as the tests do).

#[path = "../../../tests/support/plugin_projects.rs"]
mod plugin_projects;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const PERENNIAL: &str = env!("CARGO_BIN_EXE_perennial");

fn main() {
    let root = tempfile::tempdir().unwrap();
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-authors");
    let mut python = PathBuf::new();
    println!("{:<8} {:>9} {:>14} {:>17} {:>12}", "language", "size", "cold compile", "compile peak RSS", "call median");
    for lang in ["rust", "python", "js"] {
        let name = format!("{lang}-trigger");
        let dir = plugin_projects::new_project(Path::new(PERENNIAL), root.path(), "trigger", lang, &name);
        let wasm = plugin_projects::build(lang, "trigger", &dir, &name, &target);
        let size = std::fs::metadata(&wasm).unwrap().len();
        let (out, peak_kib) = measured(
            Command::new(PERENNIAL)
                .args(["plugin", "bench", wasm.to_str().unwrap(), "--config", r#"{"samples": 3}"#])
                .args(["--memory-mib", "128", "--iterations", "2000", "--no-cache"]),
        );
        let field = |prefix: &str| {
            out.lines()
                .find_map(|line| line.trim_start().strip_prefix(prefix).map(|rest| rest.trim().to_owned()))
                .unwrap_or_else(|| panic!("no {prefix:?} in:\n{out}"))
        };
        let call = field("call: median");
        let call = call.split(',').next().unwrap_or_default().trim();
        println!(
            "{lang:<8} {:>7.1}MB {:>14} {:>14.0}MiB {:>12}",
            size as f64 / 1e6,
            field("compile (cold):"),
            peak_kib as f64 / 1024.0,
            call
        );
        if lang == "python" {
            python = wasm;
        }
    }
    serving_rss(&python);
    for attempt in 1..=3 {
        let (took, gap) = swap_gap(&python);
        println!(
            "swap to Python #{attempt}: serving after {took:?}; the other job's longest gap between decisions {gap:?}"
        );
    }
}

/// Runs `command` to its end; its stdout, and its peak RSS in KiB (from wait4's rusage).
#[allow(clippy::zombie_processes)] // reaped by wait4 below, which gives the rusage `wait` does not
fn measured(command: &mut Command) -> (String, i64) {
    let child = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid pointers.
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "plugin bench failed:\n{text}");
    (text, usage.ru_maxrss)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

struct Run {
    root: tempfile::TempDir,
    child: std::process::Child,
}

impl Run {
    fn start(jobs: &[(&str, Option<&str>)]) -> Run {
        let root = tempfile::tempdir().unwrap();
        let (manifests, state) = (root.path().join("jobs"), root.path().join("state"));
        std::fs::create_dir_all(&manifests).unwrap();
        for (name, policy) in jobs {
            std::fs::write(manifests.join(format!("{name}.yaml")), plugin_projects::never_training_job(name, *policy))
                .unwrap();
            std::fs::create_dir_all(state.join(format!("data/{name}"))).unwrap();
            std::fs::write(state.join(format!("data/{name}/index.txt")), "").unwrap();
        }
        let child = Command::new(PERENNIAL)
            .arg("run")
            .arg(&manifests)
            .arg("--state-dir")
            .arg(&state)
            .env("PERENNIAL_CACHE_DIR", root.path().join("cache"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Run { root, child }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn batches(&self, job: &str) -> i64 {
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
        let Ok(db) = rusqlite::Connection::open_with_flags(self.path("state/edge.db"), flags) else { return 0 };
        let _ = db.busy_timeout(Duration::from_millis(200));
        db.query_row("SELECT COUNT(*) FROM batches WHERE job = ?1", [job], |r| r.get(0)).unwrap_or(0)
    }

    fn trigger_digest(&self, job: &str) -> Option<String> {
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
        let db = rusqlite::Connection::open_with_flags(self.path("state/edge.db"), flags).ok()?;
        let _ = db.busy_timeout(Duration::from_millis(200));
        db.query_row("SELECT digest FROM policy_health WHERE job = ?1 AND kind = 'trigger'", [job], |r| r.get(0)).ok()
    }

    /// Appends a sample to `job`'s index every 10 ms until the flag drops.
    fn feed(&self, job: &str) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let feeding = Arc::new(AtomicBool::new(true));
        let (flag, index) = (feeding.clone(), self.path(&format!("state/data/{job}/index.txt")));
        let feeder = std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new().append(true).open(index).unwrap();
            let mut n = 0;
            while flag.load(Ordering::Relaxed) {
                let _ = writeln!(file, "sample {n}");
                n += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        (feeding, feeder)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

/// The RSS of a `perennial run` whose one job is served by the Python trigger, idle and deciding.
fn serving_rss(python: &Path) {
    let policy = format!(
        "{{plugin: \"file://{}\", config: {{samples: 1000000}}, limits: {{memoryMiB: 128}}}}",
        python.display()
    );
    let run = Run::start(&[("py", Some(&policy))]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while run.trigger_digest("default/py").is_none() {
        assert!(Instant::now() < deadline, "the Python policy never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let idle = rss_mib(run.child.id());
    let (feeding, feeder) = run.feed("py");
    std::thread::sleep(Duration::from_secs(3));
    let deciding = rss_mib(run.child.id());
    feeding.store(false, Ordering::Relaxed);
    feeder.join().unwrap();
    println!(
        "perennial run serving one Python trigger: {idle:.1} MiB RSS idle, {deciding:.1} MiB deciding every 10 ms"
    );
}

/// Swaps job `swapping` to the Python trigger (never compiled in this run's cache) while job
/// `steady` gets a sample every 10 ms: how long until it serves, and the longest gap between
/// two of the steady job's committed batches meanwhile.
fn swap_gap(python: &Path) -> (Duration, Duration) {
    let run = Run::start(&[("steady", None), ("swapping", None)]);
    let (feeding, feeder) = run.feed("steady");
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.batches("default/steady") < 50 {
        assert!(Instant::now() < deadline, "the steady job never decided");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = run.trigger_digest("default/swapping");
    let policy =
        format!("{{plugin: \"file://{}\", config: {{samples: 1000}}, limits: {{memoryMiB: 128}}}}", python.display());
    std::fs::write(run.path("jobs/swapping.yaml"), plugin_projects::never_training_job("swapping", Some(&policy)))
        .unwrap();
    let started = Instant::now();
    let (mut count, mut changed, mut longest) = (run.batches("default/steady"), Instant::now(), Duration::ZERO);
    let mut looked = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(120), "the swap never completed");
        let now = run.batches("default/steady");
        if now != count {
            longest = longest.max(changed.elapsed());
            (count, changed) = (now, Instant::now());
        }
        if looked.elapsed() > Duration::from_millis(100) {
            looked = Instant::now();
            if run.trigger_digest("default/swapping") != before {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = started.elapsed();
    feeding.store(false, Ordering::Relaxed);
    feeder.join().unwrap();
    (took, longest.max(changed.elapsed()))
}
