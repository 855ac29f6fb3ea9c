//! Unknown fields: where one is (`spec.trainSpec.trigger.checkPeriodSecond`) and which known
//! field it most resembles, from the resource's OpenAPI schema (the one in the CRD).

use std::sync::OnceLock;

use serde_json::Value;

/// One step of a path into a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Field(String),
    Index(usize),
}

/// The steps of a path `serde_ignored` reports, from the document down.
pub fn segments(path: &serde_ignored::Path<'_>) -> Vec<Segment> {
    use serde_ignored::Path;
    let mut out = Vec::new();
    let mut at = path;
    loop {
        at = match at {
            Path::Root => break,
            Path::Seq { parent, index } => {
                out.push(Segment::Index(*index));
                parent
            }
            Path::Map { parent, key } => {
                out.push(Segment::Field(key.to_string()));
                parent
            }
            Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => parent,
        };
    }
    out.reverse();
    out
}

/// `spec.containers[0].image`.
pub fn shown(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Field(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The message for an unknown field at `path`, with the known field it most resembles.
pub fn unknown_field(path: &[Segment], schema: Option<&Value>) -> String {
    let guess = match (path.split_last(), schema) {
        (Some((Segment::Field(name), parent)), Some(schema)) => {
            properties_at(schema, parent).and_then(|known| closest(name, known))
        }
        _ => None,
    };
    match guess {
        Some(known) => format!("{}: unknown field; did you mean {known:?}?", shown(path)),
        None => format!("{}: unknown field", shown(path)),
    }
}

/// The property names of the object at `path` in an OpenAPI schema.
fn properties_at<'a>(schema: &'a Value, path: &[Segment]) -> Option<Vec<&'a str>> {
    let mut at = schema;
    for segment in path {
        at = match segment {
            Segment::Field(name) => at.get("properties")?.get(name)?,
            Segment::Index(_) => at.get("items")?,
        };
    }
    Some(at.get("properties")?.as_object()?.keys().map(String::as_str).collect())
}

/// The known name nearest to `name`, if near enough to be a typo (a case slip, a letter or two).
fn closest<'a>(name: &str, known: Vec<&'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|candidate| (strsim::damerau_levenshtein(&name.to_lowercase(), &candidate.to_lowercase()), candidate))
        .filter(|(distance, candidate)| *distance <= 2.max(candidate.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// The LifelongLearningJob's schema.
pub fn job() -> Option<&'static Value> {
    static SCHEMA: OnceLock<Option<Value>> = OnceLock::new();
    SCHEMA.get_or_init(|| schema_of(0)).as_ref()
}

/// The Dataset's schema.
pub fn dataset() -> Option<&'static Value> {
    static SCHEMA: OnceLock<Option<Value>> = OnceLock::new();
    SCHEMA.get_or_init(|| schema_of(1)).as_ref()
}

fn schema_of(crd: usize) -> Option<Value> {
    let crd = serde_json::to_value(&crate::crd::crds()[crd]).ok()?;
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema").cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_the_field_it_resembles() {
        let path = |p: &[&str]| p.iter().map(|s| Segment::Field(s.to_string())).collect::<Vec<_>>();
        let message = unknown_field(&path(&["spec", "trainSpec", "trigger", "checkPeriodSecond"]), job());
        assert_eq!(
            message,
            "spec.trainSpec.trigger.checkPeriodSecond: unknown field; did you mean \"checkPeriodSeconds\"?"
        );
        let message = unknown_field(&path(&["spec", "dataset", "trainprob"]), job());
        assert!(message.ends_with("did you mean \"trainProb\"?"), "{message}");
        let message = unknown_field(&path(&["spec", "colour"]), dataset());
        assert_eq!(message, "spec.colour: unknown field");
    }
}
