//! The resources against Sedna's own manifests (`tests/fixtures/sedna/`, reconstructions of
//! Sedna's samples): they load unchanged, every Sedna field lands where it should, they
//! validate, and they serialize back under Sedna's names without Perennial's absent fields.
//! Then Perennial's optional fields, the built-in rules they default to, one case per
//! validation rule, and the manifest loader's errors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::manifest::{self, Manifest, ManifestError, Object};
use super::*;
use perennial_policy::{Limits, OnError, PolicyHost, PolicyRef, Source, TracingEvents, TriggerKind, builtin};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Sedna's trigger operators and their aliases.
const OPERATORS: [&str; 13] = [">", "gt", ">=", "ge", "<", "lt", "<=", "le", "=", "==", "eq", "!=", "ne"];
/// The statistics the built-in trigger tests: Sedna's `num_of_samples` and Perennial's.
const METRICS: [&str; 4] = ["num_of_samples", "num_of_eval_samples", "total_samples", "rounds_completed"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sedna")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// Every object of one fixture file, through `manifest::load`.
fn load_fixture(name: &str) -> Vec<Manifest> {
    manifest::load(&[fixture(name)]).unwrap_or_else(|err| panic!("{name}: {err}"))
}

fn job(manifest: &Manifest) -> &LifelongLearningJob {
    match &manifest.object {
        Object::Job(job) => job,
        other => panic!("{}: expected a LifelongLearningJob, got {other:?}", manifest.origin()),
    }
}

fn dataset(manifest: &Manifest) -> &Dataset {
    match &manifest.object {
        Object::Dataset(dataset) => dataset,
        other => panic!("{}: expected a Dataset, got {other:?}", manifest.origin()),
    }
}

/// The atcii job, the base of the validation cases.
fn atcii_job() -> LifelongLearningJob {
    job(&load_fixture("lifelonglearningjob-atcii.yaml")[0]).clone()
}

fn atcii_dataset() -> Dataset {
    dataset(&load_fixture("dataset-atcii.yaml")[0]).clone()
}

/// A `dataset_exists` answering for these `namespace/name` keys.
fn datasets(keys: &[&str]) -> impl Fn(&str) -> bool {
    let keys: BTreeSet<String> = keys.iter().map(|key| (*key).to_owned()).collect();
    move |key: &str| keys.contains(key)
}

/// The template's only container.
fn container(template: &PodTemplateSpec) -> &Container {
    let containers = &template.spec.as_ref().expect("template.spec").containers;
    assert_eq!(containers.len(), 1, "{containers:?}");
    &containers[0]
}

fn env(container: &Container) -> Vec<(&str, &str)> {
    container
        .env
        .iter()
        .flatten()
        .map(|var| (var.name.as_str(), var.value.as_deref().expect("a literal value")))
        .collect()
}

fn args(container: &Container) -> Vec<&str> {
    container.args.iter().flatten().map(String::as_str).collect()
}

fn node_name(template: &PodTemplateSpec) -> Option<&str> {
    template.spec.as_ref()?.node_name.as_deref()
}

fn quantity(text: &str) -> Quantity {
    Quantity(text.to_owned())
}

fn time(text: &str) -> Time {
    Time(text.parse().unwrap_or_else(|err| panic!("{text}: {err}")))
}

fn keys(value: &Value) -> BTreeSet<&str> {
    value.as_object().unwrap_or_else(|| panic!("not an object: {value}")).keys().map(String::as_str).collect()
}

fn set<'a>(items: &[&'a str]) -> BTreeSet<&'a str> {
    items.iter().copied().collect()
}

/// Every key of `value`, at any depth.
fn all_keys(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                out.insert(key.clone());
                all_keys(child, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| all_keys(item, out)),
        _ => {}
    }
}

/// The documents of a file as plain JSON values, by document number (from 1; empty ones too).
fn raw_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap_or_else(|err| panic!("{path:?}: {err}")))
        .collect()
}

/// Checks that everything in `original` (the document as written) is in `written` (the object
/// serialized back) at the same path, and returns where the two differ in form only: a number
/// that comes back as the same number of another type (`500` → `500.0`), a number that comes
/// back as a quantity string (`cpu: 6` → `"6"`), a null that is left out.
fn kept(path: &str, original: &Value, written: Option<&Value>, changes: &mut Vec<String>) {
    match (original, written) {
        (Value::Null, None) => changes.push(format!("{path}: null left out")),
        (Value::Object(original), Some(Value::Object(written))) => {
            for (key, value) in original {
                kept(&format!("{path}.{key}"), value, written.get(key), changes);
            }
        }
        (Value::Array(original), Some(Value::Array(written))) => {
            assert_eq!(original.len(), written.len(), "{path}: {original:?} came back as {written:?}");
            for (i, (original, written)) in original.iter().zip(written).enumerate() {
                kept(&format!("{path}[{i}]"), original, Some(written), changes);
            }
        }
        (Value::Number(a), Some(Value::Number(b))) => {
            assert_eq!(a.as_f64(), b.as_f64(), "{path}: {a} came back as {b}");
            if a.to_string() != b.to_string() {
                changes.push(format!("{path}: {a} -> {b}"));
            }
        }
        (Value::Number(a), Some(Value::String(b))) if a.to_string() == *b => {
            changes.push(format!("{path}: {a} -> {b:?}"));
        }
        (original, written) => assert_eq!(Some(original), written, "{path}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Sedna's manifests load unchanged, every field where it belongs

#[test]
fn atcii_job_loads_with_every_sedna_field() {
    let manifests = load_fixture("lifelonglearningjob-atcii.yaml");
    assert_eq!(manifests.len(), 1);
    assert_eq!(manifests[0].document, 1);
    assert_eq!(manifests[0].file, fixture("lifelonglearningjob-atcii.yaml"));
    let job = job(&manifests[0]);
    assert_eq!(job.metadata.name.as_deref(), Some("atcii-classifier-demo"));
    assert_eq!(job.metadata.namespace, None);
    assert_eq!(key(&job.metadata), "default/atcii-classifier-demo");
    let spec = &job.spec;

    assert_eq!(spec.dataset.name, "lifelong-dataset");
    assert_eq!(spec.dataset.train_prob, 0.8);
    assert_eq!(spec.dataset.split_policy, None);

    // `start: 02:00` and `end: 24:00` are unquoted in Sedna's sample: they must stay strings.
    let trigger = spec.train_spec.trigger.as_ref().expect("trigger");
    assert_eq!(
        trigger,
        &Trigger {
            check_period_seconds: Some(60),
            timer: Some(Timer { start: "02:00".into(), end: "24:00".into() }),
            condition: Some(TriggerCondition {
                operator: ">".into(),
                threshold: 500.0,
                metric: "num_of_samples".into()
            }),
            policy: None,
        }
    );

    let image = "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0";
    let stages = [
        ("train", &spec.train_spec.template, "train-worker", vec!["train.py"]),
        ("eval", &spec.eval_spec.template, "eval-worker", vec!["eval.py"]),
        ("deploy", &spec.deploy_spec.template, "infer-worker", vec!["inference.py"]),
    ];
    for (stage, template, name, expected_args) in stages {
        assert_eq!(node_name(template), Some("edge-node"), "{stage}");
        let container = container(template);
        assert_eq!(container.name, name, "{stage}");
        assert_eq!(container.image.as_deref(), Some(image), "{stage}");
        assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"), "{stage}");
        assert_eq!(args(container), expected_args, "{stage}");
    }
    assert_eq!(
        env(container(&spec.train_spec.template)),
        [("early_stopping_rounds", "100"), ("metric_name", "mlogloss")]
    );
    assert_eq!(
        env(container(&spec.eval_spec.template)),
        [
            ("metrics", "precision_score"),
            ("metric_param", "{'average': 'micro'}"),
            ("operator", "<"),
            ("model_threshold", "0.01")
        ]
    );
    let infer = container(&spec.deploy_spec.template);
    assert_eq!(env(infer), [("UT_SAVED_URL", "/ut_saved_url"), ("infer_dataset_url", "/data/testData.csv")]);
    let mounts: Vec<(&str, &str)> =
        infer.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str())).collect();
    assert_eq!(mounts, [("utdir", "/ut_saved_url"), ("inferdata", "/data/")]);
    let limits = infer.resources.as_ref().and_then(|r| r.limits.as_ref()).expect("limits");
    assert_eq!(limits.get("memory"), Some(&quantity("2Gi")));
    let volumes: Vec<(&str, &str, Option<&str>)> = spec
        .deploy_spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| {
            let host_path = v.host_path.as_ref().expect("hostPath");
            (v.name.as_str(), host_path.path.as_str(), host_path.type_.as_deref())
        })
        .collect();
    assert_eq!(
        volumes,
        [
            ("utdir", "/lifelong/unseen_task/", Some("DirectoryOrCreate")),
            ("inferdata", "/data/", Some("DirectoryOrCreate"))
        ]
    );

    assert_eq!(spec.output_dir, "/output");
    assert_eq!(spec.credential_name, None);
    assert_eq!(
        (spec.train_spec.timeout_seconds, spec.eval_spec.timeout_seconds, spec.deploy_spec.timeout_seconds),
        (None, None, None)
    );
    assert_eq!(spec.deploy_spec.select_policy, None);
    assert_eq!(job.status, None);

    validate_job(job, &datasets(&["default/lifelong-dataset"])).unwrap();
}

#[test]
fn atcii_dataset_loads_and_validates() {
    let manifests = load_fixture("dataset-atcii.yaml");
    assert_eq!(manifests.len(), 1);
    let dataset = dataset(&manifests[0]);
    assert_eq!(key(&dataset.metadata), "default/lifelong-dataset");
    assert_eq!(
        dataset.spec,
        DatasetSpec {
            url: "/data/trainData.csv".into(),
            format: "csv".into(),
            node_name: "edge-node".into(),
            credential_name: None
        }
    );
    assert_eq!(dataset.status, None);
    validate_dataset(dataset).unwrap();
}

