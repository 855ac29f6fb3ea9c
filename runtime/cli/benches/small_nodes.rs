//! The edge agent on small nodes: the compiler-free agent against the compiling one.
//! `cargo bench -p perennial --bench small_nodes`, with the compiler-free agent built first:
//!
//!   cargo build --profile edge -p perennial --no-default-features --features edge-precompiled
//!   PERENNIAL_BENCH_COMPILER_FREE=target/edge/perennial cargo bench -p perennial --bench small_nodes
//!
//! Prints: the size of each binary named in `PERENNIAL_BENCH_SIZES` (`name=path,…`: the ARM
//! builds); each agent's RSS idle and with 100 idle jobs (precompiled built-ins); a signed
//! artifact's load time (verify + deserialize + instantiate) for a built-in and a Python policy;
//! a trigger call and a 10,000-sample split natively and on Pulley; the RSS of the
//! compiler-free agent serving one Python policy; and a start on a never-seen Python policy
//! with both agents capped at 128 MiB (a memory cgroup: needs root), where the compiler-free one
//! must serve and the compiling one cannot compile. Needs componentize-py on the PATH.

#[path = "../../../tests/support/plugin_projects.rs"]
mod plugin_projects;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const COMPILING: &str = env!("CARGO_BIN_EXE_perennial");
const CAP_BYTES: u64 = 128 << 20;
const TRIGGER_CONFIG: &str = r#"{"condition": {"operator": ">", "threshold": 500}}"#;
const SPLIT_CONFIG: &str = r#"{"trainProb": 0.8}"#;

