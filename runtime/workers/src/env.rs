//! Sedna's worker env (`reference/sedna.md` §2.3 and §5.1), so that Sedna's worker images and
//! scripts run unchanged: the names, the values, and which stage gets which.

use perennial_api::Stage;
use perennial_lifecycle::WorkerSpec;

/// What the env is made from, beyond the stage machine's worker spec.
#[derive(Clone, Debug, Default)]
pub struct WorkerContext<'a> {
    pub namespace: &'a str,
    pub job_name: &'a str,
    pub worker_name: &'a str,
    /// The edge agent's worker API, e.g. `http://127.0.0.1:9100`.
    pub lc_server: &'a str,
    /// Sedna's knowledge-base server (train and eval only).
    pub kb_server: &'a str,
    /// The job's `spec.outputDir`.
    pub output_dir: &'a str,
    /// The dataset's `spec.url`.
    pub dataset_url: &'a str,
}

/// The env Sedna's control plane gives the worker of `spec.stage`, in Sedna's order (it is
/// appended after the template's own env, so it wins over a template entry of the same name).
pub fn sedna_env(spec: &WorkerSpec, ctx: &WorkerContext<'_>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| env.push((name.to_owned(), value.to_owned()));
    set("NAMESPACE", ctx.namespace);
    set("JOB_NAME", ctx.job_name);
    set("WORKER_NAME", ctx.worker_name);
    set("LC_SERVER", ctx.lc_server);
    let input = &spec.input;
    let original = input.data_index_url.as_deref().filter(|u| !u.is_empty()).unwrap_or(ctx.dataset_url);
    match spec.stage {
        Stage::Train => {
            set("KB_SERVER", ctx.kb_server);
            set("HAS_COMPLETED_INITIAL_TRAINING", if spec.previous_model.is_some() { "true" } else { "false" });
            if let Some(model) = &spec.previous_model {
                set("CLOUD_KB_INDEX", &model.url);
            }
            set("OUTPUT_URL", input.output_dir.as_deref().unwrap_or_default());
            set("TRAIN_DATASET_URL", input.data_url.as_deref().unwrap_or_default());
            set("ORIGINAL_DATASET_URL", original);
        }
        Stage::Eval => {
            set("KB_SERVER", ctx.kb_server);
            let models: Vec<&str> = input.models.iter().map(|m| m.url.as_str()).collect();
            set("MODEL_URLS", &models.join(";"));
            set("OUTPUT_URL", input.output_dir.as_deref().unwrap_or_default());
            set("TEST_DATASET_URL", input.data_url.as_deref().unwrap_or_default());
            set("ORIGINAL_DATASET_URL", original);
        }
        Stage::Deploy => {
            set("OUTPUT_URL", ctx.output_dir);
            set("MODEL_URLS", &format!("{}/deploy/index.pkl", ctx.output_dir.trim_end_matches('/')));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use perennial_api::{Input, Model};

    fn ctx() -> WorkerContext<'static> {
        WorkerContext {
            namespace: "default",
            job_name: "atcii",
            worker_name: "train-worker-ab12",
            lc_server: "http://127.0.0.1:9100",
            kb_server: "http://127.0.0.1:9020",
            output_dir: "/output/",
            dataset_url: "/data/index.csv",
        }
    }

    fn get<'e>(env: &'e [(String, String)], name: &str) -> Option<&'e str> {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn each_stage_gets_sednas_env() {
        let model = |url: &str| Model { url: url.into(), format: "pkl".into(), metrics: None };
        let train = WorkerSpec {
            stage: Stage::Train,
            round: 2,
            input: Input {
                data_url: Some("/output/data/train/2/data.csv".into()),
                output_dir: Some("/output/train/2".into()),
                ..Input::default()
            },
            previous_model: Some(model("/output/train/1/index.pkl")),
        };
        let env = sedna_env(&train, &ctx());
        let expected = [
            ("NAMESPACE", "default"),
            ("JOB_NAME", "atcii"),
            ("WORKER_NAME", "train-worker-ab12"),
            ("LC_SERVER", "http://127.0.0.1:9100"),
            ("KB_SERVER", "http://127.0.0.1:9020"),
            ("HAS_COMPLETED_INITIAL_TRAINING", "true"),
            ("CLOUD_KB_INDEX", "/output/train/1/index.pkl"),
            ("OUTPUT_URL", "/output/train/2"),
            ("TRAIN_DATASET_URL", "/output/data/train/2/data.csv"),
            ("ORIGINAL_DATASET_URL", "/data/index.csv"),
        ];
        for (name, value) in expected {
            assert_eq!(get(&env, name), Some(value), "train {name}");
        }
        let first = WorkerSpec { previous_model: None, ..train };
        let env = sedna_env(&first, &ctx());
        assert_eq!(get(&env, "HAS_COMPLETED_INITIAL_TRAINING"), Some("false"));
        assert_eq!(get(&env, "CLOUD_KB_INDEX"), None, "no previous model, no CLOUD_KB_INDEX");

        let eval = WorkerSpec {
            stage: Stage::Eval,
            round: 2,
            input: Input {
                models: vec![model("/output/train/2/a.pkl"), model("/output/train/2/b.pkl")],
                data_url: Some("/output/data/eval/2/data.csv".into()),
                data_index_url: Some("/output/data/eval/2/dataIndex.txt".into()),
                output_dir: Some("/output/eval/2".into()),
            },
            previous_model: None,
        };
        let env = sedna_env(&eval, &ctx());
        assert_eq!(get(&env, "MODEL_URLS"), Some("/output/train/2/a.pkl;/output/train/2/b.pkl"));
        assert_eq!(get(&env, "TEST_DATASET_URL"), Some("/output/data/eval/2/data.csv"));
        assert_eq!(get(&env, "ORIGINAL_DATASET_URL"), Some("/output/data/eval/2/dataIndex.txt"));
        assert_eq!(get(&env, "OUTPUT_URL"), Some("/output/eval/2"));
        assert_eq!(get(&env, "TRAIN_DATASET_URL"), None);

        let deploy = WorkerSpec { stage: Stage::Deploy, round: 2, input: Input::default(), previous_model: None };
        let env = sedna_env(&deploy, &ctx());
        assert_eq!(get(&env, "MODEL_URLS"), Some("/output/deploy/index.pkl"));
        assert_eq!(get(&env, "OUTPUT_URL"), Some("/output/"));
        assert_eq!(get(&env, "KB_SERVER"), None, "Sedna gives the inference worker no KB_SERVER");
    }
}
