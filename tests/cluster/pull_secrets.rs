//! An `oci://` policy in a private registry (started here, htpasswd), pulled with the login of
//! the Secret the job's pod templates name in `imagePullSecrets`: the operator reads it and
//! passes the registry's entry to the job's node over the link; the edge agent, which has no
//! docker config of its own, pulls with it (or, compiler-free, the operator's compile does).
//! Without the Secret, or with a wrong password, the job says why, naming the Secret, never the
//! password; the password is in no log of the operator or the agent (at trace level) and in no
//! file the agent keeps.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{free_port, operator_counter};
use crate::registry::Registry;
use crate::stack::{JOB, World};

const USER: &str = "puller";
const PASSWORD: &str = "Pull-S3cret-9f2c";
const SECRET: &str = "regcred";

/// `perennial ARGS` with `docker_config` as `DOCKER_CONFIG`; its standard output.
fn perennial(args: &[&str], docker_config: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(args)
        .env("DOCKER_CONFIG", docker_config)
        .output()
        .expect("run perennial");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "perennial {args:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The threshold trigger pushed to the private registry: its reference and sha256.
fn push_trigger(registry: &Registry, world: &World) -> (String, String) {
    let (reference, _, sha256) = push_trigger_with_manifest(registry, world);
    (reference, sha256)
}

/// `plugin push` of the threshold trigger: (the reference, its manifest's digest, its
/// component's).
fn push_trigger_with_manifest(registry: &Registry, world: &World) -> (String, String, String) {
    let pusher = registry.docker_config(&world.file("pusher-docker-config"));
    let trigger = perennial_policy::builtin::built_plugin_path("threshold-trigger").expect("built");
    let reference = format!("{}:v1", registry.reference("team/trigger"));
    let pushed = perennial(&["plugin", "push", trigger, &reference], &pusher);
    let printed = |name: &str| {
        pushed
            .lines()
            .find_map(|line| line.trim().strip_prefix(name).map(|rest| rest.trim().to_owned()))
            .unwrap_or_else(|| panic!("no {name} in: {pushed}"))
    };
    (reference, printed("manifest "), printed("sha256 "))
}

/// `kubectl create secret docker-registry`, as the docs say, with `password`.
fn create_pull_secret(world: &World, registry: &Registry, password: &str) {
    let _ = world.cluster.kubectl(&["-n", &world.namespace, "delete", "secret", SECRET, "--ignore-not-found"]);
    world.cluster.kubectl_ok(&[
        "-n",
        &world.namespace,
        "create",
        "secret",
        "docker-registry",
        SECRET,
        &format!("--docker-server={}", registry.address),
        &format!("--docker-username={USER}"),
        &format!("--docker-password={password}"),
    ]);
}

/// Any change of the job has it reconciled now (the operator watches no Secret).
fn touch_job(world: &World, value: &str) {
    world.cluster.kubectl_ok(&[
        "-n",
        &world.namespace,
        "annotate",
        "--overwrite",
        "lifelonglearningjob",
        JOB,
        &format!("test.perennial.io/touched={value}"),
    ]);
}

/// Waits until the job's trigger status says something that `holds`; its message.
async fn until_trigger(world: &World, what: &str, holds: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let job = world.job().await.unwrap_or_default();
        let trigger = &job["status"]["policies"]["trigger"];
        if holds(trigger) {
            return trigger.clone();
        }
        assert!(Instant::now() < deadline, "the trigger never {what}: {:#}\n{}", job["status"], world.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many times the operator has read a Secret (its `/metrics`).
async fn secret_reads(metrics_port: u16) -> u64 {
    operator_counter(metrics_port, r#"perennial_operator_api_requests_total{verb="get",resource="secrets"}"#).await
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle)) {
            found.push(path.display().to_string());
        }
    }
    found
}

/// The password (and its `user:password` base64) in no log of the world, and no file of `dirs`.
fn nowhere(world: &World, dirs: &[&Path]) {
    use base64::Engine as _;
    let login = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    for secret in [PASSWORD, login.as_str()] {
        let mut holding = files_holding(world.root.path(), secret.as_bytes());
        holding.retain(|path| path.ends_with(".log"));
        for dir in dirs {
            holding.extend(files_holding(dir, secret.as_bytes()));
        }
        assert!(holding.is_empty(), "a credential in {holding:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_oci_policy_is_pulled_with_the_jobs_image_pull_secret_never_logged_nor_kept() {
    let registry = Registry::start_private(USER, PASSWORD);
    let world = World::new("pull").await;
    let (reference, sha256) = push_trigger(&registry, &world);
    let nobody = world.file("no-docker-config").display().to_string();
    let link_port = free_port();
    let trace = [
        ("RUST_LOG", "trace,hyper=debug,h2=debug,rustls=debug,tungstenite::protocol=trace,tokio_tungstenite=trace"),
        ("DOCKER_CONFIG", nobody.as_str()),
    ];
    let operator = world.start_operator_env("pull", (free_port(), link_port), &[], &trace);
    let edge_cache = world.file("edge-cache").display().to_string();
    let mut env = trace.to_vec();
    env.push(("PERENNIAL_CACHE_DIR", edge_cache.as_str()));
    let edge = world.start_edge_with(link_port, &[], &env);
    let _kubelet = world.kubelet();
    let policy = serde_json::json!({
        "plugin": reference, "sha256": sha256,
        "config": {"condition": {"operator": ">=", "threshold": 50}}
    });

    // The job names a Secret that does not exist: said, naming it; the pull is refused.
    world.apply_job_pulling(50, Some(policy), &[SECRET]);
    let missing = format!("the Secret {}/{SECRET} (imagePullSecrets) does not exist", world.namespace);
    let said = until_trigger(&world, "said the Secret is missing", |trigger| {
        trigger["message"].as_str().is_some_and(|message| message.contains(&missing))
    })
    .await;
    assert!(said["message"].as_str().unwrap_or_default().contains("refused access"), "{said}");

    // A wrong password: refused, naming the user and the Secret, never the password.
    create_pull_secret(&world, &registry, &format!("{PASSWORD}-wrong"));
    touch_job(&world, "1");
    let said = until_trigger(&world, "said the credentials were refused", |trigger| {
        trigger["message"].as_str().is_some_and(|message| message.contains("refused the credentials"))
    })
    .await;
    let message = said["message"].as_str().unwrap_or_default();
    let from = format!("user \"{USER}\" (from the Secret {}/{SECRET} (the job's imagePullSecrets))", world.namespace);
    assert!(message.contains(&from), "{message}");
    assert!(!message.contains(PASSWORD), "{message}");

    // The right one: the edge pulls with it, serves the policy by its digest, and a round runs.
    create_pull_secret(&world, &registry, PASSWORD);
    let (reads_before, round_started) = (secret_reads(operator.metrics_port).await, Instant::now());
    touch_job(&world, "2");
    world.append_samples(100);
    world.until_deployed(1, Duration::from_secs(240)).await;
    // The round's reconciles (a dozen and more) share the Secret's reads: the touch's, then one
    // every 10 s at most (pull_secrets::READ_SERVES_FOR), not one a reconcile.
    let reads = secret_reads(operator.metrics_port).await - reads_before;
    let most = 2 + round_started.elapsed().as_secs() / 10;
    assert!(reads <= most, "{reads} reads of the Secret in {:?}", round_started.elapsed());
    let serving = until_trigger(&world, "served", |trigger| trigger["health"] == "Serving").await;
    assert_eq!((serving["plugin"].as_str(), serving["digest"].as_str()), (Some(&*reference), Some(&*sha256)));
    assert!(
        std::fs::read_dir(Path::new(&edge_cache).join("components")).into_iter().flatten().count() > 0,
        "the component is kept by digest for a restart while offline"
    );

    // Said on the job (an Event), once the Secret was missing.
    let events = world.cluster.kubectl_ok(&["-n", &world.namespace, "get", "events", "-o", "json"]);
    assert!(events.contains("RegistryCredentials") && events.contains(&missing), "no Event said it:\n{events}");
    assert!(!events.contains(PASSWORD));

    // The agent restarted while the operator is away: the login was not kept, and the component
    // kept by its digest serves the job.
    drop((operator, edge));
    let _edge = world.start_edge_with(link_port, &[], &env);
    let restarted = world.file("edge-1.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(&restarted).unwrap_or_default();
        if log.contains("is served from the copy kept in") {
            assert!(log.contains("is not kept on this node"), "{log}");
            // The job then starts on it (a refusal would follow at once).
            tokio::time::sleep(Duration::from_secs(2)).await;
            let log = std::fs::read_to_string(&restarted).unwrap_or_default();
            assert!(!log.contains("cannot run on this node yet"), "{log}");
            break;
        }
        assert!(Instant::now() < deadline, "the restarted agent does not serve the kept copy:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    nowhere(&world, &[&world.file("edge-state"), Path::new(&edge_cache)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_compile_for_a_compiler_free_node_pulls_with_the_jobs_image_pull_secret() {
    let registry = Registry::start_private(USER, PASSWORD);
    let world = World::new("pullc").await;
    // Pinned by its manifest's digest alone: the operator reads the manifest, with the job's
    // login, to learn the component it compiles.
    let (tagged, manifest, sha256) = push_trigger_with_manifest(&registry, &world);
    let reference = format!("{tagged}@{manifest}");
    let nobody = world.file("no-docker-config").display().to_string();
    create_pull_secret(&world, &registry, &format!("{PASSWORD}-wrong"));

    let keys = world.file("operator").display().to_string();
    perennial(&["plugin", "keygen", &keys], Path::new(&nobody));
    let (key, public) = (format!("{keys}.key"), format!("{keys}.pub"));
    let artifact_dir = world.file("operator-artifacts");
    let artifact_dir_arg = artifact_dir.display().to_string();
    // The operator's temporary folder: the job's login is never written there (nor anywhere).
    let tmp = world.file("operator-tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let tmp_arg = tmp.display().to_string();
    let link_port = free_port();
    let flags = [("--sign-key", key.as_str()), ("--artifact-dir", artifact_dir_arg.as_str())];
    let env = [("DOCKER_CONFIG", nobody.as_str()), ("TMPDIR", tmp_arg.as_str())];
    let _operator = world.start_operator_env("pullc", (free_port(), link_port), &flags, &env);
    let edge_cache = world.file("edge-cache").display().to_string();
    let edge_env = [
        ("PERENNIAL_POLICY_PLATFORM", "pulley64"),
        ("PERENNIAL_CACHE_DIR", edge_cache.as_str()),
        ("DOCKER_CONFIG", nobody.as_str()),
    ];
    let _edge = world.start_edge_with(link_port, &["--trust-key", &public], &edge_env);
    let _kubelet = world.kubelet();
    let policy = serde_json::json!({
        "plugin": reference,
        "config": {"condition": {"operator": ">=", "threshold": 50}}
    });
    world.apply_job_pulling(50, Some(policy.clone()), &[SECRET]);
    // A wrong password: the operator's compile is refused, naming the user and the Secret (not
    // the temporary docker config it pulled with), never the password.
    let said = until_trigger(&world, "said the compile's credentials were refused", |trigger| {
        trigger["message"].as_str().is_some_and(|message| message.contains("refused the credentials"))
    })
    .await;
    let message = said["message"].as_str().unwrap_or_default();
    let from = format!("user \"{USER}\" (from the Secret {}/{SECRET} (the job's imagePullSecrets))", world.namespace);
    assert!(message.contains(&from) && !message.contains(PASSWORD), "{message}");
    // Fixed: compiled once the refusal is tried again (a minute), and the round runs on it.
    create_pull_secret(&world, &registry, PASSWORD);
    touch_job(&world, "1");
    world.append_samples(100);
    world.until_deployed(1, Duration::from_secs(240)).await;
    let serving = until_trigger(&world, "served", |trigger| trigger["health"] == "Serving").await;
    assert_eq!(serving["digest"].as_str(), Some(&*sha256), "{serving}");
    // Compiled by the operator, with the job's login given on the compile's standard input.
    let leftover: Vec<_> = std::fs::read_dir(&tmp).into_iter().flatten().flatten().map(|e| e.path()).collect();
    assert!(
        leftover
            .iter()
            .all(|path| !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("perennial-pull-"))),
        "the compile's docker config was left: {leftover:?}"
    );
    // Without its Secret the job may not pull the private component: the compile made with its
    // login is not offered to it any more (each job's own access is shown before an offer), and
    // it says why.
    world.apply_job_pulling(50, Some(policy), &[]);
    let said = until_trigger(&world, "said it may no longer pull it", |trigger| {
        trigger["message"].as_str().is_some_and(|message| message.contains("refused access to the repository"))
    })
    .await;
    assert!(!said.to_string().contains(PASSWORD), "{said}");
    nowhere(&world, &[&world.file("edge-state"), Path::new(&edge_cache), &artifact_dir, &tmp]);
}
