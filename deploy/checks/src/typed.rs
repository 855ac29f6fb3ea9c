//! Kubernetes manifests read back as their k8s-openapi types, so that a misspelt field fails.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Reads `value` as `K` and checks that nothing was lost on the way: k8s-openapi drops the
/// fields it does not know, so a misspelt field shows up as a difference.
pub fn typed<K: DeserializeOwned + Serialize>(value: &Value, what: &str) -> K {
    let object: K = serde_json::from_value(value.clone()).unwrap_or_else(|err| panic!("{what}: {err}"));
    let back = serde_json::to_value(&object).expect("a Kubernetes object serializes");
    let mut differences = Vec::new();
    compare(value, &back, "", &mut differences);
    assert!(differences.is_empty(), "{what} does not read back as its type (a misspelt field?): {differences:#?}");
    object
}

/// The differences between the document and its typed form, by JSON pointer.
fn compare(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                match b.get(key) {
                    Some(other) => compare(value, other, &format!("{path}/{key}"), out),
                    None => out.push(format!("{path}/{key}: not a field of the type")),
                }
            }
            for key in b.keys().filter(|key| !a.contains_key(*key)) {
                out.push(format!("{path}/{key}: added by the type"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                compare(x, y, &format!("{path}/{index}"), out);
            }
        }
        // YAML's `1` is JSON's 1, which a float field writes back as 1.0.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} reads back as {b}")),
    }
}
