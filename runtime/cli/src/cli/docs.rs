//! The docs book's reference pages (`docs/src/reference/`), generated from the code: the CLI
//! from clap, the CRD fields from the schema, the operator's metrics from its registry, the WIT
//! contract, and the workers' env from what the control plane gives each stage. A test fails
//! when a page drifts from the code; `PERENNIAL_UPDATE_DOCS=1` rewrites them.

use std::fmt::Write;
use std::path::PathBuf;

use serde_json::Value;

const UPDATE: &str = "PERENNIAL_UPDATE_DOCS";
const GENERATED: &str = "<!-- Generated from the code by `PERENNIAL_UPDATE_DOCS=1 cargo test -p perennial --bin perennial docs`: do not edit. -->\n\n";

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/reference")
}

/// Each page's file name and text.
fn pages() -> Vec<(&'static str, String)> {
    vec![
        ("cli.md", cli()),
        ("crds.md", crds()),
        ("metrics.md", metrics()),
        ("wit.md", wit()),
        ("worker-env.md", worker_env()),
    ]
}

fn cli() -> String {
    let options = clap_markdown::MarkdownOptions::new().title("The `perennial` command line".into()).show_footer(false);
    let text = clap_markdown::help_markdown_custom::<super::Cli>(&options);
    format!("{GENERATED}{}", with_env(&text))
}

/// clap-markdown leaves out each flag's environment fallback (`env = ...`): added under its flag,
/// in its command's section.
fn with_env(markdown: &str) -> String {
    use clap::CommandFactory;
    let mut fallbacks: Vec<(String, String, String)> = Vec::new(); // (section, long flag, env)
    fn walk(command: &clap::Command, path: &str, fallbacks: &mut Vec<(String, String, String)>) {
        for arg in command.get_arguments() {
            if let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) {
                fallbacks.push((format!("## `{path}`"), long.to_owned(), env.to_string_lossy().into_owned()));
            }
        }
        for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
            walk(sub, &format!("{path} {}", sub.get_name()), fallbacks);
        }
    }
    walk(&super::Cli::command(), "perennial", &mut fallbacks);
    let mut out = String::new();
    let mut section = String::new();
    for line in markdown.lines() {
        if line.starts_with("## ") {
            section = line.to_owned();
        }
        out.push_str(line);
        out.push('\n');
        // An option's line: "* `-n`, `--name <NAME>` — help".
        let long = line
            .strip_prefix("* ")
            .and_then(|rest| rest.split_once("`--"))
            .map(|(_, rest)| rest.split([' ', '`']).next().unwrap_or_default());
        if let Some((_, _, env)) = fallbacks.iter().find(|(s, f, _)| *s == section && Some(f.as_str()) == long) {
            let _ = write!(out, "\n  Environment variable: `{env}`\n");
        }
    }
    out
}

/// Every field of each CRD's schema: its path, type, whether required, and its description.
fn crds() -> String {
    let mut text = format!(
        "{GENERATED}# Custom resources\n\nThe fields of `sedna.io/v1alpha1` LifelongLearningJob and Dataset, as the CRDs \
         (`deploy/crds/`, `perennial crd`) declare them. A required field is marked **required**.\n"
    );
    for crd in perennial_api::crds() {
        let kind = &crd.spec.names.kind;
        for version in &crd.spec.versions {
            let Some(schema) = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()) else {
                continue;
            };
            let schema = serde_json::to_value(schema).unwrap_or_default();
            let _ = write!(text, "\n## {kind} (`{}/{}`)\n\n", crd.spec.group, version.name);
            text.push_str("| field | type | description |\n|---|---|---|\n");
            for section in ["spec", "status"] {
                if let Some(part) = schema.pointer(&format!("/properties/{section}")) {
                    let required = schema_required(&schema).contains(&section.to_owned());
                    fields(&mut text, section, part, required);
                }
            }
        }
    }
    text
}

