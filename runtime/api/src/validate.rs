//! Checks a resource before it is accepted; every error names the field (`spec.dataset.trainProb:
//! 1.5 is outside [0, 1]`). Sedna checks none of these.

use super::{Dataset, LifelongLearningJob, key};
use perennial_types::PolicyRef;

/// What is wrong with one object, a line per field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{object}: {}", .errors.join("; "))]
pub struct FieldErrors {
    /// `Kind namespace/name`.
    pub object: String,
    pub errors: Vec<String>,
}

/// Sedna's trigger operators and their aliases.
const OPERATORS: &[&str] = &[">", "gt", ">=", "ge", "<", "lt", "<=", "le", "=", "==", "eq", "!=", "ne"];
/// The statistics the built-in trigger can test (`num_of_samples` is Sedna's).
const METRICS: &[&str] = &["num_of_samples", "num_of_eval_samples", "total_samples", "rounds_completed"];

/// Checks a Dataset.
pub fn validate_dataset(dataset: &Dataset) -> Result<(), FieldErrors> {
    let mut errors = Vec::new();
    let spec = &dataset.spec;
    check_name(&dataset.metadata, &mut errors);
    if spec.url.trim().is_empty() {
        errors.push("spec.url: empty; give the index file's path or s3://bucket/key".into());
    } else if let Err(why) = check_location(&spec.url) {
        errors.push(format!("spec.url: {why}"));
    }
    if !["txt", "csv"].contains(&spec.format.to_ascii_lowercase().as_str()) {
        errors.push(format!("spec.format: {:?} is neither txt nor csv", spec.format));
    }
    if spec.node_name.trim().is_empty() {
        errors.push("spec.nodeName: empty; name the node whose agent watches the index".into());
    }
    let namespace = dataset.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(why) = credential_refusal(spec.credential_name.as_deref(), namespace) {
        errors.push(format!("spec.credentialName: {why}"));
    }
    done(format!("Dataset {}", key(&dataset.metadata)), errors)
}

/// Checks a LifelongLearningJob; `dataset_exists` answers for a Dataset `namespace/name`.
pub fn validate_job(job: &LifelongLearningJob, dataset_exists: &dyn Fn(&str) -> bool) -> Result<(), FieldErrors> {
    let mut errors = Vec::new();
    let spec = &job.spec;
    check_name(&job.metadata, &mut errors);
    let namespace = job.metadata.namespace.as_deref().unwrap_or("default");
    if spec.dataset.name.trim().is_empty() {
        errors.push("spec.dataset.name: empty".into());
    } else if !dataset_exists(&format!("{namespace}/{}", spec.dataset.name)) {
        errors.push(format!("spec.dataset.name: no Dataset {:?} in namespace {namespace}", spec.dataset.name));
    }
    let p = spec.dataset.train_prob;
    if !(0.0..=1.0).contains(&p) {
        errors.push(format!("spec.dataset.trainProb: {p} is outside [0, 1]"));
    }
    check_policy("spec.dataset.splitPolicy", spec.dataset.split_policy.as_ref(), &mut errors);
    check_trigger(spec, &mut errors);
    check_policy("spec.deploySpec.selectPolicy", spec.deploy_spec.select_policy.as_ref(), &mut errors);
    for (field, template) in [
        ("spec.trainSpec.template", &spec.train_spec.template),
        ("spec.evalSpec.template", &spec.eval_spec.template),
        ("spec.deploySpec.template", &spec.deploy_spec.template),
    ] {
        if template.spec.as_ref().is_none_or(|pod| pod.containers.is_empty()) {
            errors.push(format!("{field}.spec.containers: a worker template needs at least one container"));
        }
    }
    for (field, timeout) in [
        ("spec.trainSpec.timeoutSeconds", spec.train_spec.timeout_seconds),
        ("spec.evalSpec.timeoutSeconds", spec.eval_spec.timeout_seconds),
        ("spec.deploySpec.timeoutSeconds", spec.deploy_spec.timeout_seconds),
    ] {
        if timeout == Some(0) {
            errors.push(format!("{field}: 0; leave it out for no timeout"));
        }
    }
    if spec.eval_spec.eval_set_size == Some(0) {
        errors.push(format!(
            "spec.evalSpec.evalSetSize: 0; leave it out for the default of {} eval samples",
            super::DEFAULT_EVAL_SET_SIZE
        ));
    }
    if spec.output_dir.trim().is_empty() {
        errors.push("spec.outputDir: empty; give a path or s3://bucket/prefix".into());
    } else if let Err(why) = check_location(&spec.output_dir) {
        errors.push(format!("spec.outputDir: {why}"));
    }
    if let Some(why) = credential_refusal(spec.credential_name.as_deref(), namespace) {
        errors.push(format!("spec.credentialName: {why}"));
    }
    done(format!("LifelongLearningJob {}", key(&job.metadata)), errors)
}

/// Checks a Pod that the embedded mode runs beside the jobs (e.g. a data generator).
pub fn validate_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Result<(), FieldErrors> {
    let mut errors = Vec::new();
    check_name(&pod.metadata, &mut errors);
    if pod.spec.as_ref().is_none_or(|spec| spec.containers.is_empty()) {
        errors.push("spec.containers: a Pod needs at least one container".into());
    }
    done(format!("Pod {}", key(&pod.metadata)), errors)
}

