//! Golden pod specs (`tests/golden/pods/`; `UPDATE_GOLDEN=1` rewrites them) for the train, eval
//! and inference pods of Sedna's own atcii manifests, with a host-path and with an S3 outputDir,
//! and the rules a reader should not have to find in YAML.

use std::path::PathBuf;

use super::*;
use perennial_api::manifest::{Object, load_file};
use perennial_api::{Input, Model};

fn fixture() -> (LifelongLearningJob, Dataset) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sedna");
    let mut job = None;
    let mut dataset = None;
    for file in ["lifelonglearningjob-atcii.yaml", "dataset-atcii.yaml"] {
        for manifest in load_file(&dir.join(file)).unwrap() {
            match manifest.object {
                Object::Job(j) => job = Some(*j),
                Object::Dataset(d) => dataset = Some(*d),
                Object::Pod(_) => {}
            }
        }
    }
    let mut job = job.unwrap();
    job.metadata.namespace = Some("default".into());
    job.metadata.uid = Some("6c1f3a52-2f6e-4b8e-9a55-5d3c1d2f0a11".into());
    (job, dataset.unwrap())
}

fn model(url: &str) -> Model {
    Model { url: url.into(), format: "pkl".into(), metrics: None }
}

/// The worker spec of `stage` in round 2 with outputs under `out`, the dataset at `data`.
fn spec(stage: Stage, out: &str) -> WorkerSpec {
    let (input, previous_model) = match stage {
        Stage::Train => (
            Input {
                data_url: Some(format!("{out}/data/train/2/data.txt")),
                data_index_url: out.starts_with("s3://").then(|| format!("{out}/data/train/2/dataIndex.txt")),
                output_dir: Some(format!("{out}/train/2")),
                ..Input::default()
            },
            Some(model(&format!("{out}/train/1/index.pkl"))),
        ),
        Stage::Eval => (
            Input {
                models: vec![model(&format!("{out}/train/2/index.pkl"))],
                data_url: Some(format!("{out}/data/eval/2/data.txt")),
                data_index_url: out.starts_with("s3://").then(|| format!("{out}/data/eval/2/dataIndex.txt")),
                output_dir: Some(format!("{out}/eval/2")),
            },
            None,
        ),
        Stage::Deploy => (Input { models: vec![model(&format!("{out}/deploy/index.pkl"))], ..Input::default() }, None),
    };
    WorkerSpec { stage, round: 2, input, previous_model }
}

struct Case {
    golden: &'static str,
    stage: Stage,
    s3: bool,
}

const CASES: &[Case] = &[
    Case { golden: "train-hostpath", stage: Stage::Train, s3: false },
    Case { golden: "eval-hostpath", stage: Stage::Eval, s3: false },
    Case { golden: "inference-hostpath", stage: Stage::Deploy, s3: false },
    Case { golden: "train-s3", stage: Stage::Train, s3: true },
    Case { golden: "eval-s3", stage: Stage::Eval, s3: true },
    Case { golden: "inference-s3", stage: Stage::Deploy, s3: true },
];

fn build(case: &Case) -> Pod {
    let (mut job, mut dataset) = fixture();
    let (job_credential, dataset_credential) = if case.s3 {
        job.spec.output_dir = "s3://models/atcii".into();
        job.spec.credential_name = Some("models-s3".into());
        dataset.spec.url = "s3://datasets/atcii/index.txt".into();
        dataset.spec.format = "txt".into();
        dataset.spec.credential_name = Some("datasets-s3".into());
        (
            Some(Credential { secret: "models-s3".into(), endpoint_url: "https://minio.storage:9000".into() }),
            Some(Credential { secret: "datasets-s3".into(), endpoint_url: "http://10.0.0.5:9000".into() }),
        )
    } else {
        (None, None)
    };
    let out = job.spec.output_dir.clone();
    let worker_name = format!("{}-worker-0123456789abcdef01234567", case.stage.worker_kind());
    let ctx = PodContext {
        job: &job,
        dataset: &dataset,
        worker_name: &worker_name,
        lc_server: "http://localhost:9100",
        kb_server: "http://kb.sedna:9020",
        fetch_image: "ghcr.io/perennial/perennial:0.1.0",
        job_credential,
        dataset_credential,
    };
    build_pod(&spec(case.stage, &out), &ctx)
}

