//! A YAML document as the JSON an API server would store, refused where JSON cannot say it the
//! same: NaN and infinities, keys that are not scalars, custom tags, nesting past
//! [`super::MAX_DEPTH`]. Scalar keys become strings, as kubectl's YAML-to-JSON makes them.

use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;

/// Converts one document; an error names the field (`spec.dataset.trainProb: .nan ...`).
pub fn from_yaml(value: Yaml) -> Result<Json, String> {
    convert(value, &mut String::new(), 0)
}

fn convert(value: Yaml, path: &mut String, depth: usize) -> Result<Json, String> {
    if depth > super::MAX_DEPTH {
        return Err(format!("{}: nested deeper than {} levels", shown(path), super::MAX_DEPTH));
    }
    Ok(match value {
        Yaml::Null => Json::Null,
        Yaml::Bool(b) => Json::Bool(b),
        Yaml::Number(n) => number(&n).ok_or_else(|| {
            format!("{}: {n} is not a number a manifest may hold (NaN and infinities are refused)", shown(path))
        })?,
        Yaml::String(s) => Json::String(s),
        Yaml::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                out.push(convert(item, path, depth + 1)?);
                path.truncate(len);
            }
            Json::Array(out)
        }
        Yaml::Mapping(map) => {
            let mut out = serde_json::Map::with_capacity(map.len());
            for (key, item) in map {
                let key = match key {
                    Yaml::String(s) => s,
                    Yaml::Bool(b) => b.to_string(),
                    Yaml::Number(n) => n.to_string(),
                    _ => return Err(format!("{}: a key that is not a string, number or boolean", shown(path))),
                };
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&key);
                let converted = convert(item, path, depth + 1)?;
                path.truncate(len);
                // Keys that differ in YAML may be the same string here (`1` and `"1"`).
                if out.insert(key.clone(), converted).is_some() {
                    return Err(format!("{}: the key {key:?} is given twice", shown(path)));
                }
            }
            Json::Object(out)
        }
        Yaml::Tagged(tagged) => {
            return Err(format!("{}: the YAML tag {} is not supported", shown(path), tagged.tag));
        }
    })
}

fn number(n: &serde_yaml_ng::Number) -> Option<Json> {
    if let Some(i) = n.as_i64() {
        Some(i.into())
    } else if let Some(u) = n.as_u64() {
        Some(u.into())
    } else {
        n.as_f64().and_then(serde_json::Number::from_f64).map(Json::Number)
    }
}

fn shown(path: &str) -> &str {
    if path.is_empty() { "(the document)" } else { path }
}
