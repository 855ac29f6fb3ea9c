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
/// assert!(err.starts_with("condition.threshold: invalid type"), "{err}");
/// ```
pub fn parse_config<T: DeserializeOwned>(config: &str) -> Result<T, String> {
    let text = if config.trim().is_empty() { "{}" } else { config };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." || path.is_empty() { format!("config: {inner}") } else { format!("{path}: {inner}") }
    })?;
    de.end().map_err(|err| format!("config: {err}"))?;
    Ok(parsed)
}