#[test]
fn pods_match_their_golden_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/pods");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for case in CASES {
        let yaml = serde_yaml_ng::to_string(&build(case)).unwrap();
        let path = dir.join(format!("{}.yaml", case.golden));
        if update {
            std::fs::write(&path, &yaml).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        assert!(golden == yaml, "{} differs from the built pod (UPDATE_GOLDEN=1 rewrites it):\n{yaml}", case.golden);
    }
}

fn env_of(pod: &Pod) -> Vec<EnvVar> {
    pod.spec.as_ref().unwrap().containers[0].env.clone().unwrap_or_default()
}

fn value<'e>(env: &'e [EnvVar], name: &str) -> Option<&'e str> {
    env.iter().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

#[test]
fn sednas_identity_labels_owner_network_and_restart_policy() {
    for case in CASES {
        let pod = build(case);
        let meta = &pod.metadata;
        let kind = case.stage.worker_kind();
        assert_eq!(meta.generate_name.as_deref(), Some(format!("atcii-classifier-demo-{kind}-").as_str()));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["lifelonglearningjob.sedna.io/name"], "atcii-classifier-demo", "{}", case.golden);
        assert_eq!(labels["lifelonglearningjob.sedna.io/uid"], "6c1f3a52-2f6e-4b8e-9a55-5d3c1d2f0a11");
        assert_eq!(labels["lifelonglearningjob.sedna.io/worker-type"], kind);
        assert_eq!(labels[ROUND_LABEL], "2");
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller, owner.block_owner_deletion),
            ("LifelongLearningJob", Some(true), Some(true))
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
        let expected = if case.stage == Stage::Deploy { None } else { Some("OnFailure") };
        assert_eq!(spec.restart_policy.as_deref(), expected, "{}", case.golden);
        // The template's env first, then Sedna's.
        let env = env_of(&pod);
        let template_names: Vec<&str> =
            env.iter().take_while(|e| e.name != "NAMESPACE").map(|e| e.name.as_str()).collect();
        assert!(
            !template_names.is_empty() && !template_names.contains(&"WORKER_NAME"),
            "{}: {template_names:?}",
            case.golden
        );
        assert_eq!(value(&env, "LC_SERVER"), Some("http://localhost:9100"));
    }
}

/// The inference pod mounts its model's folder and nothing else of the job's outputs: not the
/// outputDir, which holds every round's data and, beside it, other jobs' outputs.
#[test]
fn the_inference_pod_mounts_only_the_deployed_model() {
    let pod = build(&CASES[2]);
    let spec = pod.spec.as_ref().unwrap();
    let host_paths: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.as_str()))
        .filter(|path| !["/lifelong/unseen_task/", "/data/"].contains(path)) // the template's own
        .collect();
    assert_eq!(host_paths, ["/output/deploy"]);
    let env = env_of(&pod);
    assert_eq!(value(&env, "MODEL_URLS"), Some("/home/data/output/deploy/index.pkl"));
    assert_eq!(value(&env, "OUTPUT_URL"), Some("/output"), "raw, as Sedna gives it");
}