fn schema_required(schema: &Value) -> Vec<String> {
    schema["required"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
}

fn fields(text: &mut String, path: &str, schema: &Value, required: bool) {
    let mut kind = schema["type"].as_str().unwrap_or("object").to_owned();
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
        kind = format!("{kind}: {}", values.join(", "));
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
        kind.push_str(" (any fields)");
    }
    if schema["x-kubernetes-int-or-string"] == Value::Bool(true) {
        kind = "integer or string".into();
    }
    let mut description = schema["description"].as_str().unwrap_or_default().replace('\n', " ").replace('|', "\\|");
    if required {
        description = format!("**required**. {description}");
    }
    // A worker's pod template is Kubernetes' own PodTemplateSpec: its fields are Kubernetes'.
    if path.ends_with(".template") && schema.pointer("/properties/spec/properties/containers").is_some() {
        let _ = writeln!(
            text,
            "| `{path}` | object: a Kubernetes [PodTemplateSpec](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-template-v1/#PodTemplateSpec) | {} |",
            description.trim()
        );
        return;
    }
    let _ = writeln!(text, "| `{path}` | {kind} | {} |", description.trim());
    let required_here = schema_required(schema);
    if let Some(properties) = schema["properties"].as_object() {
        for (name, child) in properties {
            fields(text, &format!("{path}.{name}"), child, required_here.contains(name));
        }
    }
    if schema["items"].is_object() {
        fields(text, &format!("{path}[]"), &schema["items"], false);
    }
    if schema["additionalProperties"].is_object() {
        fields(text, &format!("{path}.<name>"), &schema["additionalProperties"], false);
    }
}