#[test]
fn robot_dog_delivery_is_a_dataset_then_a_job() {
    let manifests = load_fixture("robot-dog-delivery.yaml");
    let origins: Vec<(PathBuf, usize)> = manifests.iter().map(|m| (m.file.clone(), m.document)).collect();
    let file = fixture("robot-dog-delivery.yaml");
    assert_eq!(origins, [(file.clone(), 1), (file.clone(), 2)]);
    assert_eq!(manifests[1].origin(), format!("{} (document 2)", file.display()));

    let dataset = dataset(&manifests[0]);
    assert_eq!(key(&dataset.metadata), "default/lifelong-robo-dataset");
    assert_eq!(dataset.spec.url, "/data/segmentation_data/data.txt");
    assert_eq!(dataset.spec.format, "txt");
    assert_eq!(dataset.spec.node_name, "sedna-mini-control-plane");
    validate_dataset(dataset).unwrap();

    let job = job(&manifests[1]);
    let spec = &job.spec;
    assert_eq!(key(&job.metadata), "default/robo-demo");
    assert_eq!((spec.dataset.name.as_str(), spec.dataset.train_prob), ("lifelong-robo-dataset", 0.8));
    let trigger = spec.train_spec.trigger.as_ref().unwrap();
    assert_eq!(trigger.check_period_seconds, Some(30));
    assert_eq!(trigger.timer, Some(Timer { start: "00:00".into(), end: "24:00".into() }));
    assert_eq!(
        trigger.condition,
        Some(TriggerCondition { operator: ">".into(), threshold: 100.0, metric: "num_of_samples".into() })
    );
    assert_eq!(spec.credential_name.as_deref(), Some("mysecret"));
    assert_eq!(spec.output_dir, "s3://kubeedge/sedna-robo/robo-demo");

    let train = container(&spec.train_spec.template);
    assert_eq!(args(train), ["train.py"]);
    assert_eq!(train.image.as_deref(), Some("docker.io/luosiqi/sedna-robo:v0.1.2"));
    assert_eq!(
        env(train),
        [
            ("num_class", "24"),
            ("epoches", "1"),
            ("attribute", "real, sim"),
            ("city", "berlin"),
            ("BACKEND_TYPE", "PYTORCH")
        ]
    );
    // `cpu: 6` is a YAML number; a Kubernetes quantity takes it.
    let resources = train.resources.as_ref().unwrap();
    assert_eq!(resources.limits.as_ref().unwrap().get("cpu"), Some(&quantity("6")));
    assert_eq!(resources.requests.as_ref().unwrap().get("cpu"), Some(&quantity("4")));
    assert_eq!(resources.limits.as_ref().unwrap().get("memory"), Some(&quantity("12Gi")));
    let train_pod = spec.train_spec.template.spec.as_ref().unwrap();
    assert_eq!(train_pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let cache = &train_pod.volumes.as_ref().unwrap()[0];
    let empty_dir = cache.empty_dir.as_ref().expect("emptyDir");
    assert_eq!(
        (cache.name.as_str(), empty_dir.medium.as_deref(), empty_dir.size_limit.as_ref()),
        ("cache-volume", Some("Memory"), Some(&quantity("256Mi")))
    );

    let eval = container(&spec.eval_spec.template);
    assert_eq!(args(eval), ["evaluate.py"]);
    assert_eq!(
        env(eval),
        [("operator", "<"), ("model_threshold", "0"), ("num_class", "24"), ("BACKEND_TYPE", "PYTORCH")]
    );

    let deploy_pod = spec.deploy_spec.template.spec.as_ref().unwrap();
    assert_eq!(deploy_pod.host_network, Some(true));
    assert_eq!(args(container(&spec.deploy_spec.template)), ["predict.py"]);
    assert_eq!(deploy_pod.volumes.as_ref().map(Vec::len), Some(3));

    // The job's Dataset is the one in the same file.
    let known = key(&dataset.metadata);
    validate_job(job, &|key: &str| key == known).unwrap();
}

/// The spec without the empty template `metadata` and container `resources` (`{}`, or
/// `creationTimestamp: null`) that kubectl prints.
fn without_empty_template_parts(mut spec: LifelongLearningJobSpec) -> LifelongLearningJobSpec {
    for template in [&mut spec.train_spec.template, &mut spec.eval_spec.template, &mut spec.deploy_spec.template] {
        let template = std::sync::Arc::make_mut(template);
        if template.metadata == Some(Default::default()) {
            template.metadata = None;
        }
        for container in template.spec.iter_mut().flat_map(|pod| pod.containers.iter_mut()) {
            if container.resources == Some(Default::default()) {
                container.resources = None;
            }
        }
    }
    spec
}

#[test]
fn sedna_status_reads_back() {
    let manifests = load_fixture("lifelonglearningjob-status.yaml");
    assert_eq!(manifests.len(), 1);
    let job = job(&manifests[0]);
    assert_eq!(key(&job.metadata), "default/atcii-classifier-demo");
    assert_eq!(job.metadata.uid.as_deref(), Some("0d7c5d0e-6a2b-4c3e-9f41-2b8e1f3c7a55"));
    assert_eq!(
        job.metadata.annotations.as_ref().and_then(|a| a.get("sedna.io/Train")).map(String::as_str),
        Some("edge-node")
    );
    // kubectl's form of the same spec (sorted keys, quoted times) reads as the sample does, but
    // for the empty `metadata` and `resources` the API server adds to the templates.
    assert_eq!(without_empty_template_parts(job.spec.clone()), without_empty_template_parts(atcii_job().spec));

    let status = job.status.as_ref().expect("status");
    let trace: Vec<(Stage, Phase, Option<&str>)> =
        status.conditions.iter().map(|c| (c.stage, c.type_, c.message.as_deref())).collect();
    let lc = Some("reported by lc");
    assert_eq!(
        trace,
        [
            (Stage::Train, Phase::Waiting, None),
            (Stage::Train, Phase::Ready, lc),
            (Stage::Train, Phase::Starting, None),
            (Stage::Train, Phase::Running, None),
            (Stage::Train, Phase::Completed, lc),
            (Stage::Eval, Phase::Waiting, None),
            (Stage::Eval, Phase::Ready, lc),
            (Stage::Eval, Phase::Starting, None),
        ]
    );
    for (i, condition) in status.conditions.iter().enumerate() {
        assert_eq!(condition.status, "True", "condition {i}");
        assert_eq!(condition.reason, None, "condition {i}");
        assert!(condition.last_heartbeat_time.is_some(), "condition {i}");
        assert_eq!(condition.last_heartbeat_time, condition.last_transition_time, "condition {i}");
        assert_eq!(condition.data.is_some(), condition.message.is_some(), "condition {i}: only the LC's carry data");
    }
    assert_eq!(status.conditions[0].last_heartbeat_time, Some(time("2024-05-06T01:58:12Z")));

    // `data` stays the JSON string Sedna wrote; it decodes as ConditionData (unknown keys such as
    // Sedna's `classes` are dropped).
    let data = |i: usize| -> ConditionData {
        let text = status.conditions[i].data.as_deref().unwrap_or_else(|| panic!("condition {i} has data"));
        serde_json::from_str(text).unwrap_or_else(|err| panic!("condition {i}: {err}: {text}"))
    };
    let model = Model {
        format: "pkl".into(),
        url: "/output/train/1/index.pkl".into(),
        metrics: Some(json!({"mlogloss": 0.4213})),
    };
    assert_eq!(
        data(1),
        ConditionData {
            input: Some(Input {
                models: vec![],
                data_url: Some("/output/data/train/1/data.csv".into()),
                data_index_url: Some("/data/trainData.csv".into()),
                output_dir: Some("/output/train/1".into()),
            }),
            output: None,
        }
    );
    assert_eq!(data(4), ConditionData { input: None, output: Some(Output { models: vec![model.clone()] }) });
    assert_eq!(
        data(6),
        ConditionData {
            input: Some(Input {
                models: vec![model],
                data_url: Some("/output/data/eval/1/data.csv".into()),
                data_index_url: Some("/data/trainData.csv".into()),
                output_dir: Some("/output/eval/1".into()),
            }),
            output: None,
        }
    );

    assert_eq!(
        status.knowledge_base,
        Some(json!({
            "AIClasses": {"numberOfAIClasses": 0},
            "AIModels": {"numberOfAIModels": 0},
            "samples": {"numberOfLabeledUnseenSample": 0, "numberOfUnseenSample": 0}
        }))
    );
    assert_eq!(status.start_time, Some(time("2024-05-06T01:58:12Z")));
    assert_eq!(status.completion_time, None);
    // Perennial's summary is absent from a status Sedna wrote.
    assert_eq!((status.stage, status.phase, status.round, status.retries), (None, None, 0, 0));
    assert!(status.worker.is_none() && status.deployed.is_none() && status.policies.is_empty());

    validate_job(job, &datasets(&["default/lifelong-dataset"])).unwrap();
}

#[test]
fn a_folder_loads_every_fixture_in_name_order() {
    let manifests = manifest::load(&[fixtures()]).unwrap();
    let seen: Vec<(String, usize, &str, String)> = manifests
        .iter()
        .map(|m| {
            let file = m.file.file_name().unwrap().to_string_lossy().into_owned();
            let (kind, meta) = match &m.object {
                Object::Dataset(d) => ("Dataset", &d.metadata),
                Object::Job(j) => ("LifelongLearningJob", &j.metadata),
                Object::Pod(p) => ("Pod", &p.metadata),
            };
            (file, m.document, kind, key(meta))
        })
        .collect();
    let expected = [
        ("dataset-atcii.yaml", 1, "Dataset", "default/lifelong-dataset"),
        ("lifelonglearningjob-atcii.yaml", 1, "LifelongLearningJob", "default/atcii-classifier-demo"),
        ("lifelonglearningjob-status.yaml", 1, "LifelongLearningJob", "default/atcii-classifier-demo"),
        ("robot-dog-delivery.yaml", 1, "Dataset", "default/lifelong-robo-dataset"),
        ("robot-dog-delivery.yaml", 2, "LifelongLearningJob", "default/robo-demo"),
    ];
    let expected: Vec<(String, usize, &str, String)> =
        expected.iter().map(|(f, d, k, n)| ((*f).to_owned(), *d, *k, (*n).to_owned())).collect();
    assert_eq!(seen, expected);
    for m in &manifests {
        assert!(m.file.starts_with(fixtures()), "{}", m.origin());
    }

    // Everything validates, each job against the Datasets of the set.
    let keys: BTreeSet<String> = manifests
        .iter()
        .filter_map(|m| match &m.object {
            Object::Dataset(d) => {
                validate_dataset(d).unwrap_or_else(|err| panic!("{}: {err}", m.origin()));
                Some(key(&d.metadata))
            }
            _ => None,
        })
        .collect();
    for m in &manifests {
        if let Object::Job(j) = &m.object {
            validate_job(j, &|k: &str| keys.contains(k)).unwrap_or_else(|err| panic!("{}: {err}", m.origin()));
        }
    }

    // Files and folders mix, in the order given.
    let mixed =
        manifest::load(&[fixture("robot-dog-delivery.yaml"), fixture("dataset-atcii.yaml"), fixtures()]).unwrap();
    assert_eq!(mixed.len(), 3 + manifests.len());
    assert_eq!(mixed[0].file, fixture("robot-dog-delivery.yaml"));
    assert_eq!(mixed[2].file, fixture("dataset-atcii.yaml"));
}

// ---------------------------------------------------------------------------------------------
// Round trip

/// Each fixture's objects serialize back with every value Sedna wrote at the same path, and read
/// back to the same object. Where the form changes, it says so.
#[test]
fn fixtures_round_trip_with_every_sedna_value() {
    // (file, document, the paths whose form changes)
    let status_changes = [
        "spec.deploySpec.template.metadata.creationTimestamp: null left out",
        "spec.evalSpec.template.metadata.creationTimestamp: null left out",
        "spec.trainSpec.template.metadata.creationTimestamp: null left out",
        "spec.trainSpec.trigger.condition.threshold: 500 -> 500.0",
    ];
    let cpu = |stage: &str, index: usize| {
        let container = format!("spec.{stage}.template.spec.containers[{index}].resources");
        [format!("{container}.limits.cpu: 6 -> \"6\""), format!("{container}.requests.cpu: 4 -> \"4\"")]
    };
    let mut robo: Vec<String> = ["trainSpec", "evalSpec", "deploySpec"].iter().flat_map(|s| cpu(s, 0)).collect();
    robo.push("spec.trainSpec.trigger.condition.threshold: 100 -> 100.0".into());
    let cases: Vec<(&str, usize, Vec<String>)> = vec![
        ("dataset-atcii.yaml", 1, vec![]),
        ("lifelonglearningjob-atcii.yaml", 1, vec!["spec.trainSpec.trigger.condition.threshold: 500 -> 500.0".into()]),
        ("lifelonglearningjob-status.yaml", 1, status_changes.iter().map(|s| (*s).to_owned()).collect()),
        ("robot-dog-delivery.yaml", 1, vec![]),
        ("robot-dog-delivery.yaml", 2, robo),
    ];
    for (file, document, expected_changes) in cases {
        let case = format!("{file} (document {document})");
        let manifests = load_fixture(file);
        let manifest = manifests.iter().find(|m| m.document == document).unwrap_or_else(|| panic!("{case}"));
        let original = &raw_documents(&fixture(file))[document - 1];
        let written = match &manifest.object {
            Object::Dataset(d) => serde_json::to_value(d),
            Object::Job(j) => serde_json::to_value(j),
            Object::Pod(p) => serde_json::to_value(p),
        }
        .unwrap();
        let mut changes = Vec::new();
        kept("", original, Some(&written), &mut changes);
        let mut changes: Vec<String> = changes.into_iter().map(|c| c.trim_start_matches('.').to_owned()).collect();
        changes.sort();
        let mut expected_changes = expected_changes;
        expected_changes.sort();
        assert_eq!(changes, expected_changes, "{case}");

        // And it reads back the same.
        match &manifest.object {
            Object::Dataset(d) => {
                let again: Dataset = serde_json::from_value(written).unwrap();
                assert_eq!((&again.metadata, &again.spec, &again.status), (&d.metadata, &d.spec, &d.status), "{case}");
            }
            Object::Job(j) => {
                let again: LifelongLearningJob = serde_json::from_value(written).unwrap();
                assert_eq!((&again.metadata, &again.spec, &again.status), (&j.metadata, &j.spec, &j.status), "{case}");
            }
            Object::Pod(_) => unreachable!(),
        }
    }
}

#[test]
fn serialized_job_keeps_sedna_names_and_leaves_out_absent_fields() {
    for file in ["lifelonglearningjob-atcii.yaml", "robot-dog-delivery.yaml", "lifelonglearningjob-status.yaml"] {
        let manifests = load_fixture(file);
        let job = job(manifests.last().unwrap());
        let json = serde_json::to_value(job).unwrap();
        assert_eq!(json["apiVersion"], "sedna.io/v1alpha1", "{file}");
        assert_eq!(json["kind"], "LifelongLearningJob", "{file}");
        let spec = &json["spec"];
        let mut expected = set(&["dataset", "trainSpec", "evalSpec", "deploySpec", "outputDir"]);
        if job.spec.credential_name.is_some() {
            expected.insert("credentialName");
        }
        assert_eq!(keys(spec), expected, "{file}: spec");
        assert_eq!(keys(&spec["dataset"]), set(&["name", "trainProb"]), "{file}: spec.dataset");
        assert_eq!(keys(&spec["trainSpec"]), set(&["template", "trigger"]), "{file}: spec.trainSpec");
        assert_eq!(
            keys(&spec["trainSpec"]["trigger"]),
            set(&["checkPeriodSeconds", "timer", "condition"]),
            "{file}: spec.trainSpec.trigger"
        );
        assert_eq!(keys(&spec["trainSpec"]["trigger"]["timer"]), set(&["start", "end"]), "{file}");
        assert_eq!(
            keys(&spec["trainSpec"]["trigger"]["condition"]),
            set(&["operator", "threshold", "metric"]),
            "{file}"
        );
        assert_eq!(keys(&spec["evalSpec"]), set(&["template"]), "{file}: spec.evalSpec");
        assert_eq!(keys(&spec["deploySpec"]), set(&["template"]), "{file}: spec.deploySpec");
        for stage in ["trainSpec", "evalSpec", "deploySpec"] {
            assert!(spec[stage]["template"]["spec"]["nodeName"].is_string(), "{file}: {stage}");
            assert!(spec[stage]["template"]["spec"]["containers"][0]["imagePullPolicy"].is_string(), "{file}");
        }
        // None of Perennial's optional fields anywhere.
        let mut names = BTreeSet::new();
        all_keys(&json, &mut names);
        for absent in ["splitPolicy", "policy", "selectPolicy", "timeoutSeconds", "evalSetSize"] {
            assert!(!names.contains(absent), "{file}: {absent} is written though absent");
        }
        assert_eq!(json.get("status").is_some(), job.status.is_some(), "{file}: status");
    }

    // The status: Sedna's names, `type` for the phase, `data` still a string.
    let manifests = load_fixture("lifelonglearningjob-status.yaml");
    let json = serde_json::to_value(job(&manifests[0])).unwrap();
    let status = &json["status"];
    // Sedna's keys, and Perennial's counters, written even at zero.
    assert_eq!(
        keys(status),
        set(&["conditions", "knowledgeBase", "startTime", "round", "retries", "roundsCompleted"]),
        "{status}"
    );
    assert_eq!((&status["round"], &status["retries"], &status["roundsCompleted"]), (&json!(0), &json!(0), &json!(0)));
    let ready = &status["conditions"][1];
    assert_eq!(
        keys(ready),
        set(&["type", "status", "stage", "lastHeartbeatTime", "lastTransitionTime", "message", "data"])
    );
    assert_eq!((&ready["type"], &ready["stage"], &ready["status"]), (&json!("Ready"), &json!("Train"), &json!("True")));
    assert_eq!(ready["lastHeartbeatTime"], "2024-05-06T02:03:40Z");
    assert!(ready["data"].as_str().unwrap().starts_with(r#"{"input":{"dataURL":"#));
    assert_eq!(
        keys(&status["conditions"][0]),
        set(&["type", "status", "stage", "lastHeartbeatTime", "lastTransitionTime"])
    );
}

#[test]
fn dataset_status_round_trips_under_sedna_names() {
    let text = r#"
apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata: {name: lifelong-dataset, namespace: default}
spec: {url: /data/trainData.csv, format: csv, nodeName: edge-node, credentialName: minio-secret}
status: {numberOfSamples: 1234, updateTime: "2024-05-06T02:03:30Z"}
"#;
    let manifests = manifest::parse(text, Path::new("inline.yaml")).unwrap();
    let dataset = dataset(&manifests[0]);
    assert_eq!(dataset.spec.credential_name.as_deref(), Some("minio-secret"));
    assert_eq!(
        dataset.status,
        Some(DatasetStatus { number_of_samples: 1234, update_time: Some(time("2024-05-06T02:03:30Z")) })
    );
    let json = serde_json::to_value(dataset).unwrap();
    assert_eq!(keys(&json["spec"]), set(&["url", "format", "nodeName", "credentialName"]));
    assert_eq!(json["status"], json!({"numberOfSamples": 1234, "updateTime": "2024-05-06T02:03:30Z"}));
    let again: Dataset = serde_json::from_value(json).unwrap();
    assert_eq!((again.spec, again.status), (dataset.spec.clone(), dataset.status.clone()));
}

// ---------------------------------------------------------------------------------------------
// Perennial's optional fields, and the built-in rules they default to

const SHA: &str = "3f5a0c1d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29";

/// The atcii job with every Perennial field set.
fn perennial_job_text() -> String {
    format!(
        r#"
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {{name: atcii-perennial, namespace: edge}}
spec:
  dataset:
    name: lifelong-dataset
    trainProb: 0.8
    splitPolicy:
      plugin: builtin:ratio-split
      config: {{trainProb: 0.7}}
  trainSpec:
    timeoutSeconds: 3600
    template:
      spec:
        containers: [{{name: train-worker, image: "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0"}}]
    trigger:
      checkPeriodSeconds: 30
      policy:
        plugin: https://plugins.example.org/count-or-age-trigger.wasm
        sha256: {SHA}
        config: {{count: 100, maxAgeSeconds: 86400}}
        limits: {{timeoutMs: 50, memoryMiB: 16}}
        onError: hold
  evalSpec:
    timeoutSeconds: 600
    template:
      spec:
        containers: [{{name: eval-worker, image: "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0"}}]
  deploySpec:
    timeoutSeconds: 120
    selectPolicy:
      plugin: builtin:metric-select
      config: {{metric: precision_score, mode: max}}
    template:
      spec:
        containers: [{{name: infer-worker, image: "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0"}}]
  outputDir: s3://bucket/atcii
"#
    )
}

#[test]
fn perennial_optional_fields_parse_and_are_the_policies_used() {
    let manifests = manifest::parse(&perennial_job_text(), Path::new("perennial.yaml")).unwrap();
    let job = job(&manifests[0]);
    let spec = &job.spec;

    let split = spec.dataset.split_policy.as_ref().expect("splitPolicy");
    assert_eq!(split, &PolicyRef::new("builtin:ratio-split").with_config(json!({"trainProb": 0.7})));

    let trigger = PolicyRef {
        plugin: "https://plugins.example.org/count-or-age-trigger.wasm".into(),
        sha256: Some(SHA.into()),
        config: Some(json!({"count": 100, "maxAgeSeconds": 86400})),
        limits: Limits { timeout_ms: 50, memory_mib: 16, start_timeout_ms: 2000 },
        on_error: OnError::Hold,
        shadow: None,
    };
    assert_eq!(spec.train_spec.trigger.as_ref().and_then(|t| t.policy.as_ref()), Some(&trigger));
    assert_eq!(spec.trigger_policy(), trigger);

    let select =
        PolicyRef::new("builtin:metric-select").with_config(json!({"metric": "precision_score", "mode": "max"}));
    assert_eq!(spec.deploy_spec.select_policy.as_ref(), Some(&select));
    assert_eq!(spec.select_policy(), select);

    assert_eq!(
        (spec.train_spec.timeout_seconds, spec.eval_spec.timeout_seconds, spec.deploy_spec.timeout_seconds),
        (Some(3600), Some(600), Some(120))
    );
    validate_job(job, &datasets(&["edge/lifelong-dataset"])).unwrap();

    // Written back under their names.
    let json = serde_json::to_value(job).unwrap();
    let spec = &json["spec"];
    assert_eq!(spec["dataset"]["splitPolicy"]["plugin"], "builtin:ratio-split");
    assert_eq!(
        spec["trainSpec"]["trigger"]["policy"],
        json!({
            "plugin": "https://plugins.example.org/count-or-age-trigger.wasm",
            "sha256": SHA,
            "config": {"count": 100, "maxAgeSeconds": 86400},
            "limits": {"timeoutMs": 50, "memoryMiB": 16, "startTimeoutMs": 2000},
            "onError": "hold"
        })
    );
    assert_eq!(spec["deploySpec"]["selectPolicy"]["plugin"], "builtin:metric-select");
    for (stage, seconds) in [("trainSpec", 3600), ("evalSpec", 600), ("deploySpec", 120)] {
        assert_eq!(spec[stage]["timeoutSeconds"], seconds, "{stage}");
    }
    let again: LifelongLearningJob = serde_json::from_value(json).unwrap();
    assert_eq!(&again.spec, &job.spec);
}

#[test]
fn absent_policies_are_sedna_rules() {
    // (fixture, the trigger config Sedna's fields make)
    let cases = [
        (
            "lifelonglearningjob-atcii.yaml",
            json!({
                "checkPeriodSeconds": 60,
                "timer": {"start": "02:00", "end": "24:00"},
                "condition": {"operator": ">", "threshold": 500.0, "metric": "num_of_samples"}
            }),
        ),
        (
            "robot-dog-delivery.yaml",
            json!({
                "checkPeriodSeconds": 30,
                "timer": {"start": "00:00", "end": "24:00"},
                "condition": {"operator": ">", "threshold": 100.0, "metric": "num_of_samples"}
            }),
        ),
    ];
    for (file, config) in cases {
        let manifests = load_fixture(file);
        let spec = &job(manifests.last().unwrap()).spec;
        let trigger = spec.trigger_policy();
        assert_eq!(trigger, PolicyRef::new("builtin:threshold-trigger").with_config(config), "{file}");
        assert_eq!(trigger.limits, Limits::default(), "{file}");
        assert_eq!(trigger.on_error, OnError::Fallback, "{file}");
        assert_eq!(trigger.validate().unwrap().source, Source::Builtin("threshold-trigger".into()), "{file}");
        let select = spec.select_policy();
        assert_eq!(select, PolicyRef::new("builtin:first-select"), "{file}");
        assert_eq!(select.validate().unwrap().source, Source::Builtin("first-select".into()), "{file}");
    }

    // A policy wins over Sedna's condition beside it; no trigger at all is an empty config.
    let mut spec = atcii_job().spec;
    let policy = PolicyRef::new("builtin:threshold-trigger")
        .with_config(json!({"condition": {"operator": "ge", "threshold": 1}}));
    spec.train_spec.trigger.as_mut().unwrap().policy = Some(policy.clone());
    assert_eq!(spec.trigger_policy(), policy);
    spec.train_spec.trigger = None;
    assert_eq!(spec.trigger_policy(), PolicyRef::new("builtin:threshold-trigger").with_config(json!({})));
}

/// Loads `spec.trigger_policy()` into the real built-in component, as the edge does.
fn configure_builtin_trigger(spec: &LifelongLearningJobSpec) -> Result<String, String> {
    let reference = spec.trigger_policy();
    let valid = reference.validate()?;
    let Source::Builtin(name) = &valid.source else { panic!("not a built-in: {}", reference.plugin) };
    let bytes = builtin::component(name).expect("built in");
    let host = PolicyHost::new(None, None).map_err(|err| err.to_string())?;
    let events = Arc::new(TracingEvents { job: "test".into() });
    let policy = host.load_bytes::<TriggerKind>(&valid, bytes, events).map_err(|err| err.to_string())?;
    Ok(policy.config().to_owned())
}

/// What validation accepts, the built-in trigger takes: Sedna's fixtures and the variations
/// the validation table accepts.
#[test]
fn the_builtin_trigger_takes_what_validation_accepts() {
    let mut specs: Vec<(String, LifelongLearningJobSpec)> = Vec::new();
    for file in ["lifelonglearningjob-atcii.yaml", "robot-dog-delivery.yaml", "lifelonglearningjob-status.yaml"] {
        let manifests = load_fixture(file);
        specs.push((file.to_owned(), job(manifests.last().unwrap()).spec.clone()));
    }
    let base = atcii_job();
    type TriggerEdit = Box<dyn Fn(&mut Trigger)>;
    let variations: Vec<(String, TriggerEdit)> = vec![
        ("no timer".into(), Box::new(|t| t.timer = None)),
        ("no checkPeriodSeconds".into(), Box::new(|t| t.check_period_seconds = None)),
        (
            "timer 22:00-02:00".into(),
            Box::new(|t| t.timer = Some(Timer { start: "22:00".into(), end: "02:00".into() })),
        ),
        (
            "timer 00:00-23:59".into(),
            Box::new(|t| t.timer = Some(Timer { start: "00:00".into(), end: "23:59".into() })),
        ),
        (
            "timer 08:00-08:00, one minute".into(),
            Box::new(|t| t.timer = Some(Timer { start: "08:00".into(), end: "08:00".into() })),
        ),
        ("checkPeriodSeconds 0".into(), Box::new(|t| t.check_period_seconds = Some(0))),
        ("checkPeriodSeconds 15".into(), Box::new(|t| t.check_period_seconds = Some(15))),
    ];
    let variations = variations
        .into_iter()
        .chain(OPERATORS.iter().map(|op| -> (String, TriggerEdit) {
            (format!("operator {op}"), Box::new(move |t| t.condition.as_mut().unwrap().operator = (*op).into()))
        }))
        .chain(METRICS.iter().map(|metric| -> (String, TriggerEdit) {
            (format!("metric {metric}"), Box::new(move |t| t.condition.as_mut().unwrap().metric = (*metric).into()))
        }));
    for (case, edit) in variations {
        let mut job = base.clone();
        edit(job.spec.train_spec.trigger.as_mut().unwrap());
        specs.push((case, job.spec));
    }
    for (case, spec) in specs {
        let job = LifelongLearningJob::new("atcii-classifier-demo", spec.clone());
        let accepted = validate_job(&job, &|_: &str| true);
        assert!(accepted.is_ok(), "{case}: {accepted:?}");
        let config = configure_builtin_trigger(&spec).unwrap_or_else(|err| panic!("{case}: {err}"));
        let config: Value = serde_json::from_str(&config).unwrap();
        assert_eq!(Some(config), spec.trigger_policy().config, "{case}");
    }
}

#[test]
fn bug_check_period_zero_validates_but_the_builtin_trigger_refuses_it() {
    let mut job = atcii_job();
    job.spec.train_spec.trigger.as_mut().unwrap().check_period_seconds = Some(0);
    if validate_job(&job, &datasets(&["default/lifelong-dataset"])).is_ok() {
        let configured = configure_builtin_trigger(&job.spec);
        assert!(configured.is_ok(), "checkPeriodSeconds 0 validates, and then: {configured:?}");
    }
}

#[test]
fn bug_timer_with_a_plus_sign_validates_but_the_builtin_trigger_refuses_it() {
    let mut job = atcii_job();
    job.spec.train_spec.trigger.as_mut().unwrap().timer = Some(Timer { start: "+2:00".into(), end: "02:00".into() });
    let validated = validate_job(&job, &datasets(&["default/lifelong-dataset"]));
    let configured = configure_builtin_trigger(&job.spec);
    assert_eq!(validated.is_ok(), configured.is_ok(), "validation: {validated:?}; the trigger: {configured:?}");
    let errors = validated.unwrap_err().errors;
    assert!(errors.iter().any(|e| e.starts_with("spec.trainSpec.trigger.timer.start: \"+2:00\"")), "{errors:?}");
}

// ---------------------------------------------------------------------------------------------
// Validation: one case per rule

type JobEdit = Box<dyn Fn(&mut LifelongLearningJob)>;

/// A change to the atcii job and the errors it must give, each `(field, reason)`: the line starts
/// with `field: ` and contains `reason`. No errors: it must validate.
struct JobCase {
    case: String,
    edit: JobEdit,
    errors: Vec<(String, String)>,
}

fn case(
    name: impl Into<String>,
    edit: impl Fn(&mut LifelongLearningJob) + 'static,
    errors: &[(&str, &str)],
) -> JobCase {
    JobCase {
        case: name.into(),
        edit: Box::new(edit),
        errors: errors.iter().map(|(f, r)| ((*f).to_owned(), (*r).to_owned())).collect(),
    }
}

fn trigger_mut(job: &mut LifelongLearningJob) -> &mut Trigger {
    job.spec.train_spec.trigger.as_mut().unwrap()
}

fn condition_mut(job: &mut LifelongLearningJob) -> &mut TriggerCondition {
    trigger_mut(job).condition.as_mut().unwrap()
}

fn timer(start: &'static str, end: &'static str) -> impl Fn(&mut LifelongLearningJob) {
    move |job| trigger_mut(job).timer = Some(Timer { start: start.into(), end: end.into() })
}

/// Checks that `errors` are exactly `expected`, each line naming its field and reason.
fn assert_errors(case: &str, errors: &[String], expected: &[(String, String)]) {
    assert_eq!(errors.len(), expected.len(), "{case}: {errors:#?}");
    for (field, reason) in expected {
        let found = errors.iter().any(|line| line.starts_with(&format!("{field}: ")) && line.contains(reason.as_str()));
        assert!(found, "{case}: no error `{field}: ...{reason}...` in {errors:#?}");
    }
}

fn run_job_cases(cases: Vec<JobCase>) {
    let base = atcii_job();
    let exists = datasets(&["default/lifelong-dataset"]);
    for JobCase { case, edit, errors } in cases {
        let mut job = base.clone();
        edit(&mut job);
        match (validate_job(&job, &exists), errors.is_empty()) {
            (Ok(()), true) => {}
            (Ok(()), false) => panic!("{case}: accepted, expected {errors:?}"),
            (Err(err), true) => panic!("{case}: refused: {err}"),
            (Err(err), false) => {
                assert_eq!(err.object, format!("LifelongLearningJob {}", key(&job.metadata)), "{case}");
                assert_errors(&case, &err.errors, &errors);
            }
        }
    }
}

#[test]
fn validate_job_train_prob() {
    run_job_cases(vec![
        case(
            "trainProb -0.1",
            |j| j.spec.dataset.train_prob = -0.1,
            &[("spec.dataset.trainProb", "-0.1 is outside [0, 1]")],
        ),
        case(
            "trainProb 1.5",
            |j| j.spec.dataset.train_prob = 1.5,
            &[("spec.dataset.trainProb", "1.5 is outside [0, 1]")],
        ),
        case("trainProb NaN", |j| j.spec.dataset.train_prob = f64::NAN, &[("spec.dataset.trainProb", "is outside")]),
        case("trainProb 0", |j| j.spec.dataset.train_prob = 0.0, &[]),
        case("trainProb 1", |j| j.spec.dataset.train_prob = 1.0, &[]),
    ]);
}

#[test]
fn validate_job_trigger_condition() {
    let mut cases = vec![
        case(
            "operator ~=",
            |j| condition_mut(j).operator = "~=".into(),
            &[(
                "spec.trainSpec.trigger.condition.operator",
                "\"~=\" is not one of > gt >= ge < lt <= le = == eq != ne",
            )],
        ),
        case(
            "operator empty",
            |j| condition_mut(j).operator = String::new(),
            &[("spec.trainSpec.trigger.condition.operator", "\"\" is not one of")],
        ),
        case(
            "metric accuracy",
            |j| condition_mut(j).metric = "accuracy".into(),
            &[(
                "spec.trainSpec.trigger.condition.metric",
                "\"accuracy\" is not one of num_of_samples, num_of_eval_samples, total_samples, rounds_completed",
            )],
        ),
        case(
            "threshold infinite",
            |j| condition_mut(j).threshold = f64::INFINITY,
            &[("spec.trainSpec.trigger.condition.threshold", "inf is not a number")],
        ),
        case("threshold negative", |j| condition_mut(j).threshold = -3.5, &[]),
        case(
            "no condition",
            |j| trigger_mut(j).condition = None,
            &[("spec.trainSpec.trigger.condition", "missing; give operator, threshold and metric, or a policy")],
        ),
        case(
            "no trigger",
            |j| j.spec.train_spec.trigger = None,
            &[("spec.trainSpec.trigger", "missing; give Sedna's condition or a policy")],
        ),
        case(
            "checkPeriodSeconds -1",
            |j| trigger_mut(j).check_period_seconds = Some(-1),
            &[("spec.trainSpec.trigger.checkPeriodSeconds", "negative")],
        ),
        case("no checkPeriodSeconds", |j| trigger_mut(j).check_period_seconds = None, &[]),
        case(
            "a trigger policy: Sedna's condition beside it is its fallback, checked all the same",
            |j| {
                let trigger = trigger_mut(j);
                trigger.policy = Some(PolicyRef::new("builtin:threshold-trigger"));
                trigger.timer = None;
                trigger.condition.as_mut().unwrap().operator = "~=".into();
            },
            &[("spec.trainSpec.trigger.condition.operator", "\"~=\" is not one of")],
        ),
        case(
            "a trigger policy and a window that is not the whole day",
            |j| {
                let trigger = trigger_mut(j);
                trigger.policy = Some(PolicyRef::new("builtin:threshold-trigger"));
                trigger.timer = Some(Timer { start: "02:00".into(), end: "24:00".into() });
            },
            &[("spec.trainSpec.trigger.timer", "02:00-24:00 does not gate trigger.policy")],
        ),
        case(
            "a trigger policy and the whole day's window (it gates nothing)",
            |j| {
                let trigger = trigger_mut(j);
                trigger.policy = Some(PolicyRef::new("builtin:threshold-trigger"));
                trigger.timer = Some(Timer { start: "00:00".into(), end: "24:00".into() });
            },
            &[],
        ),
        case(
            "a trigger policy and no condition",
            |j| {
                let trigger = trigger_mut(j);
                trigger.policy = Some(PolicyRef::new("builtin:threshold-trigger"));
                trigger.timer = None;
                trigger.condition = None;
            },
            &[],
        ),
    ];
    for op in OPERATORS {
        cases.push(case(format!("operator {op}"), move |j| condition_mut(j).operator = op.into(), &[]));
    }
    for metric in METRICS {
        cases.push(case(format!("metric {metric}"), move |j| condition_mut(j).metric = metric.into(), &[]));
    }
    run_job_cases(cases);
}

#[test]
fn validate_job_trigger_timer() {
    let not_a_time = "is not a time HH:MM (00:00 to 23:59, or 24:00 as an end)";
    let start = "spec.trainSpec.trigger.timer.start";
    let end = "spec.trainSpec.trigger.timer.end";
    run_job_cases(vec![
        case("start 25:00", timer("25:00", "24:00"), &[(start, &format!("\"25:00\" {not_a_time}"))]),
        case("start 2:00", timer("2:00", "24:00"), &[(start, &format!("\"2:00\" {not_a_time}"))]),
        case("start 02:60", timer("02:60", "24:00"), &[(start, &format!("\"02:60\" {not_a_time}"))]),
        case("start 0200", timer("0200", "24:00"), &[(start, "\"0200\" is not a time")]),
        case("start empty", timer("", "24:00"), &[(start, "\"\" is not a time")]),
        case("start 24:00", timer("24:00", "02:00"), &[(start, "\"24:00\" is not a time")]),
        case("end 24:01", timer("02:00", "24:01"), &[(end, "\"24:01\" is not a time")]),
        case("end 2:00", timer("22:00", "2:00"), &[(end, "\"2:00\" is not a time")]),
        case("start == end: Sedna's one-minute window", timer("08:00", "08:00"), &[]),
        case("end 24:00", timer("02:00", "24:00"), &[]),
        case("all day 00:00-24:00", timer("00:00", "24:00"), &[]),
        case("wraps midnight 22:00-02:00", timer("22:00", "02:00"), &[]),
        case("start 23:59", timer("23:59", "24:00"), &[]),
        case("no timer", |j| trigger_mut(j).timer = None, &[]),
    ]);
}

#[test]
fn validate_job_output_dir() {
    run_job_cases(vec![
        case(
            "outputDir http://x/y",
            |j| j.spec.output_dir = "http://x/y".into(),
            &[("spec.outputDir", "\"http://x/y\": scheme http:// is not supported; use a path or s3://")],
        ),
        case(
            "outputDir s3://",
            |j| j.spec.output_dir = "s3://".into(),
            &[("spec.outputDir", "\"s3://\" has no bucket (s3://bucket/key)")],
        ),
        case(
            "outputDir s3:///prefix",
            |j| j.spec.output_dir = "s3:///prefix".into(),
            &[("spec.outputDir", "has no bucket")],
        ),
        case(
            "outputDir empty",
            |j| j.spec.output_dir = " ".into(),
            &[("spec.outputDir", "empty; give a path or s3://bucket/prefix")],
        ),
        case("outputDir /output", |j| j.spec.output_dir = "/output".into(), &[]),
        case("outputDir s3://bucket/prefix", |j| j.spec.output_dir = "s3://bucket/prefix".into(), &[]),
        case("outputDir s3://bucket", |j| j.spec.output_dir = "s3://bucket".into(), &[]),
    ]);
}

/// A job's Secret is one of its own namespace: another namespace's is refused by name, before
/// the operator would read it.
#[test]
fn validate_job_credential_name() {
    run_job_cases(vec![
        case("credentialName minio", |j| j.spec.credential_name = Some("minio".into()), &[]),
        case("credentialName blank", |j| j.spec.credential_name = Some(String::new()), &[]),
        case(
            "credentialName other/db-password",
            |j| j.spec.credential_name = Some("other/db-password".into()),
            &[("spec.credentialName", "names the Secret \"db-password\" of namespace \"other\"")],
        ),
        case(
            "credentialName ../x",
            |j| j.spec.credential_name = Some("../x".into()),
            &[("spec.credentialName", "is not a Secret's name in this namespace (default)")],
        ),
    ]);
}

#[test]
fn validate_job_dataset_reference() {
    run_job_cases(vec![
        case(
            "no such Dataset",
            |j| j.spec.dataset.name = "other".into(),
            &[("spec.dataset.name", "no Dataset \"other\" in namespace default")],
        ),
        case(
            "the Dataset is in another namespace",
            |j| j.metadata.namespace = Some("edge".into()),
            &[("spec.dataset.name", "no Dataset \"lifelong-dataset\" in namespace edge")],
        ),
        case("explicit default namespace", |j| j.metadata.namespace = Some("default".into()), &[]),
        case("empty dataset name", |j| j.spec.dataset.name = String::new(), &[("spec.dataset.name", "empty")]),
    ]);

    // The lookup is by `namespace/name`, the job's namespace.
    let mut job = atcii_job();
    job.metadata.namespace = Some("edge".into());
    let asked = std::cell::RefCell::new(Vec::new());
    validate_job(&job, &|key: &str| {
        asked.borrow_mut().push(key.to_owned());
        true
    })
    .unwrap();
    assert_eq!(asked.into_inner(), ["edge/lifelong-dataset"]);
}

/// The cases without Sedna's sample's 02:00-24:00 window, which a trigger policy refuses beside
/// it (a case of its own in `validate_job_trigger_condition`).
fn without_window(cases: Vec<JobCase>) -> Vec<JobCase> {
    let without = |JobCase { case, edit, errors }: JobCase| {
        let edit: JobEdit = Box::new(move |job: &mut LifelongLearningJob| {
            trigger_mut(job).timer = None;
            edit(job)
        });
        JobCase { case, edit, errors }
    };
    cases.into_iter().map(without).collect()
}

#[test]
fn validate_job_policy_references() {
    run_job_cases(without_window(vec![
        case(
            "splitPolicy builtin:nope",
            |j| j.spec.dataset.split_policy = Some(PolicyRef::new("builtin:nope")),
            &[("spec.dataset.splitPolicy.plugin", "unknown built-in \"nope\"; built-ins are")],
        ),
        case(
            "trigger policy https without sha256",
            |j| trigger_mut(j).policy = Some(https_no_sha_ref()),
            &[(
                "spec.trainSpec.trigger.policy.sha256",
                "required for a remote plugin (https://plugins.example.org/trigger.wasm)",
            )],
        ),
        case(
            "trigger policy https with sha256",
            |j| trigger_mut(j).policy = Some(PolicyRef { sha256: Some(SHA.into()), ..https_no_sha_ref() }),
            &[],
        ),
        case(
            "trigger policy http://",
            |j| trigger_mut(j).policy = Some(PolicyRef::new("http://x.org/p.wasm")),
            &[("spec.trainSpec.trigger.policy.plugin", "plain http:// is not allowed")],
        ),
        case(
            "selectPolicy sha256 xyz",
            |j| {
                j.spec.deploy_spec.select_policy =
                    Some(PolicyRef { sha256: Some("xyz".into()), ..PolicyRef::new("builtin:first-select") })
            },
            &[("spec.deploySpec.selectPolicy.sha256", "\"xyz\" is not 64 hex digits")],
        ),
        case(
            "selectPolicy limits.timeoutMs 0",
            |j| {
                let limits = Limits { timeout_ms: 0, ..Limits::default() };
                j.spec.deploy_spec.select_policy = Some(PolicyRef { limits, ..PolicyRef::new("builtin:first-select") })
            },
            &[("spec.deploySpec.selectPolicy.limits.timeoutMs", "0 is outside 1..=60000")],
        ),
        case(
            "splitPolicy file:// relative",
            |j| j.spec.dataset.split_policy = Some(PolicyRef::new("file://split.wasm")),
            &[("spec.dataset.splitPolicy.plugin", "a file:// URL needs an absolute path")],
        ),
        case(
            "every policy a built-in",
            |j| {
                j.spec.dataset.split_policy = Some(PolicyRef::new("builtin:ratio-split"));
                trigger_mut(j).policy = Some(PolicyRef::new("builtin:threshold-trigger"));
                j.spec.deploy_spec.select_policy = Some(PolicyRef::new("builtin:metric-select"));
            },
            &[],
        ),
    ]));
}

fn https_no_sha_ref() -> PolicyRef {
    PolicyRef::new("https://plugins.example.org/trigger.wasm")
}

#[test]
fn validate_job_templates_and_timeouts() {
    run_job_cases(vec![
        case(
            "train template with no containers",
            |j| std::sync::Arc::make_mut(&mut j.spec.train_spec.template).spec.as_mut().unwrap().containers.clear(),
            &[("spec.trainSpec.template.spec.containers", "a worker template needs at least one container")],
        ),
        case(
            "eval template with no spec",
            |j| std::sync::Arc::make_mut(&mut j.spec.eval_spec.template).spec = None,
            &[("spec.evalSpec.template.spec.containers", "a worker template needs at least one container")],
        ),
        case(
            "deploy template with no containers",
            |j| std::sync::Arc::make_mut(&mut j.spec.deploy_spec.template).spec.as_mut().unwrap().containers.clear(),
            &[("spec.deploySpec.template.spec.containers", "at least one container")],
        ),
        case(
            "train timeoutSeconds 0",
            |j| j.spec.train_spec.timeout_seconds = Some(0),
            &[("spec.trainSpec.timeoutSeconds", "0; leave it out for no timeout")],
        ),
        case(
            "evalSetSize 0",
            |j| j.spec.eval_spec.eval_set_size = Some(0),
            &[("spec.evalSpec.evalSetSize", "0; leave it out for the default of 100 eval samples")],
        ),
        case("evalSetSize 1", |j| j.spec.eval_spec.eval_set_size = Some(1), &[]),
        case(
            "eval timeoutSeconds 0",
            |j| j.spec.eval_spec.timeout_seconds = Some(0),
            &[("spec.evalSpec.timeoutSeconds", "0; leave it out")],
        ),
        case(
            "deploy timeoutSeconds 0",
            |j| j.spec.deploy_spec.timeout_seconds = Some(0),
            &[("spec.deploySpec.timeoutSeconds", "0; leave it out")],
        ),
        case(
            "timeoutSeconds 1 everywhere",
            |j| {
                j.spec.train_spec.timeout_seconds = Some(1);
                j.spec.eval_spec.timeout_seconds = Some(1);
                j.spec.deploy_spec.timeout_seconds = Some(1);
            },
            &[],
        ),
    ]);
}

#[test]
fn validate_job_metadata_name() {
    let not_dns = "is not a DNS-1123 name";
    run_job_cases(vec![
        case("no name", |j| j.metadata.name = None, &[("metadata.name", "missing")]),
        case("empty name", |j| j.metadata.name = Some(String::new()), &[("metadata.name", "missing")]),
        case(
            "upper case and _",
            |j| j.metadata.name = Some("Atcii_Demo".into()),
            &[("metadata.name", &format!("\"Atcii_Demo\" {not_dns}"))],
        ),
        case("leading -", |j| j.metadata.name = Some("-atcii".into()), &[("metadata.name", not_dns)]),
        case("trailing -", |j| j.metadata.name = Some("atcii-".into()), &[("metadata.name", not_dns)]),
        case("64 characters", |j| j.metadata.name = Some("a".repeat(64)), &[("metadata.name", not_dns)]),
        case("63 characters", |j| j.metadata.name = Some("a".repeat(63)), &[]),
        case("digits and dots", |j| j.metadata.name = Some("atcii.v2-1".into()), &[]),
    ]);
}

#[test]
fn validate_job_reports_every_error_at_once() {
    let mut job = atcii_job();
    job.metadata.name = Some("Bad_Name".into());
    job.spec.dataset.name = "missing".into();
    job.spec.dataset.train_prob = 1.5;
    condition_mut(&mut job).operator = "~=".into();
    condition_mut(&mut job).metric = "accuracy".into();
    trigger_mut(&mut job).timer = Some(Timer { start: "25:00".into(), end: "2:00".into() });
    std::sync::Arc::make_mut(&mut job.spec.eval_spec.template).spec.as_mut().unwrap().containers.clear();
    job.spec.deploy_spec.timeout_seconds = Some(0);
    job.spec.deploy_spec.select_policy = Some(PolicyRef::new("builtin:nope"));
    job.spec.output_dir = "http://x/y".into();
    let err = validate_job(&job, &datasets(&["default/lifelong-dataset"])).unwrap_err();
    let expected: Vec<(String, String)> = [
        ("metadata.name", "\"Bad_Name\" is not a DNS-1123 name"),
        ("spec.dataset.name", "no Dataset \"missing\""),
        ("spec.dataset.trainProb", "1.5 is outside [0, 1]"),
        ("spec.trainSpec.trigger.condition.operator", "\"~=\" is not one of"),
        ("spec.trainSpec.trigger.condition.metric", "\"accuracy\" is not one of"),
        ("spec.trainSpec.trigger.timer.start", "\"25:00\" is not a time"),
        ("spec.trainSpec.trigger.timer.end", "\"2:00\" is not a time"),
        ("spec.deploySpec.selectPolicy.plugin", "unknown built-in \"nope\""),
        ("spec.evalSpec.template.spec.containers", "at least one container"),
        ("spec.deploySpec.timeoutSeconds", "0; leave it out"),
        ("spec.outputDir", "scheme http:// is not supported"),
    ]
    .iter()
    .map(|(f, r)| ((*f).to_owned(), (*r).to_owned()))
    .collect();
    assert_errors("every error", &err.errors, &expected);
    assert_eq!(err.object, "LifelongLearningJob default/Bad_Name");
    // One message: the object, then every line.
    let message = err.to_string();
    assert!(message.starts_with("LifelongLearningJob default/Bad_Name: metadata.name: "), "{message}");
    for line in &err.errors {
        assert!(message.contains(line.as_str()), "{message} lacks {line}");
    }
    assert_eq!(message, format!("{}: {}", err.object, err.errors.join("; ")));
}

#[test]
fn validate_dataset_rules() {
    type DatasetEdit = Box<dyn Fn(&mut Dataset)>;
    type DatasetCase = (&'static str, DatasetEdit, Vec<(&'static str, &'static str)>);
    let base = atcii_dataset();
    let cases: Vec<DatasetCase> = vec![
        (
            "format json",
            Box::new(|d| d.spec.format = "json".into()),
            vec![("spec.format", "\"json\" is neither txt nor csv")],
        ),
        ("format empty", Box::new(|d| d.spec.format = String::new()), vec![("spec.format", "is neither txt nor csv")]),
        ("format CSV", Box::new(|d| d.spec.format = "CSV".into()), vec![]),
        ("format Txt", Box::new(|d| d.spec.format = "Txt".into()), vec![]),
        ("format txt", Box::new(|d| d.spec.format = "txt".into()), vec![]),
        (
            "nodeName empty",
            Box::new(|d| d.spec.node_name = String::new()),
            vec![("spec.nodeName", "empty; name the node whose agent watches the index")],
        ),
        ("nodeName blank", Box::new(|d| d.spec.node_name = "  ".into()), vec![("spec.nodeName", "empty")]),
        (
            "url ftp://",
            Box::new(|d| d.spec.url = "ftp://host/trainData.csv".into()),
            vec![("spec.url", "\"ftp://host/trainData.csv\": scheme ftp:// is not supported")],
        ),
        (
            "url https://",
            Box::new(|d| d.spec.url = "https://host/trainData.csv".into()),
            vec![("spec.url", "scheme https:// is not supported")],
        ),
        ("url s3://", Box::new(|d| d.spec.url = "s3://".into()), vec![("spec.url", "has no bucket")]),
        (
            "url empty",
            Box::new(|d| d.spec.url = String::new()),
            vec![("spec.url", "empty; give the index file's path or s3://bucket/key")],
        ),
        ("url s3://bucket/key", Box::new(|d| d.spec.url = "s3://bucket/data/index.txt".into()), vec![]),
        ("credentialName", Box::new(|d| d.spec.credential_name = Some("minio".into())), vec![]),
        ("credentialName dotted", Box::new(|d| d.spec.credential_name = Some("s3.minio-1".into())), vec![]),
        (
            "credentialName of another namespace",
            Box::new(|d| d.spec.credential_name = Some("other/db-password".into())),
            vec![(
                "spec.credentialName",
                "names the Secret \"db-password\" of namespace \"other\": a job or Dataset may use only a Secret of its own namespace",
            )],
        ),
        (
            "credentialName reaching out of its path",
            Box::new(|d| d.spec.credential_name = Some("../../other/secrets/db-password".into())),
            vec![("spec.credentialName", "is not a Secret's name in this namespace")],
        ),
        (
            "bad name",
            Box::new(|d| d.metadata.name = Some("Lifelong_Dataset".into())),
            vec![("metadata.name", "is not a DNS-1123 name")],
        ),
        (
            "several at once",
            Box::new(|d| {
                d.spec.format = "json".into();
                d.spec.node_name = String::new();
                d.spec.url = "ftp://x/y".into();
            }),
            vec![("spec.format", "neither"), ("spec.nodeName", "empty"), ("spec.url", "ftp://")],
        ),
    ];
    for (case, edit, expected) in cases {
        let mut dataset = base.clone();
        edit(&mut dataset);
        let expected: Vec<(String, String)> =
            expected.iter().map(|(f, r)| ((*f).to_owned(), (*r).to_owned())).collect();
        match validate_dataset(&dataset) {
            Ok(()) => assert!(expected.is_empty(), "{case}: accepted, expected {expected:?}"),
            Err(err) => {
                assert!(!expected.is_empty(), "{case}: refused: {err}");
                assert_eq!(err.object, format!("Dataset {}", key(&dataset.metadata)), "{case}");
                assert_errors(case, &err.errors, &expected);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Manifest errors name the file, the document and the field

/// Writes `text` to `name` in `dir` and loads it, expecting a document error.
fn document_error(dir: &Path, name: &str, text: &str) -> (String, usize, String, String) {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    match manifest::load(std::slice::from_ref(&path)) {
        Err(err @ ManifestError::Document { .. }) => {
            let display = err.to_string();
            let ManifestError::Document { path: p, document, message } = err else { unreachable!() };
            (p, document, message, display)
        }
        other => panic!("{name}: expected a document error, got {other:?}"),
    }
}

const DATASET: &str = "apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata: {name: lifelong-dataset}
spec: {url: /data/trainData.csv, format: csv, nodeName: edge-node}
";

/// A minimal job with `spec.dataset` replaced by `dataset` (YAML flow text).
fn job_text(dataset: &str, extra_train: &str) -> String {
    format!(
        "apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {{name: demo}}
spec:
  dataset: {dataset}
  trainSpec:
    template: {{spec: {{containers: [{{name: t, image: i}}]}}}}
    trigger: {{condition: {{operator: '>', threshold: 1, metric: num_of_samples}}}}
    {extra_train}
  evalSpec: {{template: {{spec: {{containers: [{{name: e, image: i}}]}}}}}}
  deploySpec: {{template: {{spec: {{containers: [{{name: d, image: i}}]}}}}}}
  outputDir: /output
"
    )
}

/// A condition without a metric means `num_of_samples`, in a manifest as in the built-in
/// trigger's config.
#[test]
fn a_condition_without_a_metric_tests_num_of_samples() {
    let text = job_text("{name: d, trainProb: 0.5}", "").replace(", metric: num_of_samples", "");
    assert!(!text.contains("metric"));
    let manifests = manifest::parse(&text, Path::new("x.yaml")).unwrap();
    let spec = &job(&manifests[0]).spec;
    assert_eq!(spec.train_spec.trigger.as_ref().unwrap().condition.as_ref().unwrap().metric, "num_of_samples");
    assert!(validate_job(job(&manifests[0]), &|_: &str| true).is_ok());
    assert_eq!(spec.trigger_policy().config.unwrap()["condition"]["metric"], "num_of_samples");
    configure_builtin_trigger(spec).unwrap();
}

#[test]
fn the_job_text_of_the_error_cases_loads() {
    let manifests = manifest::parse(&job_text("{name: d, trainProb: 0.5}", ""), Path::new("x.yaml")).unwrap();
    assert_eq!(job(&manifests[0]).spec.dataset.train_prob, 0.5);
}

#[test]
fn manifest_errors_name_file_document_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, String, usize, Vec<&str>)> = vec![
        (
            "unknown kind, second document",
            format!("{DATASET}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\n"),
            2,
            vec![
                "Deployment (apps/v1) is not something Perennial runs; expected sedna.io/v1alpha1 Dataset or \
                 LifelongLearningJob, or v1 Pod",
            ],
        ),
        (
            "a Sedna kind Perennial does not run",
            "apiVersion: sedna.io/v1alpha1\nkind: Model\nmetadata: {name: m}\n".into(),
            1,
            vec!["Model (sedna.io/v1alpha1) is not something Perennial runs"],
        ),
        (
            "a Dataset of another version",
            "apiVersion: sedna.io/v1beta1\nkind: Dataset\nmetadata: {name: m}\n".into(),
            1,
            vec!["Dataset (sedna.io/v1beta1) is not something"],
        ),
        ("missing apiVersion", "kind: Dataset\nmetadata: {name: d}\n".into(), 1, vec!["apiVersion: missing"]),
        ("missing kind", "apiVersion: sedna.io/v1alpha1\nmetadata: {name: d}\n".into(), 1, vec!["kind: missing"]),
        (
            "trainProb: high",
            job_text("{name: d, trainProb: high}", ""),
            1,
            vec!["spec.dataset.trainProb: invalid type: string \"high\", expected f64"],
        ),
        ("trainProb missing", job_text("{name: d}", ""), 1, vec!["spec.dataset: missing field `trainProb`"]),
        (
            "timeoutSeconds -5",
            job_text("{name: d, trainProb: 0.5}", "timeoutSeconds: -5"),
            1,
            vec!["spec.trainSpec.timeoutSeconds: invalid value: integer `-5`, expected u64"],
        ),
        (
            "a policy with an unknown field",
            job_text("{name: d, trainProb: 0.5, splitPolicy: {plugin: 'builtin:ratio-split', sha: x}}", ""),
            1,
            vec!["spec.dataset.splitPolicy.sha: unknown field `sha`, expected one of `plugin`, `sha256`"],
        ),
        (
            "env value a number",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, env: [{name: N, value: 1}]}]}\n"
                .into(),
            1,
            vec!["spec.containers[0].env[0].value: invalid type: integer `1`, expected a string"],
        ),
        (
            "a Dataset with no spec.url",
            "apiVersion: sedna.io/v1alpha1\nkind: Dataset\nmetadata: {name: d}\nspec: {format: csv, nodeName: n}\n"
                .into(),
            1,
            vec!["spec: missing field `url`"],
        ),
        (
            "a condition of an unknown type",
            format!(
                "{}status:\n  conditions: [{{type: Sleeping, status: 'True', stage: Train}}]\n",
                job_text("{name: d, trainProb: 0.5}", "")
            ),
            1,
            vec!["status.conditions[0].type: unknown variant `Sleeping`"],
        ),
        (
            "a condition's data not a string",
            format!(
                "{}status:\n  conditions: [{{type: Ready, status: 'True', stage: Train, data: {{input: {{}}}}}}]\n",
                job_text("{name: d, trainProb: 0.5}", "")
            ),
            1,
            vec!["status.conditions[0].data: invalid type: map, expected a string"],
        ),
        (
            "YAML syntax error",
            "apiVersion: sedna.io/v1alpha1\nkind: [Dataset\n".into(),
            1,
            vec!["did not find expected ',' or ']' at line 3 column 1"],
        ),
        (
            "YAML syntax error, tab indent",
            "apiVersion: v1\n\tkind: Pod\n".into(),
            1,
            vec!["found a tab character that violates indentation at line 2 column 1"],
        ),
        ("a list, not an object", "- apiVersion: v1\n  kind: Pod\n".into(), 1, vec!["apiVersion: missing"]),
    ];
    for (i, (case, text, document, reasons)) in cases.into_iter().enumerate() {
        let name = format!("case-{i}.yaml");
        let (path, got_document, message, display) = document_error(dir.path(), &name, &text);
        assert_eq!(path, dir.path().join(&name).display().to_string(), "{case}");
        assert_eq!(got_document, document, "{case}: {message}");
        assert!(
            display.starts_with(&format!("{path} (document {document}): ")),
            "{case}: the message names the file and document: {display}"
        );
        assert!(!message.is_empty(), "{case}");
        for reason in reasons {
            assert!(message.contains(reason), "{case}: {message:?} lacks {reason:?}");
        }
    }
}

#[test]
fn a_yaml_syntax_error_names_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!("{DATASET}---\napiVersion: v1\nkind: [Pod\n");
    let (_, document, message, _) = document_error(dir.path(), "broken.yaml", &text);
    assert_eq!(document, 2, "{message}");
    assert!(message.contains("at line 8 column 1"), "the position, counted in the file: {message}");
}

#[test]
fn folder_and_file_errors() {
    let dir = tempfile::tempdir().unwrap();

    // An empty folder, and one with no manifest files.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = manifest::load(std::slice::from_ref(&empty)).unwrap_err();
    assert!(matches!(&err, ManifestError::EmptyFolder { path } if *path == empty.display().to_string()), "{err:?}");
    assert_eq!(err.to_string(), format!("{}: no .yaml, .yml or .json files in this folder", empty.display()));
    std::fs::write(empty.join("README.md"), "# not a manifest\n").unwrap();
    std::fs::create_dir(empty.join("sub.yaml")).unwrap();
    assert!(matches!(manifest::load(std::slice::from_ref(&empty)), Err(ManifestError::EmptyFolder { .. })));

    // A missing file: the path and the OS's reason.
    let missing = dir.path().join("missing.yaml");
    let err = manifest::load(std::slice::from_ref(&missing)).unwrap_err();
    match &err {
        ManifestError::Read { path, source } => {
            assert_eq!(*path, missing.display().to_string());
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    assert!(err.to_string().starts_with(&format!("{}: ", missing.display())), "{err}");

    // One bad file in a folder fails the folder, naming that file.
    let folder = dir.path().join("mixed");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("a.yaml"), DATASET).unwrap();
    std::fs::write(folder.join("b.yaml"), "apiVersion: apps/v1\nkind: Deployment\n").unwrap();
    let err = manifest::load(std::slice::from_ref(&folder)).unwrap_err();
    assert!(err.to_string().starts_with(&format!("{} (document 1): ", folder.join("b.yaml").display())), "{err}");
}

#[test]
fn empty_documents_are_skipped_and_counted() {
    let text = format!("---\n# only a comment\n---\n{DATASET}---\n---\n{DATASET}---\n");
    let manifests = manifest::parse(&text, Path::new("docs.yaml")).unwrap();
    let documents: Vec<usize> = manifests.iter().map(|m| m.document).collect();
    assert_eq!(documents.len(), 2, "{documents:?}");
    // Document numbers count the empty ones, so they point at the right place in the file.
    assert!(documents[0] < documents[1], "{documents:?}");
    assert_eq!(documents[1] - documents[0], 2, "{documents:?}");

    for text in ["", "# nothing\n", "---\n", "---\n---\n"] {
        let manifests = manifest::parse(text, Path::new("empty.yaml")).unwrap();
        assert!(manifests.is_empty(), "{text:?}");
    }
}

#[test]
fn pods_and_json_and_yml_files_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("generator.yml"),
        "apiVersion: v1
kind: Pod
metadata: {name: sample-generator, namespace: edge}
spec:
  nodeName: edge-node
  containers:
  - name: gen
    image: busybox
    args: [sh, -c, 'echo sample >> /data/trainData.csv']
",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("dataset.json"),
        serde_json::to_string(&json!({
            "apiVersion": "sedna.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": "lifelong-dataset"},
            "spec": {"url": "/data/trainData.csv", "format": "csv", "nodeName": "edge-node"}
        }))
        .unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "kind: [broken").unwrap();
    let manifests = manifest::load(&[dir.path().to_owned()]).unwrap();
    assert_eq!(manifests.len(), 2);
    // By name: dataset.json, then generator.yml.
    assert_eq!(dataset(&manifests[0]).spec, atcii_dataset().spec);
    let Object::Pod(pod) = &manifests[1].object else { panic!("expected a Pod: {:?}", manifests[1].object) };
    assert_eq!(key(&pod.metadata), "edge/sample-generator");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("edge-node"));
    assert_eq!(args(&spec.containers[0]), ["sh", "-c", "echo sample >> /data/trainData.csv"]);
}