fn main() {
    let Some(compiler_free) = std::env::var_os("PERENNIAL_BENCH_COMPILER_FREE").map(PathBuf::from) else {
        eprintln!("set PERENNIAL_BENCH_COMPILER_FREE to the compiler-free agent (see this bench's header)");
        std::process::exit(2);
    };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    run(COMPILING, &["plugin", "keygen", "k"], dir);
    let native = platform(COMPILING, dir);

    println!("== binaries (stripped)");
    for (name, path) in sizes(&compiler_free) {
        let size = std::fs::metadata(&path).map(|meta| meta.len()).unwrap_or(0);
        println!("{name:<28} {:>6.1} MiB  {}", size as f64 / f64::from(1 << 20), path.display());
    }

    println!("== RSS of `perennial edge --jobs` (after 5 s)");
    let builtins = ["threshold-trigger", "ratio-split", "first-select"]
        .map(|name| precompile(dir, &format!("builtin:{name}"), name, &native));
    for (agent, binary) in [("compiler-free", compiler_free.as_path()), ("compiling", Path::new(COMPILING))] {
        for jobs in [0, 100] {
            let jobs_file = jobs_file(dir, &format!("{agent}-{jobs}"), jobs, &builtins);
            let mut child = agent_process(binary, dir, &jobs_file, &format!("{agent}-{jobs}"));
            std::thread::sleep(Duration::from_secs(5));
            println!("{agent:<14} {jobs:>3} idle jobs: {:>6.1} MiB", rss_mib(&child));
            stop(&mut child);
        }
    }

    println!("== a Python policy");
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-authors");
    let project = plugin_projects::new_project(Path::new(COMPILING), dir, "trigger", "python", "py-trigger");
    let python = plugin_projects::build("python", "trigger", &project, "py-trigger", &target);
    let started = Instant::now();
    let python_artifact = precompile(dir, python.to_str().unwrap(), "py_trigger", &native);
    println!("compiled for {native} and signed in {:?} (off the node)", started.elapsed());
    for (what, artifact, platform) in
        [("built-in trigger", &builtins[0].0, native.as_str()), ("Python trigger", &python_artifact.0, native.as_str())]
    {
        let config = if what.starts_with("Python") { r#"{"samples": 3}"# } else { TRIGGER_CONFIG };
        let out = plugin_bench(&compiler_free, artifact, dir, platform, &["--config", config]);
        println!("{what:<18} verify + load: {}", field(&out, "verify + load (precompiled):"));
    }

    println!("== native against Pulley (compiled for pulley64, run on this x86_64)");
    for (name, extra) in [
        ("threshold-trigger", &["--config", TRIGGER_CONFIG][..]),
        (
            "ratio-split",
            &["--config", SPLIT_CONFIG, "--batch", "10000", "--iterations", "200", "--timeout-ms", "10000"][..],
        ),
    ] {
        let on_native = precompile(dir, &format!("builtin:{name}"), name, &native);
        let on_pulley = precompile(dir, &format!("builtin:{name}"), name, "pulley64");
        let native_out = plugin_bench(Path::new(COMPILING), &on_native.0, dir, &native, extra);
        let pulley_out = plugin_bench(Path::new(COMPILING), &on_pulley.0, dir, "pulley64", extra);
        println!("{name:<18} native: {}  |  pulley64: {}", field(&native_out, "call:"), field(&pulley_out, "call:"));
        if name == "ratio-split" {
            println!(
                "{:<18} native: {}  |  pulley64: {}",
                "  throughput",
                field(&native_out, "split throughput:"),
                field(&pulley_out, "split throughput:")
            );
        }
    }

    println!("== serving one Python policy, and a start on it capped at {} MiB", CAP_BYTES >> 20);
    let python_job = jobs_with_trigger(dir, "python-precompiled", &python_artifact, &builtins);
    let mut serving = agent_process(&compiler_free, dir, &python_job, "python-serving");
    std::thread::sleep(Duration::from_secs(8));
    println!("compiler-free, serving the precompiled Python trigger: {:>6.1} MiB", rss_mib(&serving));
    stop(&mut serving);
    let source = (python.clone(), python_artifact.1.clone());
    for (agent, binary, trigger) in
        [("compiler-free", compiler_free.as_path(), &python_artifact), ("compiling", Path::new(COMPILING), &source)]
    {
        let jobs = jobs_with_trigger(dir, &format!("capped-{agent}"), trigger, &builtins);
        let cache = dir.join(format!("cache-capped-{agent}"));
        match capped(binary, dir, &jobs, &cache) {
            Ok((outcome, peak)) => println!("{agent:<14} under the cap: {outcome} (peak {peak:.1} MiB)"),
            Err(why) => println!("{agent:<14} under the cap: not measured ({why})"),
        }
    }
}

fn run(binary: impl AsRef<std::ffi::OsStr>, args: &[&str], dir: &Path) -> String {
    let out = Command::new(binary).args(args).current_dir(dir).env("RUST_LOG", "warn").output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn platform(binary: &str, dir: &Path) -> String {
    let out = run(binary, &["plugin", "platform"], dir);
    out.lines().find_map(|line| line.strip_prefix("platform:")).unwrap().trim().to_owned()
}

fn sizes(compiler_free: &Path) -> Vec<(String, PathBuf)> {
    let mut all = vec![("compiler-free (this run)".to_owned(), compiler_free.to_path_buf())];
    if let Ok(list) = std::env::var("PERENNIAL_BENCH_SIZES") {
        for entry in list.split(',').filter(|entry| !entry.is_empty()) {
            if let Some((name, path)) = entry.split_once('=') {
                all.push((name.to_owned(), PathBuf::from(path)));
            }
        }
    }
    all
}

/// Compiles `plugin` for `platform` (with the compiling binary); the file and the pin.
fn precompile(dir: &Path, plugin: &str, stem: &str, platform: &str) -> (PathBuf, String) {
    let out = run(COMPILING, &["plugin", "compile", plugin, "--target", platform, "--sign-key", "k.key"], dir);
    let pin = out.lines().find_map(|line| line.rsplit_once("pin): ")).unwrap().1.to_owned();
    (dir.join(format!("{stem}.{platform}.pcwasm")), pin)
}

fn jobs_file(dir: &Path, name: &str, count: usize, builtins: &[(PathBuf, String); 3]) -> PathBuf {
    let jobs: Vec<serde_json::Value> =
        (0..count).map(|i| job(dir, &format!("{name}-{i}"), &builtins[0], builtins)).collect();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string(&jobs).unwrap()).unwrap();
    path
}

fn jobs_with_trigger(
    dir: &Path,
    name: &str,
    trigger: &(PathBuf, String),
    builtins: &[(PathBuf, String); 3],
) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string(&[job(dir, name, trigger, builtins)]).unwrap()).unwrap();
    path
}

/// An idle job (its dataset never grows) whose trigger is asked every second.
fn job(dir: &Path, name: &str, trigger: &(PathBuf, String), builtins: &[(PathBuf, String); 3]) -> serde_json::Value {
    let data = dir.join("data").join(name);
    std::fs::create_dir_all(&data).unwrap();
    let policy = |(path, pin): &(PathBuf, String)| serde_json::json!({"plugin": path, "sha256": pin});
    let mut trigger_ref = policy(trigger);
    // The built-in threshold trigger's config, or a `plugin new` Python trigger's.
    let python = trigger.0.to_string_lossy().contains("py_trigger");
    trigger_ref["config"] = if python {
        serde_json::json!({"samples": 1_000_000})
    } else {
        serde_json::json!({"checkPeriodSeconds": 1, "condition": {"operator": ">", "threshold": 1_000_000}})
    };
    let mut splitter = policy(&builtins[1]);
    splitter["config"] = serde_json::json!({"trainProb": 0.8});
    serde_json::json!({
        "name": format!("default/{name}"), "uid": format!("uid-{name}"),
        "spec": {"datasetUrl": data.join("index.txt"), "datasetFormat": "txt", "outputDir": data.join("out"), "trainProb": 0.8},
        "splitter": splitter, "trigger": trigger_ref, "selector": policy(&builtins[2]),
    })
}