/// The operator's `/metrics`: each metric's name, type and help, from its registry.
fn metrics() -> String {
    let api: std::sync::Arc<perennial_operator::client::ApiHealth> = Default::default();
    let metrics = perennial_operator::metrics::Metrics::with_api(api.clone());
    // A family shows in the exposition once it has a sample: one of each, to read its labels.
    metrics.error("patch_status");
    metrics.transition("Train", "Ready");
    metrics.pod_created("train");
    metrics.link_refusal("refused");
    api.requests.sent(&http::Method::GET, "/api/v1/namespaces/default/pods", None);
    let mut text = format!(
        "{GENERATED}# Metrics\n\n`perennial operator` serves Prometheus metrics on `/metrics` of its metrics address \
         (`--metrics-addr`), beside `/healthz`, `/readyz` and `/leaderz`.\n\n| metric | type | labels | what it counts |\n|---|---|---|---|\n"
    );
    let exposition = metrics.render();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# HELP ") else { continue };
        let Some((name, help)) = rest.split_once(' ') else { continue };
        let kind =
            exposition.lines().find_map(|l| l.strip_prefix(&format!("# TYPE {name} "))).unwrap_or("untyped").to_owned();
        // Counters are exposed with the `_total` suffix.
        let exposed = if kind == "counter" { format!("{name}_total") } else { name.to_owned() };
        let labels: Vec<String> = exposition
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{exposed}{{")))
            .and_then(|l| l.split_once('}'))
            .map(|(pairs, _)| {
                pairs.split(',').filter_map(|p| p.split_once('=')).map(|(k, _)| format!("`{k}`")).collect()
            })
            .unwrap_or_default();
        let _ = writeln!(text, "| `{exposed}` | {kind} | {} | {} |", labels.join(", "), help.trim_end_matches('.'));
    }
    text
}

fn wit() -> String {
    let contract = include_str!("../../../../wit/policy.wit");
    format!(
        "{GENERATED}# The policy contract (WIT)\n\nEvery policy is a WebAssembly component that exports one of these worlds. \
         The file is `wit/policy.wit`; `perennial plugin new` vendors it into each project.\n\n```wit\n{contract}```\n"
    )
}

/// What each variable means; the test checks both ways that these are the names the code gives.
const ENV_MEANING: &[(&str, &str)] = &[
    ("NAMESPACE", "the job's namespace"),
    ("JOB_NAME", "the job's name"),
    ("WORKER_NAME", "this worker's name: its reports are accepted only under it"),
    (
        "LC_SERVER",
        "the edge agent's worker API, where the worker POSTs its report (`/sedna/workers/{WORKER_NAME}/info`)",
    ),
    ("KB_SERVER", "Sedna's knowledge-base server (`--kb-server`)"),
    ("HAS_COMPLETED_INITIAL_TRAINING", "`true` from the second round on (a previous model exists)"),
    ("CLOUD_KB_INDEX", "the previous round's model (train, from round 2)"),
    ("OUTPUT_URL", "where the worker writes its output (the round's folder; for inference the job's outputDir)"),
    ("TRAIN_DATASET_URL", "the round's train samples, written by the edge agent"),
    ("TEST_DATASET_URL", "the round's eval samples, written by the edge agent"),
    ("ORIGINAL_DATASET_URL", "the Dataset's index file (or the round's data index)"),
    ("MODEL_URLS", "the models to evaluate (`;`-separated), or the deployed model for inference"),
    ("DATA_PATH_PREFIX", "where host paths are mounted in a pod (`/home/data`); pods only, when a host path is used"),
    ("S3_ENDPOINT_URL", "the S3 endpoint of the job's (else the Dataset's) credential; pods only, when S3 is read"),
    ("ACCESS_KEY_ID", "from the credential's Secret (by reference, never a value); pods only, when S3 is read"),
    ("SECRET_ACCESS_KEY", "from the credential's Secret (by reference, never a value); pods only, when S3 is read"),
];

/// The env each stage's worker gets, as `sedna_env` gives it for an example round 2.
fn worker_env() -> String {
    use perennial_api::{Input, Model, Stage};
    use perennial_lifecycle::WorkerSpec;
    let model = |url: &str| Model { url: url.into(), ..Model::default() };
    let ctx = |worker_name| perennial_workers::WorkerContext {
        namespace: "default",
        job_name: "atcii",
        worker_name,
        lc_server: "http://127.0.0.1:9100",
        kb_server: "http://127.0.0.1:9020",
        output_dir: "/output",
        dataset_url: "/data/index.txt",
    };
    let stages = [
        WorkerSpec {
            stage: Stage::Train,
            round: 2,
            input: Input {
                data_url: Some("/output/data/train/2/data.txt".into()),
                output_dir: Some("/output/train/2".into()),
                ..Input::default()
            },
            previous_model: Some(model("/output/train/1/model.pkl")),
        },
        WorkerSpec {
            stage: Stage::Eval,
            round: 2,
            input: Input {
                models: vec![model("/output/train/2/model.pkl")],
                data_url: Some("/output/data/eval/2/data.txt".into()),
                output_dir: Some("/output/eval/2".into()),
                ..Input::default()
            },
            previous_model: None,
        },
        WorkerSpec { stage: Stage::Deploy, round: 2, input: Input::default(), previous_model: None },
    ];
    let mut text = format!(
        "{GENERATED}# The workers' env\n\nSedna's names and values, so that Sedna's worker images run unchanged. Each \
         stage's worker gets these after its template's own env (they win over a template entry of the same name). The \
         values are an example: job `atcii`, outputDir `/output`, round 2, on a local run.\n"
    );
    for spec in &stages {
        let (stage, worker) = match spec.stage {
            Stage::Train => ("train", "atcii-train-x7k2p"),
            Stage::Eval => ("eval", "atcii-eval-q4m9z"),
            Stage::Deploy => ("inference", "atcii-inference-b8c3d"),
        };
        let _ = write!(text, "\n## The {stage} worker\n\n| variable | example | meaning |\n|---|---|---|\n");
        for (name, value) in perennial_workers::sedna_env(spec, &ctx(worker)) {
            let _ = writeln!(text, "| `{name}` | `{value}` | {} |", meaning(&name));
        }
    }
    text.push_str("\n## In pods only\n\n| variable | meaning |\n|---|---|\n");
    let pod_only = std::iter::once("DATA_PATH_PREFIX").chain(perennial_workers::pod::S3_ENV);
    for name in pod_only {
        let _ = writeln!(text, "| `{name}` | {} |", meaning(name));
    }
    text
}

fn meaning(name: &str) -> &'static str {
    ENV_MEANING.iter().find(|(n, _)| *n == name).map(|(_, m)| *m).unwrap_or("")
}