// ---------------------------------------------------------------------------------------------
// Hostile and careless manifests: each refused at once, naming the document and the field.

/// The message of a one-document parse that must fail.
fn refused(text: &str) -> String {
    match manifest::parse(text, Path::new("bad.yaml")) {
        Err(ManifestError::Document { path, document, message }) => {
            assert_eq!((path.as_str(), document), ("bad.yaml", 1), "{message}");
            message
        }
        other => panic!("expected a document error, got {other:?}"),
    }
}

#[test]
fn an_unknown_field_is_refused_with_the_field_it_resembles() {
    let text = job_text("{name: d, trainProb: 0.5}", "").replace("trigger: {", "trigger: {checkPeriodSecond: 5, ");
    assert_eq!(
        refused(&text),
        "spec.trainSpec.trigger.checkPeriodSecond: unknown field; did you mean \"checkPeriodSeconds\"?"
    );
    // In a Pod template too.
    let text = job_text("{name: d, trainProb: 0.5}", "").replace("{name: t, image: i}", "{name: t, imag: i}");
    assert_eq!(
        refused(&text),
        "spec.trainSpec.template.spec.containers[0].imag: unknown field; did you mean \"image\"?"
    );
    // Nothing near enough to guess.
    let text = job_text("{name: d, trainProb: 0.5}", "").replace("outputDir:", "colour: red\n  outputDir:");
    assert_eq!(refused(&text), "spec.colour: unknown field");
    let text = DATASET.replace("format: csv", "format: csv, nodename: x");
    assert_eq!(refused(&text), "spec.nodename: unknown field; did you mean \"nodeName\"?");
    // A policy's config is the plugin's to judge: anything goes there.
    let text =
        job_text("{name: d, trainProb: 0.5, splitPolicy: {plugin: builtin:ratio-split, config: {anything: 1}}}", "");
    manifest::parse(&text, Path::new("ok.yaml")).unwrap();
}

