//! The jobs' worker pod templates, held in the job store as one compact JSON text (in an
//! annotation of the stored copy only) instead of three typed core/v1 `PodTemplateSpec`s: typed,
//! they were most of a stored job (about 10 KiB of a fleet's 15 KiB a job), and the operator reads
//! them only where it validates a job, names its pull Secrets or makes a worker pod. Those take the
//! job through [`restored`]. The stored copy is never written back (status and finalizer writes
//! build their own bodies), so the annotation never reaches the API server.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::ResourceExt;
use perennial_api::LifelongLearningJob;

/// The annotation holding the train, eval and deploy templates, in that order.
const TEMPLATES: &str = "operator.perennial.io/stored-templates";

/// The one empty template every stored job holds in place of its own.
static EMPTY: OnceLock<Arc<PodTemplateSpec>> = OnceLock::new();

/// Moves the job's three templates into the annotation (a copy for the store); a copy made
/// compact already stays as it is.
pub fn compact(job: &mut LifelongLearningJob) {
    if is_compact(job) {
        return;
    }
    // One the job came with is not ours to trust.
    job.annotations_mut().remove(TEMPLATES);
    let spec = &mut job.spec;
    let templates = [&spec.train_spec.template, &spec.eval_spec.template, &spec.deploy_spec.template];
    let Ok(text) = serde_json::to_string(&templates) else { return };
    let empty = EMPTY.get_or_init(Arc::default);
    for template in [&mut spec.train_spec.template, &mut spec.eval_spec.template, &mut spec.deploy_spec.template] {
        *template = empty.clone();
    }
    job.annotations_mut().insert(TEMPLATES.to_owned(), text);
}

/// Whether `annotation` is the one that holds a stored copy's templates.
pub fn is_ours(annotation: &str) -> bool {
    annotation == TEMPLATES
}

/// Whether the job's templates are held compact (a stored copy): the annotation, and the shared
/// empty template in their place. A job read from the API server is never one, whatever its
/// annotations say.
pub fn is_compact(job: &LifelongLearningJob) -> bool {
    let Some(empty) = EMPTY.get() else { return false };
    let spec = &job.spec;
    let templates = [&spec.train_spec.template, &spec.eval_spec.template, &spec.deploy_spec.template];
    templates.iter().all(|template| Arc::ptr_eq(template, empty))
        && job.metadata.annotations.as_ref().is_some_and(|annotations| annotations.contains_key(TEMPLATES))
}

/// The job with its templates back in place (a copy only when they were compact). A text that
/// does not parse (written by `compact` from the same types: a bug) is an error, never empty
/// templates, which would be refused as the user's.
pub fn restored(job: &LifelongLearningJob) -> Result<Cow<'_, LifelongLearningJob>, serde_json::Error> {
    Ok(if is_compact(job) { Cow::Owned(restore(job.clone())?) } else { Cow::Borrowed(job) })
}

/// [`restored`] for a shared job.
pub fn restored_arc(job: Arc<LifelongLearningJob>) -> Result<Arc<LifelongLearningJob>, serde_json::Error> {
    Ok(if is_compact(&job) { Arc::new(restore(job.as_ref().clone())?) } else { job })
}

fn restore(mut job: LifelongLearningJob) -> Result<LifelongLearningJob, serde_json::Error> {
    let Some(text) = job.annotations_mut().remove(TEMPLATES) else { return Ok(job) };
    if job.annotations().is_empty() {
        job.metadata.annotations = None;
    }
    let [train, eval, deploy] = serde_json::from_str::<[PodTemplateSpec; 3]>(&text)?;
    job.spec.train_spec.template = Arc::new(train);
    job.spec.eval_spec.template = Arc::new(eval);
    job.spec.deploy_spec.template = Arc::new(deploy);
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(annotations: serde_json::Value) -> LifelongLearningJob {
        let template = |image: &str| {
            json!({
                "metadata": {"labels": {"app": "w"}, "annotations": {"a": "b"}},
                "spec": {
                    "nodeName": "edge-1",
                    "imagePullSecrets": [{"name": "regcred"}],
                    "containers": [{
                        "name": "w", "image": image, "command": ["python3"], "args": ["train.py"],
                        "env": [{"name": "K", "value": "v"},
                                {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                        "resources": {"limits": {"memory": "2Gi", "cpu": "500m"}},
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }],
                    "volumes": [{"name": "data", "hostPath": {"path": "/var/data"}}]
                }
            })
        };
        serde_json::from_value(json!({
            "apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "annotations": annotations},
            "spec": {"dataset": {"name": "d", "trainProb": 0.8},
                     "trainSpec": {"template": template("sedna/train:v1"), "trigger": {}},
                     "evalSpec": {"template": template("sedna/eval:v1")},
                     "deploySpec": {"template": template("sedna/infer:v1")}, "outputDir": "/o"}
        }))
        .expect("a job")
    }

    fn value(job: &LifelongLearningJob) -> serde_json::Value {
        serde_json::to_value(job).expect("serialisable")
    }

    #[test]
    fn a_stored_job_holds_its_templates_as_text_and_gives_them_back_as_they_were() {
        let original = job(json!({"team": "vision"}));
        let mut stored = original.clone();
        compact(&mut stored);
        assert!(is_compact(&stored));
        assert_eq!(*stored.spec.train_spec.template, PodTemplateSpec::default(), "no typed template kept");
        let mut other = job(serde_json::Value::Null);
        compact(&mut other);
        assert!(Arc::ptr_eq(&stored.spec.deploy_spec.template, &other.spec.eval_spec.template), "one empty, shared");
        assert_eq!(stored.annotations().get("team").map(String::as_str), Some("vision"), "the job's own kept");

        assert_eq!(value(restored(&stored).expect("restored").as_ref()), value(&original));
        let twice = {
            let mut again = stored.clone();
            compact(&mut again);
            again
        };
        assert_eq!(value(&twice), value(&stored), "a stored copy made compact again stays as it is");
        assert_eq!(value(restored_arc(Arc::new(stored)).expect("restored").as_ref()), value(&original));
        assert!(matches!(restored(&original), Ok(Cow::Borrowed(_))), "a job read from the API is used as it is");
    }

    #[test]
    fn a_job_without_annotations_gets_none_back_and_one_naming_ours_is_not_trusted() {
        let original = job(serde_json::Value::Null);
        let mut stored = original.clone();
        compact(&mut stored);
        assert_eq!(value(restored(&stored).expect("restored").as_ref()), value(&original), "no empty annotations left");

        // A user's annotation of that name: not taken for a stored copy's, and replaced by the
        // job's own templates when stored.
        let forged = job(json!({TEMPLATES: "[{}, {}, {}]"}));
        assert!(!is_compact(&forged));
        assert!(matches!(restored(&forged), Ok(Cow::Borrowed(_))));
        let mut stored = forged.clone();
        compact(&mut stored);
        let back = restored(&stored).expect("restored").into_owned();
        assert_eq!(back.spec, forged.spec);
        assert!(!is_compact(&back));
    }

    #[test]
    fn a_stored_text_that_does_not_parse_is_an_error_not_empty_templates() {
        let mut stored = job(serde_json::Value::Null);
        compact(&mut stored);
        stored.annotations_mut().insert(TEMPLATES.to_owned(), "[{}]".to_owned());
        assert!(restored(&stored).is_err());
        assert!(restored_arc(Arc::new(stored)).is_err());
    }
}
