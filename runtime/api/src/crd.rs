//! The CustomResourceDefinitions, generated from the types: `perennial crd` prints them, and
//! `deploy/crds/` holds them as generated (a test fails when the two differ).
//!
//! The schema is structural, and its OpenAPI validation refuses what the agent would refuse
//! (`trainProb` outside [0, 1], an operator Sedna does not know, a time that is not `HH:MM`, a URL
//! that is neither a path nor `s3://`, a format other than txt/csv) on every Kubernetes version,
//! without CEL. The patterns below are in the regex dialect both the API server (Go RE2) and
//! JSON Schema (ECMA 262) read the same way: no look-around, no inline flags.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::Schema;

use super::{Dataset, LifelongLearningJob};

/// Sedna's trigger operators and their aliases (the agent's `validate_job` takes the same).
pub(super) const OPERATORS: [&str; 13] = [">", "gt", ">=", "ge", "<", "lt", "<=", "le", "=", "==", "eq", "!=", "ne"];

/// `trigger.timer.start`: `HH:MM`, 00:00 to 23:59.
pub(super) const START_PATTERN: &str = "^([01][0-9]|2[0-3]):[0-5][0-9]$";

/// `trigger.timer.end`: `HH:MM`, 00:00 to 23:59, or 24:00.
pub(super) const END_PATTERN: &str = "^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$";

/// Dataset `format`: txt or csv, any case.
pub(super) const FORMAT_PATTERN: &str = "^([tT][xX][tT]|[cC][sS][vV])$";

/// `outputDir` and Dataset `url`, as Sedna's `CheckURL`: `s3://` and a bucket, or a path, that
/// is, text with no `://` in it. Without look-ahead, "no `://`" reads: each `:` run is followed
/// by the end, by a character that is neither `:` nor `/`, or by one `/` and then one of those
/// (or `:` again, which starts the next run).
pub(super) const LOCATION_PATTERN: &str = "^(s3://[^/].*|([^:]|:(:|/:)*/?[^:/])*(:(:|/:)*/?)?)$";

/// Both CRDs, LifelongLearningJob first, as one multi-document YAML (what `perennial crd`
/// prints and `deploy/crds/` holds).
pub fn crds_yaml() -> String {
    documents().into_iter().map(|(_, yaml)| yaml).collect::<Vec<_>>().join("---\n")
}

/// The label every object of Perennial's install carries (deploy/'s kustomizations add it too).
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "perennial");

/// The CRDs as every kubectl and API server take them: LifelongLearningJob, then Dataset.
pub fn crds() -> [CustomResourceDefinition; 2] {
    [LifelongLearningJob::crd(), Dataset::crd()].map(without_null_in_enums).map(|mut crd| {
        // The label `kubectl apply -k deploy/operator` adds: `apply -f deploy/crds/` then gives
        // the same, so the two applies do not flip it.
        let (key, value) = PART_OF;
        crd.metadata.labels.get_or_insert_with(Default::default).insert(key.to_owned(), value.to_owned());
        crd
    })
}

/// Drops the `null` that schemars lists in the `enum` of an optional enum field (`Option<Stage>`):
/// kubectl's client-side validation refuses a CRD with one ("unknown object type \"nil\""), and
/// the field's `nullable: true` already allows the null.
fn without_null_in_enums(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Array(values)) = map.get_mut("enum") {
                    values.retain(|v| !v.is_null());
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes to JSON");
    strip(&mut value);
    serde_json::from_value(value).expect("the CRD reads back without the nulls")
}

/// Each CRD's file name under `deploy/crds/` (`<group>_<plural>.yaml`, as Sedna names its own)
/// and its YAML.
fn documents() -> Vec<(String, String)> {
    crds()
        .into_iter()
        .map(|crd: CustomResourceDefinition| {
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            let yaml = serde_yaml_ng::to_string(&crd).expect("a CRD serializes to YAML");
            // A bare `=` (an operator) is YAML 1.1's "value" tag to some readers (PyYAML): quote it.
            let yaml = yaml.replace(" - =\n", " - '='\n");
            (file, format!("# Generated from Perennial's types by `perennial crd`: do not edit by hand.\n{yaml}"))
        })
        .collect()
}