#[test]
fn a_key_given_twice_is_refused() {
    let message = refused(&format!("{DATASET}metadata: {{name: other}}\n"));
    assert!(message.contains("duplicate entry with key \"metadata\""), "{message}");
    let message = refused(&DATASET.replace("format: csv", "format: csv, format: txt"));
    assert!(message.contains("duplicate entry with key \"format\""), "{message}");
}

#[test]
fn the_same_object_twice_is_refused_naming_both_documents() {
    let text = format!("{DATASET}---\n{DATASET}");
    let manifests = manifest::parse(&text, Path::new("twice.yaml")).unwrap();
    let err = manifest::refuse_duplicates(&manifests).unwrap_err().to_string();
    assert_eq!(
        err,
        "twice.yaml (document 2): Dataset default/lifelong-dataset is also in twice.yaml (document 1); give each \
         object once"
    );
}

#[test]
fn nan_and_infinities_are_refused_as_such() {
    for value in [".nan", ".inf", "-.inf"] {
        let message = refused(&job_text(&format!("{{name: d, trainProb: {value}}}"), ""));
        assert!(message.starts_with("spec.dataset.trainProb: "), "{message}");
        assert!(message.contains("NaN and infinities are refused"), "{message}");
    }
}

#[test]
fn tags_and_keys_json_cannot_hold_are_refused() {
    let message = refused(&DATASET.replace("url: /data/trainData.csv", "url: !secret x"));
    assert_eq!(message, "spec.url: the YAML tag !secret is not supported");
    let message = refused(&DATASET.replace("format: csv", "format: csv, [a]: b"));
    assert_eq!(message, "spec: a key that is not a string, number or boolean");
}