#[test]
fn host_paths_are_mounted_under_home_data() {
    let pod = build(&CASES[0]);
    let env = env_of(&pod);
    assert_eq!(value(&env, "TRAIN_DATASET_URL"), Some("/home/data/output/data/train/2/data.txt"));
    assert_eq!(value(&env, "OUTPUT_URL"), Some("/home/data/output/train/2"));
    assert_eq!(value(&env, "ORIGINAL_DATASET_URL"), Some("/home/data/data/trainData.csv"));
    assert_eq!(value(&env, "DATA_PATH_PREFIX"), Some("/home/data"));
    assert_eq!(value(&env, "HAS_COMPLETED_INITIAL_TRAINING"), Some("true"));
    // Sedna's library joins DATA_PATH_PREFIX to it: left raw.
    assert_eq!(value(&env, "CLOUD_KB_INDEX"), Some("/output/train/1/index.pkl"));
    let spec = pod.spec.unwrap();
    let volumes = spec.volumes.unwrap();
    let host = |name: &str| volumes.iter().find(|v| v.name == name).and_then(|v| v.host_path.clone()).map(|h| h.path);
    assert_eq!(host("output-data-train-2z").as_deref(), Some("/output/data/train/2"));
    assert_eq!(host("output-trainz").as_deref(), Some("/output/train"));
    let mounts = spec.containers[0].volume_mounts.clone().unwrap();
    assert!(mounts.iter().any(|m| m.name == "output-trainz" && m.mount_path == "/home/data/output/train"));
    assert!(spec.init_containers.is_none(), "nothing to download");
}

#[test]
fn s3_inputs_are_downloaded_with_their_own_credentials_and_no_key_is_ever_a_value() {
    for case in CASES.iter().filter(|c| c.s3) {
        let pod = build(case);
        let spec = pod.spec.clone().unwrap();
        for container in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            for var in container.env.iter().flatten() {
                if var.name.ends_with("ACCESS_KEY_ID") || var.name.ends_with("SECRET_ACCESS_KEY") {
                    assert!(var.value.is_none(), "{}: {} has a plain value", case.golden, var.name);
                    let secret = var.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).unwrap();
                    assert!(secret.name.ends_with("-s3"), "{}: {secret:?}", case.golden);
                }
            }
        }
    }
    let train = build(&CASES[3]);
    let spec = train.spec.unwrap();
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.name, "storage-initializer");
    assert_eq!(
        init.args.as_ref().unwrap(),
        &[
            "fetch",
            "--job",
            "s3://models/atcii/data/train/2/data.txt",
            "/downloads/models/atcii/data/train/2",
            "--dataset-index",
            "s3://models/atcii/data/train/2/dataIndex.txt",
            "/downloads/models/atcii/data/train/2",
        ]
    );
    let init_env = init.env.clone().unwrap();
    assert_eq!(value(&init_env, "S3_ENDPOINT_URL"), Some("https://minio.storage:9000"));
    assert_eq!(value(&init_env, "DATASET_S3_ENDPOINT_URL"), Some("http://10.0.0.5:9000"));
    let env = env_of(&Pod { spec: Some(spec.clone()), ..Pod::default() });
    assert_eq!(value(&env, "TRAIN_DATASET_URL"), Some("/downloads/models/atcii/data/train/2/data.txt"));
    assert_eq!(value(&env, "OUTPUT_URL"), Some("s3://models/atcii/train/2"), "outputs are written, not downloaded");
    assert_eq!(value(&env, "S3_ENDPOINT_URL"), Some("https://minio.storage:9000"));
    let downloads = spec.containers[0].volume_mounts.as_ref().unwrap().iter().find(|m| m.mount_path == "/downloads");
    assert_eq!(downloads.and_then(|m| m.read_only), Some(true), "workers read downloads, never write them");
}

#[test]
fn volume_names_as_sedna_makes_them() {
    let cases = [
        ("/output/train/", "output-trainz"),
        ("/", "sedna-default-volume-name"),
        ("/Data/Set_1/", "data-set-1z"),
        (&format!("/{}/", "a".repeat(80)), &"a".repeat(63)),
    ];
    for (path, expected) in cases {
        assert_eq!(volume_name(path), expected, "{path}");
    }
}

#[test]
fn endpoints_from_sednas_secret_annotations() {
    let annotations = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert_eq!(endpoint_url(&annotations(&[("s3-endpoint", "minio:9000")])).as_deref(), Some("https://minio:9000"));
    assert_eq!(
        endpoint_url(&annotations(&[("s3-endpoint", "minio:9000"), ("s3-usehttps", "0")])).as_deref(),
        Some("http://minio:9000")
    );
    assert_eq!(endpoint_url(&annotations(&[])), None);
}