#[test]
fn every_worker_variable_is_explained_and_every_explained_one_is_given() {
    let page = worker_env();
    for (name, _) in ENV_MEANING {
        assert!(page.contains(&format!("| `{name}` |")), "{name} is explained but no worker gets it");
    }
    assert!(!page.contains(" |  |\n"), "a variable the workers get has no meaning in ENV_MEANING:\n{page}");
}

#[test]
fn docs_reference_is_up_to_date() {
    let dir = reference_dir();
    let update = std::env::var_os(UPDATE).is_some();
    let mut stale = Vec::new();
    for (file, text) in pages() {
        let path = dir.join(file);
        if update {
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        match std::fs::read_to_string(&path) {
            Ok(checked_in) if checked_in == text => {}
            Ok(_) => stale.push(format!("{file} differs from what the code generates")),
            Err(err) => stale.push(format!("{file}: {err}")),
        }
    }
    assert!(
        stale.is_empty(),
        "docs/src/reference is stale: {}; run `{UPDATE}=1 cargo test -p perennial --bin perennial docs` and commit it",
        stale.join("; ")
    );
}

#[test]
fn the_cli_page_has_every_visible_subcommand() {
    let page = cli();
    for command in ["run", "status", "edge", "operator", "plugin new", "plugin compile", "decisions"] {
        assert!(page.contains(&format!("## `perennial {command}`")), "no section for `perennial {command}`");
    }
    assert!(!page.contains("perennial reap"), "a hidden command is documented");
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every relative link of the README and the book's pages names a file that exists, and a heading
/// of it that exists when it names one (`page.md#heading`).
#[test]
fn docs_links_resolve() {
    let mut pages = vec![repo().join("README.md")];
    let mut folders = vec![repo().join("docs/src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display())).flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        // `[text](target)`: what follows each `](` up to its `)`.
        let targets = text.split("](").skip(1).filter_map(|rest| rest.split_once(')').map(|(t, _)| t.to_owned()));
        for target in targets.filter(|t| !t.contains(char::is_whitespace)) {
            let file = target.split('#').next().unwrap_or_default();
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let resolved = if file.is_empty() {
                page.clone()
            } else {
                page.parent().map(|dir| dir.join(file)).unwrap_or_default()
            };
            let anchor = target.split_once('#').map(|(_, anchor)| anchor);
            let found = match anchor {
                _ if !resolved.exists() => false,
                Some(anchor) if resolved.extension().is_some_and(|e| e == "md") => {
                    heading_ids(&std::fs::read_to_string(&resolved).unwrap_or_default()).contains(&anchor.to_owned())
                }
                _ => true,
            };
            if !found {
                broken.push(format!("{}: {target}", page.strip_prefix(repo()).unwrap_or(page).display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

/// The ids mdBook gives a page's headings: the text without its markup, lower case, spaces as
/// `-`, other punctuation dropped (a repeated one numbered).
fn heading_ids(page: &str) -> Vec<String> {
    let (mut ids, mut bases): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(text) = line.strip_prefix('#').filter(|_| !fenced) else { continue };
        let text = text.trim_start_matches('#').trim();
        // A link's text only: `[text](target)`.
        let mut plain = String::new();
        let mut rest = text;
        while let Some(open) = rest.find('[') {
            plain.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            match after.split_once("](").and_then(|(label, tail)| Some((label, tail.split_once(')')?.1))) {
                Some((label, tail)) => {
                    plain.push_str(label);
                    rest = tail;
                }
                None => {
                    plain.push('[');
                    rest = after;
                }
            }
        }
        plain.push_str(rest);
        let id: String = plain
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let repeats = bases.iter().filter(|base| **base == id).count();
        bases.push(id.clone());
        ids.push(if repeats == 0 { id } else { format!("{id}-{repeats}") });
    }
    ids
}

/// The README stays a front page: what Perennial is, the two commands, links into the book.
#[test]
fn the_readme_is_short() {
    let size = std::fs::metadata(repo().join("README.md")).map(|m| m.len()).unwrap_or(u64::MAX);
    assert!(size <= 12 * 1024, "README.md is {size} bytes: keep it under 12 KB, and move the rest into docs/");
}