/// Deep nesting is refused in a bounded time, however deep (the issue saw 44 s for 200 KB).
#[test]
fn deep_nesting_is_refused_quickly() {
    for depth in [70, 100_000] {
        let text = format!("{DATASET}x: {}{}\n", "[".repeat(depth), "]".repeat(depth));
        let started = std::time::Instant::now();
        let message = refused(&text);
        assert!(message.contains("nested deeper than") || message.contains("recursion limit"), "{message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{depth}: {:?}", started.elapsed());
    }
    // A quote inside a plain scalar is a letter, not the start of a string hiding what follows.
    let message = refused(&format!("{DATASET}note: don't\nx: {}{}\n", "[".repeat(100), "]".repeat(100)));
    assert!(message.contains("nested deeper than 64 levels"), "{message}");
    // Whatever quotes seem to hide, a file holds at most so many brackets.
    let message = refused(&format!("{DATASET}note: a \"b\nx: {}{}\n", "[".repeat(20_000), "]".repeat(20_000)));
    assert!(message.contains("more than 10000 brackets in one file"), "{message}");
    let nested_maps =
        format!("{DATASET}x:\n{}", (0..100).map(|i| format!("{}a:\n", " ".repeat(i + 1))).collect::<String>());
    let message = refused(&nested_maps);
    assert!(message.contains("nested deeper than"), "{message}");
}

