//! `perennial fetch` as the `storage-initializer` init container runs it: the real binary against
//! real S3 servers (s3s + s3s-fs) on 127.0.0.1, one for the job's bucket and one, with other
//! keys, for the dataset's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::s3::{ACCESS_KEY, S3Server, SECRET_KEY};

const DATASET_ACCESS: &str = "dataset-reader";
const DATASET_SECRET: &str = "dataset-secret-of-another-owner";

/// Every variable `perennial fetch` reads, cleared so that the caller's environment never leaks in.
const FETCH_ENV: &[&str] = &[
    "S3_ENDPOINT_URL",
    "ACCESS_KEY_ID",
    "SECRET_ACCESS_KEY",
    "DATASET_S3_ENDPOINT_URL",
    "DATASET_ACCESS_KEY_ID",
    "DATASET_SECRET_ACCESS_KEY",
    "INDIRECT_URL_MARK",
    "PERENNIAL_FETCH_CONCURRENCY",
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
];

/// The two servers, on a runtime of their own while the tests run the binary.
struct World {
    job: S3Server,
    dataset: S3Server,
    _rt: tokio::runtime::Runtime,
}

impl World {
    fn start() -> World {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (job, dataset) = rt.block_on(async {
            (S3Server::start().await, S3Server::start_with_keys(DATASET_ACCESS, DATASET_SECRET).await)
        });
        World { job, dataset, _rt: rt }
    }

    /// The init container's env: the job's credential and the dataset's.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("S3_ENDPOINT_URL".into(), format!("http://{}", self.job.address)),
            ("ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("DATASET_S3_ENDPOINT_URL".into(), format!("http://{}", self.dataset.address)),
            ("DATASET_ACCESS_KEY_ID".into(), DATASET_ACCESS.into()),
            ("DATASET_SECRET_ACCESS_KEY".into(), DATASET_SECRET.into()),
        ]
    }
}

