//! What a node may report on: only the jobs and datasets that live on it (those of its desired
//! state). Sedna's link took any node's word for any job (`reference/sedna.md` §6.2).

use serde_json::Value;

use super::cloud_server::NodeDesired;

/// Whether a report `body` is about an object the node holds; the reason when it is not.
pub fn check(body: &Value, held: &NodeDesired) -> Result<(), String> {
    if let Some(job) = body.get("job").and_then(Value::as_str) {
        return if held.jobs.contains_key(job) {
            Ok(())
        } else {
            Err(format!("job {job} does not live on this node: a node reports only on its own jobs"))
        };
    }
    if let Some(dataset) = body.get("dataset").and_then(Value::as_str) {
        return if held.datasets.contains_key(dataset) {
            Ok(())
        } else {
            Err(format!("dataset {dataset} does not live on this node: a node reports only on its own datasets"))
        };
    }
    Err("the report names no job and no dataset".to_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn held() -> NodeDesired {
        let mut held = NodeDesired::default();
        held.jobs.insert("ml/thermal".into(), json!({}).into());
        held.datasets.insert("ml/readings".into(), json!({}).into());
        held
    }

    #[test]
    fn a_node_reports_on_its_own_jobs_and_datasets_only() {
        let cases = [
            (json!({"job": "ml/thermal", "phase": "Train"}), Ok(())),
            (json!({"dataset": "ml/readings", "numberOfSamples": 3}), Ok(())),
            (
                json!({"job": "ml/other", "phase": "Train"}),
                Err("job ml/other does not live on this node: a node reports only on its own jobs".to_owned()),
            ),
            (
                json!({"dataset": "ml/other"}),
                Err("dataset ml/other does not live on this node: a node reports only on its own datasets".to_owned()),
            ),
            (json!({"phase": "Train"}), Err("the report names no job and no dataset".to_owned())),
            (json!({"job": 7}), Err("the report names no job and no dataset".to_owned())),
        ];
        for (body, expected) in cases {
            assert_eq!(check(&body, &held()), expected, "{body}");
        }
    }
}