#[test]
fn a_huge_file_or_one_that_is_not_a_regular_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(manifest::MAX_FILE_BYTES + 1).unwrap();
    let err = manifest::load(std::slice::from_ref(&big)).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}: ", big.display())), "{err}");
    assert!(err.contains("a manifest file may hold at most 3145728"), "{err}");

    let fifo = dir.path().join("fifo.yaml");
    let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let started = std::time::Instant::now();
    let err = manifest::load_file(&fifo).unwrap_err().to_string();
    assert!(err.ends_with("not a regular file"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

#[test]
fn namespaces_pod_names_and_locations_are_checked() {
    for namespace in ["a/b", "..", "Upper", "a.b"] {
        let text = job_text("{name: d, trainProb: 0.5}", "")
            .replace("{name: demo}", &format!("{{name: demo, namespace: {namespace:?}}}"));
        let manifests = manifest::parse(&text, Path::new("x.yaml")).unwrap();
        let err = validate_job(job(&manifests[0]), &|_: &str| true).unwrap_err().to_string();
        assert!(err.contains(&format!("metadata.namespace: {namespace:?} is not a DNS-1123 label")), "{err}");
    }
    let text = job_text("{name: d, trainProb: 0.5}", "").replace("outputDir: /output", "outputDir: \"/out\\0put\"");
    let manifests = manifest::parse(&text, Path::new("x.yaml")).unwrap();
    let err = validate_job(job(&manifests[0]), &|_: &str| true).unwrap_err().to_string();
    assert!(err.contains("spec.outputDir: \"/out\\0put\" contains the control character '\\0'"), "{err}");

    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: Gen_1}\nspec: {containers: []}\n";
    let manifests = manifest::parse(pod, Path::new("pod.yaml")).unwrap();
    let Object::Pod(pod) = &manifests[0].object else { panic!() };
    let err = validate_pod(pod).unwrap_err().to_string();
    assert!(err.starts_with("Pod default/Gen_1: metadata.name: \"Gen_1\" is not a DNS-1123 name"), "{err}");
    assert!(err.contains("spec.containers: a Pod needs at least one container"), "{err}");
}

// A bounded fuzz of the loader: any text, and the sample job with bytes inserted, deleted or
// replaced anywhere, parses or is refused without a panic, in bounded time.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn parses_in_bounded_time(text: &str) {
        let started = std::time::Instant::now();
        let _ = manifest::parse(text, Path::new("fuzz.yaml"));
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?} for {text:?}", started.elapsed());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_text(text in "[\\[\\]{}:,'\"#&*!|>\\-?. \\n\\ta-z0-9]{0,400}") {
            parses_in_bounded_time(&text);
        }

        #[test]
        fn an_edited_job(edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..8)) {
            let mut bytes = job_text("{name: d, trainProb: 0.5}", "").into_bytes();
            for (at, how, byte) in edits {
                let at = at.index(bytes.len());
                match how {
                    0 => bytes.insert(at, byte),
                    1 => { bytes.remove(at); }
                    _ => bytes[at] = byte,
                }
            }
            parses_in_bounded_time(&String::from_utf8_lossy(&bytes));
        }
    }
}

