//! A pod template's container as a local command: the embedded mode runs the container's
//! `command` and `args` in `workingDir` with its `env` (the image is not used), with
//! Kubernetes' `$(VAR)` expansion.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PodTemplateSpec;

use super::local::RestartPolicy;
use super::probe::Readiness;

/// A container as a process.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalCommand {
    pub program: String,
    pub args: Vec<String>,
    /// The container's `workingDir` (relative: to the manifest's folder), or the manifest's folder.
    pub cwd: PathBuf,
    /// The container's env, in order (not yet expanded).
    pub env: Vec<(String, String)>,
    pub restart_policy: RestartPolicy,
    /// The container's `readinessProbe`.
    pub readiness: Option<Readiness>,
}

/// Reads the first container of `template` (at `field`, e.g. `spec.trainSpec.template`), whose
/// manifest is in `manifest_dir`. `default_restart` is Sedna's: OnFailure for train and eval,
/// Always for inference.
pub fn local_command(
    template: &PodTemplateSpec,
    field: &str,
    manifest_dir: &Path,
    default_restart: RestartPolicy,
) -> Result<LocalCommand, String> {
    let pod = template.spec.as_ref().ok_or_else(|| format!("{field}.spec: missing"))?;
    let field = format!("{field}.spec.containers[0]");
    let container = pod.containers.first().ok_or_else(|| format!("{field}: missing"))?;
    let mut words: Vec<String> = container.command.clone().unwrap_or_default();
    words.extend(container.args.clone().unwrap_or_default());
    if container.command.as_ref().is_none_or(|c| c.is_empty()) {
        return Err(format!(
            "{field}.command: empty; in embedded mode a worker runs its container's command and args \
             (the image {:?} is not used)",
            container.image.as_deref().unwrap_or("")
        ));
    }
    let program = words.remove(0);
    let cwd = match container.working_dir.as_deref() {
        Some(dir) if !dir.is_empty() => manifest_dir.join(dir),
        _ => manifest_dir.to_owned(),
    };
    let mut env = Vec::new();
    for (i, var) in container.env.iter().flatten().enumerate() {
        if var.value_from.is_some() {
            return Err(format!(
                "{field}.env[{i}] ({}): valueFrom is not available in embedded mode; give a value",
                var.name
            ));
        }
        env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
    }
    let restart_policy = match pod.restart_policy.as_deref() {
        None => default_restart,
        Some("Always") => RestartPolicy::Always,
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        Some(other) => {
            return Err(format!(
                "{}.spec.restartPolicy: {other:?} is not Always, OnFailure or Never",
                field.trim_end_matches(".spec.containers[0]")
            ));
        }
    };
    let readiness = super::probe::readiness(container, &field)?;
    Ok(LocalCommand { program, args: words, cwd, env, restart_policy, readiness })
}

/// Kubernetes' expansion: `$(NAME)` becomes NAME's value when `lookup` knows it and stays as
/// written otherwise; `$$` is a literal `$`.
pub fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(yaml: &str) -> PodTemplateSpec {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_container_becomes_a_command() {
        let t = template(
            r#"
spec:
  containers:
    - name: train
      image: kubeedge/sedna-example:v0.5.0
      command: ["python3", "train.py"]
      args: ["--epochs", "3"]
      workingDir: scripts
      env:
        - {name: A, value: "1"}
        - {name: B}
"#,
        );
        let c = local_command(&t, "spec.trainSpec.template", Path::new("/ex"), RestartPolicy::OnFailure).unwrap();
        assert_eq!(c.program, "python3");
        assert_eq!(c.args, ["train.py", "--epochs", "3"]);
        assert_eq!(c.cwd, Path::new("/ex/scripts"));
        assert_eq!(c.env, [("A".to_owned(), "1".to_owned()), ("B".to_owned(), String::new())]);
        assert_eq!(c.restart_policy, RestartPolicy::OnFailure);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "spec: {containers: [{name: t, image: img, args: [train.py]}]}",
                "spec.trainSpec.template.spec.containers[0].command: empty; in embedded mode",
            ),
            (
                "spec: {containers: [{name: t, image: i, command: [x], env: [{name: K, valueFrom: {secretKeyRef: {name: s, key: k}}}]}]}",
                "spec.trainSpec.template.spec.containers[0].env[0] (K): valueFrom",
            ),
            ("spec: {containers: []}", "spec.trainSpec.template.spec.containers[0]: missing"),
            (
                "spec: {restartPolicy: Sometimes, containers: [{name: t, image: i, command: [x]}]}",
                "spec.trainSpec.template.spec.restartPolicy: \"Sometimes\"",
            ),
        ];
        for (yaml, expected) in cases {
            let err = local_command(&template(yaml), "spec.trainSpec.template", Path::new("/"), RestartPolicy::Never)
                .unwrap_err();
            assert!(err.starts_with(expected), "{yaml}: {err}");
        }
        let policy = "spec: {restartPolicy: Never, containers: [{name: t, image: i, command: [x]}]}";
        let c = local_command(&template(policy), "f", Path::new("/"), RestartPolicy::Always).unwrap();
        assert_eq!(c.restart_policy, RestartPolicy::Never, "the template's restartPolicy wins");
    }

    #[test]
    fn expansion_as_kubernetes_does_it() {
        let lookup = |name: &str| match name {
            "STATE" => Some("/var/lib/p".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let cases = [
            ("$(STATE)/data/index.csv", "/var/lib/p/data/index.csv"),
            ("a$(EMPTY)b", "ab"),
            ("$(UNKNOWN)/x", "$(UNKNOWN)/x"),
            ("$$(STATE)", "$(STATE)"),
            ("cost: $5", "cost: $5"),
            ("$(STATE", "$(STATE"),
            ("$", "$"),
            ("no vars", "no vars"),
        ];
        for (text, expected) in cases {
            assert_eq!(expand(text, &lookup), expected, "{text}");
        }
    }
}
