//! `oci://` policies against a real registry (Debian's docker-registry, started here): push and
//! pull by tag and by digest, the refusals (a wrong digest, a tag that moved, a private
//! repository without credentials), and a job in `perennial run` serving an `oci://` policy that
//! outlives its registry going down.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::embedded::{dies_with_its_test, wait_exit};
use crate::support::plugin_projects::never_training_job;
use crate::support::registry::Registry;

fn component(name: &str) -> PathBuf {
    PathBuf::from(perennial_policy::builtin::built_plugin_path(name).expect("a plugin built from plugins/"))
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `perennial ARGS` with `docker_config` as `DOCKER_CONFIG` (never the machine's own).
fn perennial(args: &[&str], docker_config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_perennial")).args(args).env("DOCKER_CONFIG", docker_config).output().unwrap()
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "failed:\nstdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn failed(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "succeeded, unexpectedly:\n{}", String::from_utf8_lossy(&out.stdout));
    stderr
}

/// What `plugin push` printed after `label`.
fn printed(stdout: &str, label: &str) -> String {
    stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix(label).map(|rest| rest.trim().to_owned()))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{stdout}"))
}

fn push(file: &Path, reference: &str, docker_config: &Path) -> (String, String) {
    let stdout = ok(&perennial(&["plugin", "push", file.to_str().unwrap(), reference], docker_config));
    (printed(&stdout, "manifest "), printed(&stdout, "sha256 "))
}

#[test]
fn push_then_pull_by_tag_and_digest_and_the_refusals() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let nobody = dir.path().join("no-docker-config");
    let trigger = component("threshold-trigger");
    let reference = format!("{}:v1", registry.reference("policies/trigger"));

    let (manifest, sha256) = push(&trigger, &reference, &nobody);
    assert_eq!(sha256, sha256_of(&trigger), "the layer is the component");
    assert!(manifest.starts_with("sha256:") && manifest.len() == 71, "{manifest}");

    // By tag, and by the manifest's digest: the same bytes.
    let by_tag = dir.path().join("by-tag.wasm");
    let stdout = ok(&perennial(&["plugin", "pull", &reference, "-o", by_tag.to_str().unwrap()], &nobody));
    assert_eq!(printed(&stdout, "sha256 "), sha256);
    assert_eq!(std::fs::read(&by_tag).unwrap(), std::fs::read(&trigger).unwrap());
    let pinned = format!("{}@{manifest}", registry.reference("policies/trigger"));
    let by_digest = dir.path().join("by-digest.wasm");
    ok(&perennial(&["plugin", "pull", &pinned, "-o", by_digest.to_str().unwrap()], &nobody));
    assert_eq!(std::fs::read(&by_digest).unwrap(), std::fs::read(&trigger).unwrap());
    // The layout other tools read: the CNCF Wasm config and one application/wasm layer.
    let manifest_json = http_get(&registry.address, &format!("/v2/policies/trigger/manifests/{manifest}"));
    assert!(manifest_json.contains("application/vnd.wasm.config.v0+json"), "{manifest_json}");
    assert!(manifest_json.contains("\"application/wasm\""), "{manifest_json}");

    // A wrong digest: refused, naming both, before anything is written.
    let wrong = "0".repeat(64);
    let out = dir.path().join("wrong.wasm");
    let err =
        failed(&perennial(&["plugin", "pull", &reference, "--sha256", &wrong, "-o", out.to_str().unwrap()], &nobody));
    assert!(
        err.contains(&format!("names a component with sha256 {sha256}, but the reference pins sha256 {wrong}")),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");

    // A tag that moved: another component pushed under v1; the old pin is refused.
    let other = component("count-or-age-trigger");
    let (_, moved) = push(&other, &reference, &nobody);
    assert_ne!(moved, sha256);
    let err = failed(&perennial(&["plugin", "pull", &reference, "--sha256", &sha256], &nobody));
    assert!(
        err.contains(&format!("sha256 {moved}, but the reference pins sha256 {sha256} (did the tag move?)")),
        "{err}"
    );
    // ... while the old manifest, by digest, still pulls what it held.
    ok(&perennial(&["plugin", "pull", &pinned, "-o", by_digest.to_str().unwrap()], &nobody));
    assert_eq!(sha256_of(&by_digest), sha256);

    // What is not there, and what is not a reference.
    let err = failed(&perennial(&["plugin", "pull", &registry.reference("policies/absent:v1")], &nobody));
    assert!(err.contains("policies/absent:v1 is not in the registry"), "{err}");
    let err = failed(&perennial(&["plugin", "pull", "oci://host:port/x"], &nobody));
    assert!(err.contains("\"host:port\" is not a registry host"), "{err}");
    // Credentials written into a reference: refused, never echoed.
    let with_login = format!("oci://alice:Secret-9@{}/policies/trigger:v1", registry.address);
    let err = failed(&perennial(&["plugin", "pull", &with_login], &nobody));
    assert!(err.contains("credentials in a reference (USER:PASSWORD@HOST) are refused"), "{err}");
    assert!(!err.contains("alice") && !err.contains("Secret-9"), "{err}");

    // A failed pull leaves the file `-o` names as it was, and no temporary file beside it.
    let kept = dir.path().join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    let existing = kept.join("existing.wasm");
    std::fs::write(&existing, b"the previous component").unwrap();
    let absent = registry.reference("policies/absent:v1");
    failed(&perennial(&["plugin", "pull", &absent, "-o", existing.to_str().unwrap()], &nobody));
    let wrong_pin = ["plugin", "pull", &reference, "--sha256", &wrong, "-o", existing.to_str().unwrap()];
    failed(&perennial(&wrong_pin, &nobody));
    assert_eq!(std::fs::read(&existing).unwrap(), b"the previous component");
    // A successful one replaces it whole.
    ok(&perennial(&["plugin", "pull", &pinned, "-o", existing.to_str().unwrap()], &nobody));
    assert_eq!(sha256_of(&existing), sha256);
    let names: Vec<_> = std::fs::read_dir(&kept).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["existing.wasm"], "no temporary file left");
    // Readable as a pulled file is (0644 when new; an existing file's mode kept), not 0600.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let fresh = dir.path().join("fresh.wasm");
    ok(&perennial(&["plugin", "pull", &pinned, "-o", fresh.to_str().unwrap()], &nobody));
    assert_eq!(mode(&fresh), 0o644, "a new file");
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o640)).unwrap();
    ok(&perennial(&["plugin", "pull", &pinned, "-o", existing.to_str().unwrap()], &nobody));
    assert_eq!(mode(&existing), 0o640, "the mode it had");
    // A job's reference to it needs a pin.
    let err = failed(&perennial(&["plugin", "check", &reference], &nobody));
    assert!(err.contains("sha256: required for a remote plugin") && err.contains("@sha256:"), "{err}");
    // With one, `plugin check` fetches and verifies it.
    let stdout = ok(&perennial(&["plugin", "check", &reference, "--sha256", &moved, "--no-cache"], &nobody));
    assert!(stdout.contains(&moved), "{stdout}");
}