/// Drops the descriptions below a schema's top: the worker pod templates embed core/v1's
/// PodTemplateSpec, whose descriptions would make the CRD about 1 MB, past what
/// `kubectl apply` (client side) can keep in its last-applied annotation (256 KiB). Their
/// documentation is core/v1's (`kubectl explain pod.spec`).
pub(super) fn without_nested_descriptions(schema: &mut Schema) {
    fn strip(schema: &mut Schema) {
        schema.remove("description");
        schemars::transform::transform_subschemas(&mut strip, schema);
    }
    schemars::transform::transform_subschemas(&mut strip, schema);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use serde_json::{Value, json};

    use super::*;
    use crate::{DatasetSpec, validate_dataset, validate_job};

    const UPDATE: &str = "PERENNIAL_UPDATE_CRDS";

    fn crds_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
    }

    /// `deploy/crds/` is what the types generate; `PERENNIAL_UPDATE_CRDS=1` rewrites it.
    #[test]
    fn deploy_crds_are_up_to_date() {
        let dir = crds_dir();
        let generated = documents();
        let regenerate = format!(
            "run `{UPDATE}=1 cargo test -p perennial-api --lib crd` and commit deploy/crds/ and deploy/helm/perennial/crds/"
        );
        if std::env::var_os(UPDATE).is_some() {
            // The Helm chart's copies too (deploy/checks holds them to these).
            let chart = dir.join("../helm/perennial/crds");
            for dir in [&dir, &chart] {
                std::fs::create_dir_all(dir).unwrap();
                for (file, yaml) in &generated {
                    std::fs::write(dir.join(file), yaml).unwrap();
                }
            }
        }
        let mut stale = Vec::new();
        for (file, yaml) in &generated {
            match std::fs::read_to_string(dir.join(file)) {
                Ok(checked_in) if &checked_in == yaml => {}
                Ok(_) => stale.push(format!("{file} differs from what the types generate")),
                Err(err) => stale.push(format!("{file}: {err}")),
            }
        }
        let wanted: BTreeSet<_> = generated.iter().map(|(file, _)| file.clone()).collect();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && !wanted.contains(&name) {
                stale.push(format!("{name} is not generated by the types (remove it)"));
            }
        }
        assert!(stale.is_empty(), "deploy/crds is stale: {}; {regenerate}", stale.join("; "));
        // `perennial crd` prints the same documents.
        let files: Vec<_> = generated.iter().map(|(_, yaml)| yaml.as_str()).collect();
        assert_eq!(crds_yaml(), files.join("---\n"));
    }

    /// The YAML reads back as the CRDs the types give (the quoting of `=` included).
    #[test]
    fn yaml_reads_back() {
        let text = crds_yaml();
        let read: Vec<CustomResourceDefinition> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|document| serde::Deserialize::deserialize(document).unwrap())
            .collect();
        assert_eq!(read, crds());
        assert!(text.contains(" - '='\n") && !text.contains(" - =\n"));
    }

    fn crd_values() -> Vec<Value> {
        crds().iter().map(|crd| serde_json::to_value(crd).unwrap()).collect()
    }

    fn open_api_schema(crd: &Value) -> &Value {
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    }

    fn job_schema() -> Value {
        open_api_schema(&crd_values()[0]).clone()
    }

    #[test]
    fn names_columns_and_subresources() {
        let crds = crd_values();
        let (job, dataset) = (&crds[0], &crds[1]);
        assert_eq!(job["metadata"]["name"], "lifelonglearningjobs.sedna.io");
        assert_eq!(job["spec"]["names"]["plural"], "lifelonglearningjobs");
        assert_eq!(job["spec"]["names"]["shortNames"], json!(["ll"]));
        assert_eq!(job["spec"]["scope"], "Namespaced");
        assert_eq!(dataset["metadata"]["name"], "datasets.sedna.io");
        assert_eq!(dataset["spec"]["names"].get("shortNames"), None, "Sedna's Dataset has no short name");
        for crd in &crds {
            let version = &crd["spec"]["versions"][0];
            assert_eq!(version["name"], "v1alpha1");
            assert_eq!(version["served"], true);
            assert_eq!(version["storage"], true);
            assert_eq!(version["subresources"]["status"], json!({}));
        }
        let columns: Vec<_> = job["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(columns, ["Stage", "Status", "Round", "Deployed", "Age"]);
    }

    /// Kubernetes' structural schema rules, the ones the types can break: every node says its
    /// type (or is int-or-string, or keeps unknown fields), no `$ref`, no `properties` beside
    /// `additionalProperties`, no `additionalProperties: false`, and the logic junctors
    /// (`anyOf`, `allOf`, `oneOf`, `not`) only under a node with a type and with no type,
    /// description, default, nullable or additionalProperties of their own.
    fn structural_errors(schema: &Value, path: &str, errors: &mut Vec<String>) {
        let Some(node) = schema.as_object() else {
            errors.push(format!("{path}: not an object schema"));
            return;
        };
        let flag = |key: &str| node.get(key) == Some(&Value::Bool(true));
        if node.contains_key("$ref") {
            errors.push(format!("{path}: $ref"));
        }
        let free = flag("x-kubernetes-int-or-string") || flag("x-kubernetes-preserve-unknown-fields");
        if !node.contains_key("type") && !free {
            errors.push(format!("{path}: no type"));
        }
        if node.contains_key("properties") && node.contains_key("additionalProperties") {
            errors.push(format!("{path}: both properties and additionalProperties"));
        }
        if node.get("additionalProperties") == Some(&Value::Bool(false)) {
            errors.push(format!("{path}: additionalProperties: false"));
        }
        for junctor in ["anyOf", "allOf", "oneOf", "not"] {
            let Some(branches) = node.get(junctor) else { continue };
            if !node.contains_key("type") && !flag("x-kubernetes-int-or-string") {
                errors.push(format!("{path}: {junctor} under a node without a type"));
            }
            let branches = branches.as_array().cloned().unwrap_or_else(|| vec![branches.clone()]);
            for branch in branches {
                for key in ["type", "description", "default", "nullable", "additionalProperties"] {
                    if branch.get(key).is_some() {
                        errors.push(format!("{path}: {key} inside {junctor}"));
                    }
                }
            }
        }
        if let Some(properties) = node.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                structural_errors(property, &format!("{path}.{name}"), errors);
            }
        }
        if let Some(items) = node.get("items") {
            structural_errors(items, &format!("{path}[]"), errors);
        }
        if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
            structural_errors(values, &format!("{path}{{}}"), errors);
        }
    }

    fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
        path.split('.').fold(schema, |node, name| match name {
            "[]" => &node["items"],
            _ => &node["properties"][name],
        })
    }

    /// What `kubectl apply` (client side, validation on) needs: no `null` in an `enum` (kubectl
    /// 1.20 to 1.33 refuse the CRD: unknown object type "nil"), and the whole object small enough
    /// for the last-applied annotation (all annotations of an object: 256 KiB), with room to grow.
    #[test]
    fn kubectl_applies_them() {
        fn nulls_in_enums(value: &Value, path: &str, found: &mut Vec<String>) {
            match value {
                Value::Object(map) => {
                    if map.get("enum").and_then(Value::as_array).is_some_and(|v| v.iter().any(Value::is_null)) {
                        found.push(path.to_owned());
                    }
                    map.iter().for_each(|(key, v)| nulls_in_enums(v, &format!("{path}.{key}"), found));
                }
                Value::Array(items) => items.iter().for_each(|v| nulls_in_enums(v, path, found)),
                _ => {}
            }
        }
        for crd in crd_values() {
            let mut found = Vec::new();
            nulls_in_enums(&crd, "", &mut found);
            assert!(found.is_empty(), "{}: null in enum at {found:?}", crd["metadata"]["name"]);
            let size = serde_json::to_string(&crd).unwrap().len();
            assert!(
                size < 200 * 1024,
                "{} is {size} bytes as JSON: too big for kubectl apply",
                crd["metadata"]["name"]
            );
        }
        // The optional enums stay nullable (a merge patch may clear them).
        let schema = job_schema();
        assert_eq!(at(&schema, "status.stage")["nullable"], true);
        assert_eq!(at(&schema, "status.stage")["enum"], json!(["Train", "Eval", "Deploy"]));
    }

    #[test]
    fn schemas_are_structural() {
        for crd in crd_values() {
            let mut errors = Vec::new();
            let schema = open_api_schema(&crd);
            structural_errors(schema, "", &mut errors);
            assert!(errors.is_empty(), "{} is not structural: {errors:#?}", crd["metadata"]["name"]);
            // The root: only spec and status (apiVersion, kind, metadata are the server's).
            let root: BTreeSet<_> = schema["properties"].as_object().unwrap().keys().cloned().collect();
            assert!(root.is_subset(&["spec".to_owned(), "status".to_owned()].into()), "{root:?}");
        }
        let schema = job_schema();
        for free_form in [
            "spec.dataset.splitPolicy.config",
            "spec.trainSpec.trigger.policy.config",
            "spec.deploySpec.selectPolicy.config",
            "status.knowledgeBase",
            "status.deployed.metrics",
            "status.lastTrained.metrics",
            "status.data.input.models.[].metrics",
            "status.data.output.models.[].metrics",
        ] {
            assert_eq!(at(&schema, free_form)["x-kubernetes-preserve-unknown-fields"], true, "{free_form}");
        }
        // The pod templates are core/v1's, quantities and ports int-or-string.
        let template = at(&schema, "spec.trainSpec.template");
        assert_eq!(template["type"], "object");
        let container = at(template, "spec.containers.[]");
        assert_eq!(at(container, "resources.limits")["additionalProperties"]["x-kubernetes-int-or-string"], true);
        assert!(at(container, "image")["description"].is_null(), "nested descriptions are dropped");
        assert!(template["description"].is_string());
    }

    /// The OpenAPI v3 schema as JSON Schema draft 4: `nullable` allows null, and int-or-string
    /// is an integer or a string (Kubernetes reads the rest of these keywords the same way).
    fn as_json_schema(schema: &Value) -> Value {
        match schema {
            Value::Object(node) => {
                let mut out = serde_json::Map::new();
                for (key, value) in node {
                    let value = match key.as_str() {
                        "properties" => Value::Object(
                            value.as_object().unwrap().iter().map(|(k, v)| (k.clone(), as_json_schema(v))).collect(),
                        ),
                        "items" | "additionalProperties" | "not" => as_json_schema(value),
                        "anyOf" | "allOf" | "oneOf" => {
                            Value::Array(value.as_array().unwrap().iter().map(as_json_schema).collect())
                        }
                        _ => value.clone(),
                    };
                    out.insert(key.clone(), value);
                }
                if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                    out.insert("type".into(), json!(["integer", "string"]));
                }
                if node.get("nullable") == Some(&Value::Bool(true))
                    && let Some(kind) = out.get("type").cloned()
                {
                    let mut kinds = match kind {
                        Value::Array(kinds) => kinds,
                        kind => vec![kind],
                    };
                    kinds.push(json!("null"));
                    out.insert("type".into(), Value::Array(kinds));
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }

    /// Drops the nulls the API server drops before it validates: those of fields whose schema
    /// is not `nullable` (e.g. `creationTimestamp: null` in the pod templates kubectl prints).
    fn prune_nulls(value: &mut Value, schema: &Value) {
        let field = |name: &str| match &schema["properties"][name] {
            Value::Null => schema.get("additionalProperties").filter(|s| s.is_object()),
            field => Some(field),
        };
        match value {
            Value::Object(fields) => {
                fields.retain(|name, value| {
                    !value.is_null() || field(name).is_none_or(|s| s["nullable"] == Value::Bool(true))
                });
                for (name, value) in fields.iter_mut() {
                    if let Some(schema) = field(name) {
                        prune_nulls(value, schema);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| prune_nulls(item, &schema["items"])),
            _ => {}
        }
    }

    struct Validators {
        job: (Value, jsonschema::Validator),
        dataset: (Value, jsonschema::Validator),
    }

    impl Validators {
        fn new() -> Self {
            let crds = crd_values();
            let build = |crd: &Value| {
                let schema = open_api_schema(crd).clone();
                let validator = jsonschema::draft4::options()
                    .should_validate_formats(true)
                    .build(&as_json_schema(&schema))
                    .unwrap();
                (schema, validator)
            };
            Validators { job: build(&crds[0]), dataset: build(&crds[1]) }
        }

        /// The schema's complaints about one object: `/json/pointer [keyword]: message`.
        fn errors(&self, object: &Value) -> Vec<String> {
            let (schema, validator) = match object["kind"].as_str() {
                Some("LifelongLearningJob") => &self.job,
                Some("Dataset") => &self.dataset,
                kind => panic!("no CRD for kind {kind:?}"),
            };
            let mut object = object.clone();
            prune_nulls(&mut object, schema);
            validator
                .iter_errors(&object)
                .map(|e| format!("{} [{}]: {e}", e.instance_path(), e.kind().keyword()))
                .collect()
        }
    }

    fn fixtures() -> Vec<(String, Value)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sedna");
        let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        paths.sort();
        let mut objects = Vec::new();
        for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
            let text = std::fs::read_to_string(&path).unwrap();
            for document in serde_yaml_ng::Deserializer::from_str(&text) {
                let object: Value = serde::Deserialize::deserialize(document).unwrap();
                objects.push((path.file_name().unwrap().to_string_lossy().into_owned(), object));
            }
        }
        objects
    }

    fn fixture(file: &str, kind: &str) -> Value {
        fixtures().into_iter().find(|(f, o)| f == file && o["kind"] == kind).unwrap().1
    }

    #[test]
    fn sedna_manifests_are_accepted() {
        let validators = Validators::new();
        let objects = fixtures();
        assert!(objects.len() >= 5, "{} objects", objects.len());
        for (file, object) in objects {
            let errors = validators.errors(&object);
            assert!(errors.is_empty(), "{file} {}: {errors:#?}", object["metadata"]["name"]);
        }
    }

    #[test]
    fn perennial_fields_are_accepted() {
        let validators = Validators::new();
        let mut job = fixture("lifelonglearningjob-atcii.yaml", "LifelongLearningJob");
        let policy = json!({
            "plugin": "s3://plugins/trigger.wasm",
            "sha256": "ab".repeat(32),
            "config": {"condition": {"operator": ">", "threshold": 500}, "any": ["shape", 1, null]},
            "limits": {"timeoutMs": 100, "memoryMiB": 32},
            "onError": "hold",
        });
        job["spec"]["trainSpec"]["trigger"]["policy"] = policy.clone();
        job["spec"]["trainSpec"]["timeoutSeconds"] = json!(3600);
        job["spec"]["dataset"]["splitPolicy"] = json!({"plugin": "builtin:ratio-split", "config": "free text"});
        job["spec"]["deploySpec"]["selectPolicy"] = json!({"plugin": "builtin:first-select"});
        job["status"] = json!({
            "round": 2,
            "stage": "Eval",
            "phase": "Running",
            "deployed": {"round": 1, "url": "/output/deploy/index.pkl", "metrics": {"f1": 0.9, "per_class": [0.8]}},
            "knowledgeBase": {"AIModels": {"numberOfAIModels": 1}},
            "policies": {"trigger": {"plugin": "builtin:threshold-trigger", "health": "Failing"}},
        });
        let errors = validators.errors(&job);
        assert!(errors.is_empty(), "{errors:#?}");
    }

    /// What the API server refuses.
    #[test]
    fn bad_manifests_are_refused() {
        let validators = Validators::new();
        let job = fixture("lifelonglearningjob-atcii.yaml", "LifelongLearningJob");
        let dataset = fixture("dataset-atcii.yaml", "Dataset");
        let cases: &[(&Value, &str, Value, &str)] = &[
            (&job, "/spec/dataset/trainProb", json!(1.5), "maximum"),
            (&job, "/spec/dataset/trainProb", json!(-0.1), "minimum"),
            (&job, "/spec/trainSpec/trigger/condition/operator", json!("~="), "enum"),
            (&job, "/spec/trainSpec/trigger/timer/start", json!("25:00"), "pattern"),
            (&job, "/spec/trainSpec/trigger/timer/start", json!("24:00"), "pattern"),
            (&job, "/spec/trainSpec/trigger/timer/end", json!("24:01"), "pattern"),
            (&job, "/spec/trainSpec/trigger/timer/end", json!("2:00"), "pattern"),
            (&job, "/spec/outputDir", json!("http://x"), "pattern"),
            (&job, "/spec/outputDir", json!("s3:///no-bucket"), "pattern"),
            (&job, "/spec/outputDir", json!(""), "minLength"),
            (&job, "/spec/evalSpec/timeoutSeconds", json!(0), "minimum"),
            (&job, "/spec/trainSpec/trigger/checkPeriodSeconds", json!(-1), "minimum"),
            (&job, "/spec/trainSpec/trigger/policy", json!({"plugin": "builtin:x", "onError": "explode"}), "enum"),
            (
                &job,
                "/spec/trainSpec/trigger/policy",
                json!({"plugin": "builtin:x", "limits": {"timeoutMs": 0}}),
                "minimum",
            ),
            (
                &job,
                "/spec/deploySpec/selectPolicy",
                json!({"plugin": "builtin:x", "limits": {"memoryMiB": 100000}}),
                "maximum",
            ),
            (&dataset, "/spec/format", json!("json"), "pattern"),
            (&dataset, "/spec/url", json!("https://example.org/index.txt"), "pattern"),
        ];
        for (object, pointer, value, keyword) in cases {
            let mut bad = (*object).clone();
            let (parent, field) = pointer.rsplit_once('/').unwrap();
            bad.pointer_mut(parent).unwrap().as_object_mut().unwrap().insert(field.to_owned(), value.clone());
            let errors = validators.errors(&bad);
            assert!(!errors.is_empty(), "{pointer} = {value} was accepted");
            assert!(
                errors.iter().any(|e| e.starts_with(pointer) && e.contains(&format!("[{keyword}]"))),
                "{pointer} = {value}: not refused by its {keyword}: {errors:#?}"
            );
        }
        // Missing what Sedna requires.
        let mut bad = job.clone();
        bad["spec"].as_object_mut().unwrap().remove("outputDir");
        let errors = validators.errors(&bad);
        assert!(errors.iter().any(|e| e.contains("[required]") && e.contains("outputDir")), "{errors:#?}");
    }

    /// The schema and the agent's own checks agree on operators, times, formats and URLs.
    #[test]
    fn schema_agrees_with_the_agent() {
        let validators = Validators::new();
        let base = fixture("lifelonglearningjob-atcii.yaml", "LifelongLearningJob");
        let typed = |object: &Value| -> LifelongLearningJob { serde_json::from_value(object.clone()).unwrap() };
        let agent_errors = |object: &Value, field: &str| -> bool {
            match validate_job(&typed(object), &|_| true) {
                Ok(()) => false,
                Err(errors) => errors.errors.iter().any(|e| e.starts_with(field)),
            }
        };
        let schema_errors = |object: &Value, field: &str| -> bool {
            let pointer = format!("/{}", field.replace('.', "/"));
            validators.errors(object).iter().any(|e| e.starts_with(&pointer))
        };
        let mut operators: Vec<String> = OPERATORS.iter().map(|s| s.to_string()).collect();
        operators.extend(["~=", "GT", "=>", "<>", ""].map(String::from));
        for operator in operators {
            let mut job = base.clone();
            job["spec"]["trainSpec"]["trigger"]["condition"]["operator"] = json!(operator);
            let field = "spec.trainSpec.trigger.condition.operator";
            assert_eq!(schema_errors(&job, field), agent_errors(&job, field), "operator {operator:?}");
        }
        let times =
            ["00:00", "02:00", "09:59", "19:30", "23:59", "24:00", "24:30", "25:00", "2:00", "12:60", "1200", ""];
        for (which, other) in [("start", "23:00"), ("end", "01:00")] {
            for time in times {
                let mut job = base.clone();
                job["spec"]["trainSpec"]["trigger"]["timer"] = json!({"start": other, "end": other});
                job["spec"]["trainSpec"]["trigger"]["timer"][which] = json!(time);
                let field = format!("spec.trainSpec.trigger.timer.{which}");
                assert_eq!(schema_errors(&job, &field), agent_errors(&job, &field), "{which} {time:?}");
            }
        }
        let locations = [
            "/output",
            "output/relative",
            "/data/a:b/c",
            "/data/a:/b",
            "/data/a::/b",
            "/data/a:/:/b",
            "/data/a:",
            "/data/a:/",
            "C:\\data",
            "s3://bucket",
            "s3://bucket/prefix",
            "s3://bucket/a://b",
            "s3:///key",
            "s3://",
            "S3://bucket/key",
            "http://x",
            "https://example.org/a",
            "file:///data",
            "/data/a://b",
            "/data/a:://b",
            "://",
        ];
        for location in locations {
            let mut job = base.clone();
            job["spec"]["outputDir"] = json!(location);
            let field = "spec.outputDir";
            assert_eq!(schema_errors(&job, field), agent_errors(&job, field), "outputDir {location:?}");

            let dataset = Dataset::new(
                "d",
                DatasetSpec {
                    url: location.into(),
                    format: "txt".into(),
                    node_name: "n".into(),
                    credential_name: None,
                },
            );
            let mut object = serde_json::to_value(&dataset).unwrap();
            object["kind"] = json!("Dataset");
            let agent = validate_dataset(&dataset).is_err_and(|e| e.errors.iter().any(|e| e.starts_with("spec.url")));
            assert_eq!(schema_errors(&object, "spec.url"), agent, "url {location:?}");
        }
        for format in ["txt", "csv", "TXT", "Csv", "tXt", "json", "txt ", "", "tsv", "csvv"] {
            let dataset = Dataset::new(
                "d",
                DatasetSpec { url: "/i".into(), format: format.into(), node_name: "n".into(), credential_name: None },
            );
            let object = serde_json::to_value(&dataset).unwrap();
            let agent =
                validate_dataset(&dataset).is_err_and(|e| e.errors.iter().any(|e| e.starts_with("spec.format")));
            assert_eq!(schema_errors(&object, "spec.format"), agent, "format {format:?}");
        }
    }
}