fn agent_process(binary: &Path, dir: &Path, jobs: &Path, name: &str) -> Child {
    Command::new(binary)
        .args(["edge", "--bind-port", "0", "--trust-key", "k.pub", "--jobs"])
        .arg(jobs)
        .arg("--state-dir")
        .arg(dir.join("state").join(name))
        .arg("--cache-dir")
        .arg(dir.join("cache").join(name))
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn rss_mib(child: &Child) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    kib(&status, "VmRSS:") as f64 / 1024.0
}

fn kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or(0)
}

/// `plugin bench` of an artifact, on `platform` (Pulley when it names it).
fn plugin_bench(binary: &Path, artifact: &Path, dir: &Path, platform: &str, extra: &[&str]) -> String {
    let mut command = Command::new(binary);
    command.args(["plugin", "bench"]).arg(artifact).args(["--trust-key", "k.pub"]).args(extra).current_dir(dir);
    if platform.starts_with("pulley") {
        command.env("PERENNIAL_POLICY_PLATFORM", platform);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "plugin bench {}: {}", artifact.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn field(out: &str, prefix: &str) -> String {
    out.lines()
        .find_map(|line| line.trim_start().strip_prefix(prefix).map(|rest| rest.trim().to_owned()))
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{out}"))
}

/// Starts the agent in a memory cgroup of 128 MiB and waits (60 s at most) for its job's first
/// trigger decision, or its refusal: what happened, and the cgroup's peak.
fn capped(binary: &Path, dir: &Path, jobs: &Path, cache: &Path) -> Result<(String, f64), String> {
    let group = PathBuf::from(format!("/sys/fs/cgroup/memory/perennial-bench-{}", std::process::id()));
    std::fs::create_dir(&group).map_err(|err| format!("a memory cgroup: {err}"))?;
    let result = (|| {
        std::fs::write(group.join("memory.limit_in_bytes"), CAP_BYTES.to_string()).map_err(|err| err.to_string())?;
        let _ = std::fs::write(group.join("memory.memsw.limit_in_bytes"), CAP_BYTES.to_string());
        let state = dir.join("state").join(cache.file_name().unwrap());
        let log_path = dir.join(format!("{}.log", cache.file_name().unwrap().to_string_lossy()));
        let mut command = Command::new(binary);
        command
            .args(["edge", "--bind-port", "0", "--trust-key", "k.pub", "--jobs"])
            .arg(jobs)
            .arg("--state-dir")
            .arg(&state)
            .arg("--cache-dir")
            .arg(cache)
            .current_dir(dir)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).map_err(|err| err.to_string())?);
        let procs = group.join("cgroup.procs");
        use std::os::unix::process::CommandExt as _;
        // SAFETY: between fork and exec only write(2) into an already-open file.
        let file = std::fs::OpenOptions::new().write(true).open(&procs).map_err(|err| err.to_string())?;
        unsafe {
            use std::os::fd::AsRawFd as _;
            let fd = file.as_raw_fd();
            command.pre_exec(move || {
                let pid = b"0\n";
                if libc::write(fd, pid.as_ptr().cast(), pid.len()) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|err| err.to_string())?;
        let started = Instant::now();
        // Standalone, the agent loads every job's policies before it opens its worker API.
        let outcome = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("worker report API on") {
                break format!("serving after {:.1?}", started.elapsed());
            }
            if let Some(line) = log.lines().find(|line| line.contains("cannot run on this node")) {
                break format!("refused after {:.1?}: {}", started.elapsed(), line.trim());
            }
            if let Ok(Some(status)) = child.try_wait() {
                break format!(
                    "ended after {:.1?} ({status}): {}",
                    started.elapsed(),
                    log.lines().last().unwrap_or("")
                );
            }
            if started.elapsed() > Duration::from_secs(90) {
                break "not serving after 90 s".to_owned();
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        stop(&mut child);
        let peak = std::fs::read_to_string(group.join("memory.max_usage_in_bytes"))
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or(0) as f64
            / f64::from(1 << 20);
        Ok((outcome, peak))
    })();
    let _ = std::fs::remove_dir(&group);
    result
}