#[test]
fn a_private_repository_needs_the_docker_config_credentials_and_never_shows_them() {
    const PASSWORD: &str = "pw-Never-Shown-7731";
    let registry = Registry::start_private("ann", PASSWORD);
    let dir = tempfile::tempdir().unwrap();
    let nobody = dir.path().join("no-docker-config");
    let ann = registry.docker_config(&dir.path().join("ann"));
    let trigger = component("threshold-trigger");
    let reference = format!("{}:v1", registry.reference("team/private"));

    // Without credentials: refused, saying which repository and where credentials would be.
    let err = failed(&perennial(&["plugin", "push", trigger.to_str().unwrap(), &reference], &nobody));
    assert!(err.contains("refused access to the repository team/private"), "{err}");
    let (_, sha256) = push(&trigger, &reference, &ann);
    let err = failed(&perennial(&["plugin", "pull", &reference], &nobody));
    assert!(err.contains("refused access to the repository team/private"), "{err}");
    assert!(err.contains("no-docker-config/config.json has no credentials for"), "{err}");

    // With them: pulled; even the most detailed log holds no credential.
    let out = dir.path().join("private.wasm");
    let pulled = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["plugin", "pull", &reference, "-o", out.to_str().unwrap()])
        .env("DOCKER_CONFIG", &ann)
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    assert_eq!(printed(&ok(&pulled), "sha256 "), sha256);
    let log = String::from_utf8_lossy(&pulled.stderr);
    use base64::Engine as _;
    let login = base64::engine::general_purpose::STANDARD.encode(format!("ann:{PASSWORD}"));
    assert!(!log.is_empty() && !log.contains(PASSWORD) && !log.contains(&login), "a credential in the log:\n{log}");

    // A wrong password: refused, naming the user and the file, never the password.
    let wrong = dir.path().join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("ann:{PASSWORD}-wrong"));
    std::fs::write(
        wrong.join("config.json"),
        serde_json::json!({"auths": {registry.address.clone(): {"auth": auth}}}).to_string(),
    )
    .unwrap();
    let out = perennial(&["plugin", "pull", &reference], &wrong);
    let err = failed(&out);
    assert!(err.contains("refused the credentials of user \"ann\""), "{err}");
    let all = format!("{err}{}", String::from_utf8_lossy(&out.stdout));
    assert!(!all.contains(PASSWORD) && !all.contains(&auth), "a credential in: {all}");

    // A credential helper named instead: said to be unsupported.
    let helper = dir.path().join("helper");
    std::fs::create_dir_all(&helper).unwrap();
    std::fs::write(helper.join("config.json"), r#"{"auths": {}, "credsStore": "desktop"}"#).unwrap();
    let err = failed(&perennial(&["plugin", "pull", &reference], &helper));
    assert!(
        err.contains("credential helper \"desktop\"") && err.contains("credential helpers are not supported"),
        "{err}"
    );
    assert!(!err.contains("writes them"), "{err}");
}

fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let accept = "application/vnd.oci.image.manifest.v1+json";
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: {accept}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// The job's trigger policy as `perennial status --output json` shows it.
fn trigger_status(state: &Path, job: &str) -> Option<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["status", "--output", "json", "--state-dir"])
        .arg(state)
        .output()
        .ok()?;
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let found = all.as_array()?.iter().find(|j| j["job"] == job)?;
    Some(found["status"]["policies"]["trigger"].clone())
}

fn run_command(manifests: &Path, state: &Path, cache: &Path, docker_config: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perennial"));
    dies_with_its_test(&mut command)
        .arg("run")
        .arg(manifests)
        .arg("--state-dir")
        .arg(state)
        .env("PERENNIAL_CACHE_DIR", cache)
        .env("DOCKER_CONFIG", docker_config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped());
    command
}

fn run(manifests: &Path, state: &Path, cache: &Path, docker_config: &Path) -> std::process::Child {
    run_command(manifests, state, cache, docker_config).stderr(Stdio::piped()).spawn().unwrap()
}

/// `run` logging to `log`, returned once it watches its manifests: it logs its worker API's
/// address after its watch started. An edit saved before that would be read at its start, and a
/// start refuses a policy that cannot load.
fn run_watching(manifests: &Path, state: &Path, cache: &Path, docker_config: &Path, log: &Path) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    let mut child = run_command(manifests, state, cache, docker_config).stderr(file).spawn().unwrap();
    let logged = || std::fs::read_to_string(log).unwrap_or_default();
    wait_for("the run to watch its manifests", Duration::from_secs(60), || {
        if child.try_wait().unwrap().is_some() {
            panic!("the run ended at its start:\n{}", logged());
        }
        logged().contains("worker report API on")
    });
    child
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(mut child: std::process::Child) -> String {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = wait_exit(&mut child, Duration::from_secs(20));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_job_serves_an_oci_policy_by_digest_and_outlives_its_registry() {
    let _turn = crate::support::moments::heavy_turn();
    let mut registry = Registry::start();
    let root = tempfile::tempdir().unwrap();
    let nobody = root.path().join("no-docker-config");
    let (manifests, state, cache) = (root.path().join("jobs"), root.path().join("state"), root.path().join("cache"));
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(state.join("data/oci")).unwrap();
    std::fs::write(state.join("data/oci/index.txt"), "").unwrap();
    let trigger = component("threshold-trigger");
    let reference = format!("{}:v1", registry.reference("policies/trigger"));
    let (_, sha256) = push(&trigger, &reference, &nobody);
    let policy = format!(
        "{{plugin: {reference:?}, sha256: {sha256}, config: {{condition: {{operator: '>=', threshold: 100000000}}}}}}"
    );
    std::fs::write(manifests.join("oci.yaml"), never_training_job("oci", Some(&policy))).unwrap();

    // Served, by the pinned digest.
    let serving = |state: &Path| {
        trigger_status(state, "default/oci")
            .filter(|t| t["plugin"] == reference.as_str() && t["health"] == "Serving")
            .and_then(|t| t["digest"].as_str().map(str::to_owned))
    };
    let first = run(&manifests, &state, &cache, &nobody);
    wait_for("the oci:// policy to serve", Duration::from_secs(90), || {
        serving(&state).as_deref() == Some(sha256.as_str())
    });
    stop(first);

    // The registry goes down; a restart serves the copy kept by digest, and says so once.
    registry.stop();
    let second = run(&manifests, &state, &cache, &nobody);
    wait_for("the kept copy to serve", Duration::from_secs(60), || serving(&state).as_deref() == Some(sha256.as_str()));
    std::thread::sleep(Duration::from_secs(2));
    let log = stop(second);
    let said = log.matches("cannot be reached").count();
    assert_eq!(said, 1, "the registry being down is said once:\n{log}");
    let said = log.lines().find(|line| line.contains("cannot be reached")).unwrap_or_default();
    assert!(said.contains("job=default/oci"), "the job is named: {said}");
    assert!(
        said.contains(&format!("the component it pins (sha256 {sha256}) is served from the copy kept in")),
        "{said}"
    );

    // Without a kept copy (another cache), the start is refused saying why.
    let bare_state = root.path().join("bare-state");
    std::fs::create_dir_all(bare_state.join("data/oci")).unwrap();
    std::fs::write(bare_state.join("data/oci/index.txt"), "").unwrap();
    let mut third = run(&manifests, &bare_state, &root.path().join("empty-cache"), &nobody);
    let out = wait_exit(&mut third, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("fetching {reference}: the registry {} cannot be reached", registry.address))
            && err.contains("and no copy of the component it pins is kept here as pulled from"),
        "{err}"
    );

    // The copy kept in the same cache serves no job that pulled it from nowhere: another
    // repository naming the same digest (a tenant guessing it) is refused while the registry is
    // down, as its own pull would be.
    let (guesser_jobs, guesser_state) = (root.path().join("guesser-jobs"), root.path().join("guesser-state"));
    std::fs::create_dir_all(&guesser_jobs).unwrap();
    std::fs::create_dir_all(guesser_state.join("data/oci")).unwrap();
    std::fs::write(guesser_state.join("data/oci/index.txt"), "").unwrap();
    let elsewhere = format!("{}:v1", registry.reference("elsewhere/trigger"));
    let guess = policy.replace(&reference, &elsewhere);
    std::fs::write(guesser_jobs.join("oci.yaml"), never_training_job("oci", Some(&guess))).unwrap();
    let mut fourth = run(&guesser_jobs, &guesser_state, &cache, &nobody);
    let out = wait_exit(&mut fourth, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the kept copy served another repository's job:\n{err}");
    let repository = elsewhere.trim_start_matches("oci://").trim_end_matches(":v1");
    assert!(
        err.contains(&format!(
            "no copy of the component it pins is kept here as pulled from {repository} by this machine"
        )),
        "{err}"
    );

    // Up again. A tag that moved to other content: the job's edit to it, pinned to what it
    // held, is refused naming both digests, and the policy it had serves on.
    registry.resume();
    let v2 = format!("{}:v2", registry.reference("policies/trigger"));
    let (_, pinned) = push(&component("count-or-age-trigger"), &v2, &nobody);
    let (_, moved) = push(&component("hostile-trigger"), &v2, &nobody);
    let fourth_log = root.path().join("fourth.log");
    let fourth = run_watching(&manifests, &state, &cache, &nobody, &fourth_log);
    wait_for("the policy to serve again", Duration::from_secs(60), || {
        serving(&state).as_deref() == Some(sha256.as_str())
    });
    let policy = format!("{{plugin: {v2:?}, sha256: {pinned}, config: {{samples: 1000, maxAgeHours: 1}}}}");
    std::fs::write(manifests.join("oci.yaml"), never_training_job("oci", Some(&policy))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status = trigger_status(&state, "default/oci").unwrap_or_default();
        if status["message"].as_str().is_some_and(|m| m.contains("did the tag move?")) {
            break status;
        }
        if Instant::now() > deadline {
            stop(fourth);
            panic!("the edit was not refused: {status}\n{}", std::fs::read_to_string(&fourth_log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("sha256 {moved}, but the reference pins sha256 {pinned}")), "{message}");
    assert_eq!(status["digest"], sha256.as_str(), "the policy it had serves on: {status}");
    stop(fourth);
}