fn check_trigger(spec: &super::LifelongLearningJobSpec, errors: &mut Vec<String>) {
    let Some(trigger) = &spec.train_spec.trigger else {
        errors.push("spec.trainSpec.trigger: missing; give Sedna's condition or a policy".into());
        return;
    };
    let field = "spec.trainSpec.trigger";
    // With a policy, Sedna's condition (if given) is the rule it falls back to: checked all the same.
    check_policy(&format!("{field}.policy"), trigger.policy.as_ref(), errors);
    match &trigger.condition {
        None if trigger.policy.is_some() => {}
        None => errors.push(format!("{field}.condition: missing; give operator, threshold and metric, or a policy")),
        Some(condition) => {
            if !OPERATORS.contains(&condition.operator.as_str()) {
                errors.push(format!(
                    "{field}.condition.operator: {:?} is not one of {}",
                    condition.operator,
                    OPERATORS.join(" ")
                ));
            }
            if !condition.threshold.is_finite() {
                errors.push(format!("{field}.condition.threshold: {} is not a number", condition.threshold));
            }
            if !METRICS.contains(&condition.metric.as_str()) {
                errors.push(format!(
                    "{field}.condition.metric: {:?} is not one of {}",
                    condition.metric,
                    METRICS.join(", ")
                ));
            }
        }
    }
    if let Some(timer) = &trigger.timer {
        for (name, time) in [("start", &timer.start), ("end", &timer.end)] {
            if let Err(why) = check_time(time, name == "end") {
                errors.push(format!("{field}.timer.{name}: {why}"));
            }
        }
    }
    // Sedna's window belongs to Sedna's rule: beside a policy it would gate only the fallback, so
    // a window that matters is refused rather than seen to do nothing.
    if let (Some(timer), Some(_)) = (&trigger.timer, &trigger.policy)
        && !(timer.start == "00:00" && timer.end == "24:00")
    {
        errors.push(format!(
            "{field}.timer: {}-{} does not gate trigger.policy (Sedna's window applies to Sedna's condition, \
             the policy's fallback, only): give the window in the policy's config (builtin:threshold-trigger \
             takes `timer`), or remove it",
            timer.start, timer.end
        ));
    }
    if let Some(period) = trigger.check_period_seconds.filter(|s| *s < 0) {
        errors.push(format!("{field}.checkPeriodSeconds: {period} is negative"));
    }
}

fn check_policy(field: &str, policy: Option<&PolicyRef>, errors: &mut Vec<String>) {
    if let Some(Err(why)) = policy.map(PolicyRef::validate) {
        errors.push(format!("{field}.{why}"));
    }
}

/// `HH:MM`, 00:00 to 23:59, and 24:00 as an end.
fn check_time(time: &str, is_end: bool) -> Result<(), String> {
    match minutes(time) {
        Some(m) if m < 24 * 60 => Ok(()),
        Some(m) if m == 24 * 60 && is_end => Ok(()),
        _ => Err(format!("{time:?} is not a time HH:MM (00:00 to 23:59, or 24:00 as an end)")),
    }
}

/// Minutes since midnight of `HH:MM` (two digits each, nothing else), up to 24:00.
fn minutes(time: &str) -> Option<u32> {
    let (h, m) = time.split_once(':')?;
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(h) || !two_digits(m) {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (m < 60 && h <= 24 && (h < 24 || m == 0)).then_some(h * 60 + m)
}

/// A path (no scheme) or `s3://bucket/...`, as Sedna's `CheckURL`, without control characters
/// (a NUL would cut the path short where the system reads it).
fn check_location(url: &str) -> Result<(), String> {
    if let Some(c) = url.chars().find(|c| c.is_control()) {
        return Err(format!("{url:?} contains the control character {c:?}"));
    }
    match url.split_once("://") {
        None => Ok(()),
        Some(("s3", rest)) if rest.split('/').next().is_some_and(|bucket| !bucket.is_empty()) => Ok(()),
        Some(("s3", _)) => Err(format!("{url:?} has no bucket (s3://bucket/key)")),
        Some((scheme, _)) => Err(format!("{url:?}: scheme {scheme}:// is not supported; use a path or s3://")),
    }
}

fn check_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, errors: &mut Vec<String>) {
    match meta.name.as_deref() {
        None | Some("") => errors.push("metadata.name: missing".into()),
        Some(name) if !is_dns_label(name) => errors.push(format!(
            "metadata.name: {name:?} is not a DNS-1123 name (lower-case letters, digits and '-', at most 63)"
        )),
        Some(_) => {}
    }
    // A namespace names folders and keys (`namespace/name`): a `/` or `..` in it would reach
    // outside them.
    if let Some(namespace) = meta.namespace.as_deref()
        && (namespace.contains('.') || !is_dns_label(namespace))
    {
        errors.push(format!(
            "metadata.namespace: {namespace:?} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)"
        ));
    }
}

/// Why a `credentialName` in `namespace` is refused, if it is: it must name a Secret of the
/// object's own namespace (the operator reads no other, and the name goes into the API path
/// as it is). Blank means none.
pub fn credential_refusal(name: Option<&str>, namespace: &str) -> Option<String> {
    let name = name.filter(|name| !name.is_empty())?;
    if let Some((other, secret)) = name.split_once('/')
        && is_dns_label(other)
        && other != namespace
    {
        return Some(format!(
            "{name:?} names the Secret {secret:?} of namespace {other:?}: a job or Dataset may use only a \
             Secret of its own namespace ({namespace}); copy it there and name it alone"
        ));
    }
    if !is_dns_subdomain(name) {
        return Some(format!(
            "{name:?} is not a Secret's name in this namespace ({namespace}): lower-case letters, digits, '-' and \
             '.', at most 253"
        ));
    }
    None
}

/// A DNS-1123 subdomain (a Secret's name): labels of `[a-z0-9-]`, alphanumeric at both ends,
/// joined by dots.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && label.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && label.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        })
}

fn is_dns_label(name: &str) -> bool {
    name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn done(object: String, errors: Vec<String>) -> Result<(), FieldErrors> {
    if errors.is_empty() { Ok(()) } else { Err(FieldErrors { object, errors }) }
}