#[test]
fn a_relative_plugin_path_is_the_manifests_folder_s_not_the_working_folder_s() {
    let text = perennial_job_text()
        .replace("plugin: https://plugins.example.org/count-or-age-trigger.wasm", "plugin: policies/trigger.wasm")
        .replace(
            "plugin: builtin:metric-select",
            "plugin: ./select.wasm\n      shadow: {plugin: ../other/shadow.wasm}",
        );
    let manifests = manifest::parse(&text, Path::new("/srv/jobs/thermal/job.yaml")).unwrap();
    let spec = &job(&manifests[0]).spec;
    let trigger = spec.train_spec.trigger.as_ref().and_then(|t| t.policy.as_ref()).expect("a trigger policy");
    assert_eq!(trigger.plugin, "/srv/jobs/thermal/policies/trigger.wasm");
    let select = spec.deploy_spec.select_policy.as_ref().expect("a select policy");
    assert_eq!(select.plugin, "/srv/jobs/thermal/./select.wasm");
    assert_eq!(select.shadow.as_ref().map(|s| s.plugin.as_str()), Some("/srv/jobs/thermal/../other/shadow.wasm"));
    // Built-ins, absolute paths and URLs are left as they are.
    assert_eq!(spec.dataset.split_policy.as_ref().map(|p| p.plugin.as_str()), Some("builtin:ratio-split"));
    let manifests = manifest::parse(&perennial_job_text(), Path::new("jobs/perennial.yaml")).unwrap();
    let trigger = job(&manifests[0]).spec.train_spec.trigger.clone().and_then(|t| t.policy).expect("a trigger policy");
    assert_eq!(trigger.plugin, "https://plugins.example.org/count-or-age-trigger.wasm");
}
