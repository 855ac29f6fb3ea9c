use serde::de::DeserializeOwned;

/// Parses a policy's JSON config into `T`, with an error that names the offending field.
///
/// An empty config (`""`) is read as `{}`, so a policy whose fields all have defaults needs
/// no config at all.
///
/// ```
/// #[derive(serde::Deserialize, Debug)]
/// #[serde(deny_unknown_fields)]
/// struct Config { condition: Condition }
/// #[derive(serde::Deserialize, Debug)]
/// struct Condition { threshold: f64 }
///
/// let err = perennial_guest::parse_config::<Config>(r#"{"condition": {"threshold": "x"}}"#)
///     .unwrap_err();
/// assert_eq!(err, r#"condition.threshold: expected a number, got "x""#);
/// ```
pub fn parse_config<T: DeserializeOwned>(config: &str) -> Result<T, String> {
    let text = if config.trim().is_empty() { "{}" } else { config };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return format!("config: not JSON ({inner})");
        }
        worded(&path, &without_position(&inner.to_string()))
    })?;
    de.end().map_err(|err| format!("config: not JSON ({err})"))?;
    Ok(parsed)
}

/// serde_json's message without its " at line 1 column 17", which says nothing of a config.
fn without_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) if message[at..].contains(" column ") => message[..at].to_owned(),
        _ => message.to_owned(),
    }
}

/// serde's message for a field, in the words the Python and JavaScript SDKs use: `samples:
/// missing`, `samples: expected a number, got "x"`, `x: unknown field (this policy reads: a, b)`,
/// `mode: "x" is not one of a, b`.
fn worded(path: &str, message: &str) -> String {
    let at = |field: &str| if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") };
    let named = |path: &str| if path.is_empty() { "config".to_owned() } else { path.to_owned() };
    if let Some(field) = message.strip_prefix("missing field `").and_then(|rest| rest.strip_suffix('`')) {
        return format!("{}: missing", at(field));
    }
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (field, known) = rest.split_once('`').unwrap_or((rest, ""));
        // The field is the last part of the path serde_path_to_error gives.
        let path = path.strip_suffix(field).map(|p| p.trim_end_matches('.')).unwrap_or(path);
        let field = if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") };
        return format!("{field}: unknown field (this policy reads: {})", listed(known));
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (value, known) = rest.split_once('`').unwrap_or((rest, ""));
        return format!("{}: {value:?} is not one of {}", named(path), listed(known));
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let (got, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        return format!("{}: expected {}, got {}", named(path), expectation(expected), as_json(got));
    }
    format!("{}: {message}", named(path))
}

/// serde's "expected one of `a`, `b`" (or "expected `a`", "there are no fields") as "a, b".
fn listed(known: &str) -> String {
    let names: Vec<&str> = known.split('`').skip(1).step_by(2).collect();
    if names.is_empty() { "no fields".to_owned() } else { names.join(", ") }
}

/// serde's name of what a field's type expects, as the other SDKs say it.
fn expectation(expected: &str) -> &str {
    match expected {
        "f64" | "f32" => "a number",
        "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64" | "usize" | "isize" => "an integer",
        "a boolean" => "true or false",
        other if other.starts_with("struct ") || other.starts_with("a map") => "a JSON object",
        other => other,
    }
}

/// serde's description of the value it got, as the JSON it came from: `string "x"` is `"x"`.
fn as_json(got: &str) -> String {
    let tick = |rest: &str| rest.trim_matches('`').to_owned();
    if let Some(rest) = got.strip_prefix("string ") {
        rest.to_owned()
    } else if let Some(rest) = got.strip_prefix("integer ").or_else(|| got.strip_prefix("floating point ")) {
        tick(rest)
    } else if let Some(rest) = got.strip_prefix("boolean ") {
        tick(rest)
    } else {
        match got {
            "null" | "unit value" => "null".to_owned(),
            "map" => "an object".to_owned(),
            "sequence" => "a list".to_owned(),
            other => other.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_config;

    #[derive(serde::Deserialize, Debug)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Config {
        samples: u64,
        #[serde(default)]
        min_delta: f64,
        #[serde(default)]
        mode: Option<Mode>,
        #[serde(default)]
        condition: Option<Condition>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(rename_all = "kebab-case")]
    enum Mode {
        Fast,
        Slow,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Condition {
        threshold: f64,
    }

    fn error(config: &str) -> String {
        parse_config::<Config>(config).unwrap_err()
    }

    /// The words of the Python and JavaScript SDKs (templates' `perennial_policy.py` and
    /// `perennial-policy.js`), with no "line 1 column 17".
    #[test]
    fn a_refused_config_is_worded_as_in_the_other_languages() {
        assert_eq!(error("{}"), "samples: missing");
        assert_eq!(error(r#"{"samples": "x"}"#), r#"samples: expected an integer, got "x""#);
        assert_eq!(error(r#"{"samples": 1, "minDelta": true}"#), "minDelta: expected a number, got true");
        assert_eq!(
            error(r#"{"samples": 1, "sample": 2}"#),
            "sample: unknown field (this policy reads: samples, minDelta, mode, condition)"
        );
        assert_eq!(error(r#"{"samples": 1, "mode": "medium"}"#), r#"mode: "medium" is not one of fast, slow"#);
        assert_eq!(error(r#"{"samples": 1, "condition": {}}"#), "condition.threshold: missing");
        assert_eq!(
            error(r#"{"samples": 1, "condition": {"threshold": 1, "x": 0}}"#),
            "condition.x: unknown field (this policy reads: threshold)"
        );
        assert_eq!(
            error(r#"{"samples": 1, "condition": {"threshold": null}}"#),
            "condition.threshold: expected a number, got null"
        );
        assert!(error(r#"{"samples": 1"#).starts_with("config: not JSON ("), "{}", error(r#"{"samples": 1"#));
        assert_eq!(error("5"), "config: expected a JSON object, got 5");
        for config in ["{}", r#"{"samples": "x"}"#, r#"{"samples": 1, "sample": 2}"#] {
            assert!(!error(config).contains(" at line "), "{}", error(config));
        }
    }
}