fn fetch(args: &[&str], env: &[(String, String)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perennial"));
    command.arg("fetch").args(args).env("RUST_LOG", "info").env("PERENNIAL_LOG_FORMAT", "text");
    for name in FETCH_ENV {
        command.env_remove(name);
    }
    command.envs(env.iter().map(|(k, v)| (k, v))).output().expect("run perennial fetch")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_ok(output: &Output) -> String {
    let stderr = stderr(output);
    assert!(output.status.success(), "perennial fetch failed: {stderr}");
    for secret in [SECRET_KEY, DATASET_SECRET] {
        assert!(!stderr.contains(secret), "a secret in the log: {stderr}");
    }
    stderr
}

/// Exit 2, and the one error line (the last) contains each of `expected`; no secret anywhere.
fn assert_fails(output: &Output, expected: &[&str]) -> String {
    let stderr = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("perennial: "), "{stderr}");
    for part in expected {
        assert!(last.contains(part), "{last:?} should contain {part:?}");
    }
    for secret in [SECRET_KEY, DATASET_SECRET, "wrong-secret"] {
        assert!(!stderr.contains(secret), "a secret in the log: {stderr}");
    }
    last
}

/// Every file under `dir`, relative, sorted (partial files would show up here).
fn files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Bytes that are not text, of a given length.
fn blob(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn one_object_lands_under_its_name_and_folders_keep_their_relative_paths() {
    let world = World::start();
    let index = blob(1, 4096);
    let big = blob(2, (9 << 20) + 123); // more than one 8 MiB ranged read
    let seen = blob(3, 10);
    let empty: Vec<u8> = Vec::new();
    world.job.put("models", "atcii/train/1/index.pkl", &index);
    world.job.put("models", "atcii/train/1/seen_task/big.model", &big);
    world.job.put("models", "atcii/train/1/seen_task/sub/a.sample", &seen);
    world.job.put("models", "atcii/train/1/unseen_task/empty", &empty);
    let downloads = tempfile::tempdir().unwrap();
    let d = downloads.path();

    // One object: DST/<basename>.
    let out = fetch(&["--job", "s3://models/atcii/train/1/index.pkl", s(&d.join("one"))], &world.env());
    let log = assert_ok(&out);
    assert_eq!(files(&d.join("one")), ["index.pkl"]);
    assert_eq!(read(d.join("one/index.pkl")), index);
    let line = format!("s3://models/atcii/train/1/index.pkl → {}", d.join("one/index.pkl").display());
    assert!(log.contains(&line) && log.contains("bytes=4096"), "one line per object: {log}");

    // A folder given with its slash: its contents straight under DST (the pod's env names DST).
    let out = fetch(&["--job", "s3://models/atcii/train/1/", s(&d.join("slash"))], &world.env());
    let log = assert_ok(&out);
    let all = ["index.pkl", "seen_task/big.model", "seen_task/sub/a.sample", "unseen_task/empty"];
    assert_eq!(files(&d.join("slash")), all);
    assert_eq!(read(d.join("slash/seen_task/big.model")), big);
    assert_eq!(read(d.join("slash/seen_task/sub/a.sample")), seen);
    assert_eq!(read(d.join("slash/unseen_task/empty")), empty);
    assert_eq!(log.matches(" → ").count(), 4, "{log}");

    // A folder without the slash (objects under key/): DST/<folder name>/..., as Sedna's does.
    let out = fetch(&["--job", "s3://models/atcii/train/1/seen_task", s(&d.join("bare"))], &world.env());
    assert_ok(&out);
    assert_eq!(files(&d.join("bare")), ["seen_task/big.model", "seen_task/sub/a.sample"]);
    assert_eq!(read(d.join("bare/seen_task/big.model")), big);

    // Several at once, and a rerun replaces files in place.
    std::fs::write(d.join("one/index.pkl"), b"stale and longer than nothing at all").unwrap();
    let out = fetch(
        &[
            "--job",
            "s3://models/atcii/train/1/index.pkl",
            s(&d.join("one")),
            "--job",
            "s3://models/atcii/train/1/seen_task/sub/",
            s(&d.join("two")),
        ],
        &world.env(),
    );
    assert_ok(&out);
    assert_eq!(read(d.join("one/index.pkl")), index);
    assert_eq!(files(&d.join("two")), ["a.sample"]);
}

#[test]
fn an_indirect_index_brings_each_file_it_names_to_its_relative_path() {
    let world = World::start();
    let (one, two, label) = (blob(4, 300), blob(5, 70_000), b"1 0 1\n".to_vec());
    world.dataset.put("datasets", "atcii/images/1.png", &one);
    world.dataset.put("datasets", "atcii/images/2.png", &two);
    world.dataset.put("datasets", "atcii/labels/1.txt", &label);
    world.dataset.put("datasets", "atcii/labels/2.txt", b"unlisted: not fetched");
    world.dataset.put("datasets", "atcii/masks/a/m.bin", &one);
    // Sedna's format: comments and blanks skipped, the base URI, then names (a folder, a duplicate).
    let index = "# written by the edge\n\ns3://datasets/atcii\nimages/1.png\nimages/2.png\n  labels/1.txt  \nimages/1.png\nmasks/\n";
    world.dataset.put("datasets", "rounds/train/2/dataIndex.txt", index.as_bytes());
    let downloads = tempfile::tempdir().unwrap();
    let dst = downloads.path().join("models/atcii/data/train/2");

    let out =
        fetch(&["--dataset", "s3://datasets/rounds/train/2/dataIndex.txt", &format!("@{}", s(&dst))], &world.env());
    let log = assert_ok(&out);
    assert_eq!(files(&dst), ["dataIndex.txt", "images/1.png", "images/2.png", "labels/1.txt", "masks/a/m.bin"]);
    assert_eq!(read(dst.join("dataIndex.txt")), index.as_bytes());
    assert_eq!(read(dst.join("images/1.png")), one);
    assert_eq!(read(dst.join("images/2.png")), two);
    assert_eq!(read(dst.join("labels/1.txt")), label);
    assert_eq!(read(dst.join("masks/a/m.bin")), one);
    assert!(
        log.contains(&format!("s3://datasets/atcii/images/2.png → {}", dst.join("images/2.png").display())),
        "{log}"
    );
    assert!(!downloads.path().join("@").exists());

    // INDIRECT_URL_MARK chooses the mark; with another mark, `@` is just part of a folder name.
    let mut env = world.env();
    env.push(("INDIRECT_URL_MARK".into(), "+".into()));
    let other = downloads.path().join("other");
    let out = fetch(&["--dataset", "s3://datasets/rounds/train/2/dataIndex.txt", &format!("+{}", s(&other))], &env);
    assert_ok(&out);
    assert_eq!(files(&other).len(), 5);
    let at = downloads.path().join("@literal");
    let out = fetch(&["--dataset", "s3://datasets/rounds/train/2/dataIndex.txt", s(&at)], &env);
    assert_ok(&out);
    assert_eq!(files(&at), ["dataIndex.txt"], "not indirect: the index alone");

    // A name that climbs out of the destination is refused, naming the index and the line.
    world.dataset.put("datasets", "rounds/bad/dataIndex.txt", b"s3://datasets/atcii\nimages/1.png\n../../escape.png\n");
    let bad = downloads.path().join("bad");
    let out = fetch(&["--dataset", "s3://datasets/rounds/bad/dataIndex.txt", &format!("@{}", s(&bad))], &world.env());
    assert_fails(&out, &["s3://datasets/rounds/bad/dataIndex.txt", "line 3", "../../escape.png"]);
    assert!(!downloads.path().join("escape.png").exists());

    // A named file that is missing fails the command, naming its URL and the index line.
    world.dataset.put("datasets", "rounds/gone/dataIndex.txt", b"s3://datasets/atcii\nimages/1.png\nimages/9.png\n");
    let gone = downloads.path().join("gone");
    let out = fetch(&["--dataset", "s3://datasets/rounds/gone/dataIndex.txt", &format!("@{}", s(&gone))], &world.env());
    assert_fails(
        &out,
        &["s3://datasets/rounds/gone/dataIndex.txt: line 3", "s3://datasets/atcii/images/9.png", "not found"],
    );
}

#[test]
fn job_and_dataset_sources_are_each_read_with_their_own_credential() {
    let world = World::start();
    // As the operator's train pod: the round's data.txt from the job's bucket, the dataset's index.
    let data = b"images/1.png 1\nimages/2.png 0\n".to_vec();
    world.job.put("models", "atcii/data/train/2/data.txt", &data);
    let (one, two) = (blob(6, 1000), blob(7, 2000));
    world.dataset.put("datasets", "atcii/images/1.png", &one);
    world.dataset.put("datasets", "atcii/images/2.png", &two);
    // The round's sample index is the edge's file, in the job's output: the job's credential
    // reads it, the dataset's reads the files it names (`--dataset-index`, as the pod builder says).
    let index = b"s3://datasets/atcii\nimages/1.png\nimages/2.png\n".to_vec();
    world.job.put("models", "atcii/data/train/2/dataIndex.txt", &index);
    let downloads = tempfile::tempdir().unwrap();
    let dst = downloads.path().join("models/atcii/data/train/2");
    let args = [
        "--job",
        "s3://models/atcii/data/train/2/data.txt",
        s(&dst),
        "--dataset-index",
        "s3://models/atcii/data/train/2/dataIndex.txt",
        s(&dst),
    ]
    .map(str::to_owned);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    assert_ok(&fetch(&args, &world.env()));
    assert_eq!(files(&dst), ["data.txt", "dataIndex.txt", "images/1.png", "images/2.png"]);
    assert_eq!(read(dst.join("data.txt")), data);
    assert_eq!(read(dst.join("dataIndex.txt")), index);
    assert_eq!(read(dst.join("images/1.png")), one);
    assert_eq!(read(dst.join("images/2.png")), two);

    // Each key works on its own server only: swapped, both are refused.
    let mut swapped = world.env();
    swapped[0].1 = format!("http://{}", world.dataset.address);
    swapped[3].1 = format!("http://{}", world.job.address);
    let out = fetch(&args, &swapped);
    assert_fails(&out, &["access denied"]);

    // A wrong dataset secret: the error names the dataset's URL and its variables.
    let mut env = world.env();
    env[5].1 = "wrong-secret".into();
    let out = fetch(&args, &env);
    let line = assert_fails(
        &out,
        &["s3://datasets/atcii/images/", "(--dataset)", "access denied", "DATASET_SECRET_ACCESS_KEY"],
    );
    assert!(!line.contains("(--job)"), "the job's downloads are not the ones that failed: {line}");

    // A wrong job secret: the job's URL.
    let mut env = world.env();
    env[2].1 = "wrong-secret".into();
    let out = fetch(&args, &env);
    // (data.txt or the index, whichever is refused first: both are the job's.)
    let line = assert_fails(&out, &["s3://models/atcii/data/train/2/", "(--job)", "access denied"]);
    assert!(!line.contains("s3://datasets"), "{line}");
}

#[test]
fn a_missing_object_fails_naming_its_url() {
    let world = World::start();
    world.job.put("models", "atcii/present.bin", b"here");
    let downloads = tempfile::tempdir().unwrap();
    let dst = downloads.path().join("out");
    for url in ["s3://models/atcii/absent.bin", "s3://models/atcii/no-such-folder/", "s3://no-bucket/x.bin"] {
        let out = fetch(&["--job", "s3://models/atcii/present.bin", s(&dst), "--job", url, s(&dst)], &world.env());
        assert_fails(&out, &[url, "not found"]);
    }
    // Whatever was done before the failure is whole files only.
    assert!(files(&dst).iter().all(|f| f == "present.bin"), "{:?}", files(&dst));
}

#[test]
fn missing_credentials_name_the_variables_to_set() {
    let world = World::start();
    let downloads = tempfile::tempdir().unwrap();
    let dst = downloads.path().join("out");

    let out = fetch(&["--job", "s3://models/atcii/x.bin", s(&dst)], &[]);
    assert_fails(&out, &["s3://models/atcii/x.bin", "--job", "S3_ENDPOINT_URL", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY"]);

    // The job's credential alone does not serve a --dataset source; the message says which are unset.
    let job_only: Vec<_> = world.env().into_iter().filter(|(k, _)| !k.starts_with("DATASET_")).collect();
    let out = fetch(&["--dataset", "s3://datasets/atcii/index.txt", s(&dst)], &job_only);
    let line = assert_fails(
        &out,
        &["s3://datasets/atcii/index.txt", "--dataset", "DATASET_S3_ENDPOINT_URL", "DATASET_SECRET_ACCESS_KEY"],
    );
    assert!(
        line.contains("unset: DATASET_S3_ENDPOINT_URL, DATASET_ACCESS_KEY_ID, DATASET_SECRET_ACCESS_KEY"),
        "{line}"
    );

    let mut partial = world.env();
    partial.retain(|(k, _)| k != "SECRET_ACCESS_KEY");
    let out = fetch(&["--job", "s3://models/atcii/x.bin", s(&dst)], &partial);
    assert_fails(&out, &["unset: SECRET_ACCESS_KEY"]);
    assert!(!dst.exists(), "nothing is downloaded before the credentials are checked");
}

#[test]
fn arguments_come_in_pairs() {
    let out = fetch(&["--job", "s3://models/atcii/x.bin"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--job"), "{err}");

    let out = fetch(&[], &[]);
    assert_eq!(out.status.code(), Some(2), "nothing to fetch is a usage error: {}", stderr(&out));

    let out = fetch(&["--job", "ftp://host/x", "/tmp/perennial-fetch-never"], &[]);
    assert_fails(&out, &["ftp://host/x", "expected s3://bucket/key"]);
}
