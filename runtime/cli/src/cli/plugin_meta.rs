//! A policy's metadata, inside its component: what the policy is, its kind, its version and a
//! JSON Schema of its config, in a top-level custom section named [`SECTION`] holding JSON.
//!
//! `perennial plugin annotate` writes it (from a YAML or JSON file, checked first), `plugin
//! inspect` shows it, and `plugin check --config` validates a config against its schema before
//! the policy runs. The section is language-neutral: any toolchain's component can carry it.
//! Annotating changes the component's bytes, so its sha256: pin the annotated one.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasm_encoder::{ComponentSection, CustomSection, Encode};
use wasmparser::{BinaryReader, ComponentExportSectionReader};

/// The custom section's name.
pub const SECTION: &str = "perennial:metadata";

/// The largest metadata file `annotate` reads, and the largest section `inspect` and `check`
/// read back: a description and a config schema, not a document.
pub const MAX_METADATA_BYTES: usize = 64 << 10;

/// The component binary's preamble: `\0asm`, then version 0x0d and layer 1 (a component).
const COMPONENT_PREAMBLE: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
/// A core module's preamble (not a component).
const MODULE_PREAMBLE: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
/// The component export section's id.
const COMPONENT_EXPORT_SECTION: u8 = 11;

/// The metadata, as the section holds it (JSON) and as the file for `annotate` says it (YAML
/// or JSON, the same fields).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    /// The policy's name.
    pub name: String,
    /// What it decides and how, in a sentence or two.
    #[serde(default)]
    pub description: String,
    /// trigger, splitter or selector: the world the component exports.
    pub kind: String,
    /// The policy's own version (not the WIT package's).
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// A JSON Schema (an object) of the config `configure` accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_schema: Option<Value>,
}

const KINDS: [&str; 3] = ["trigger", "splitter", "selector"];

/// What a component's top-level sections say: its exports and its metadata, if any.
#[derive(Debug)]
pub struct Scan {
    /// The names the component exports (e.g. `perennial:policy/trigger@0.1.0`).
    pub exports: Vec<String>,
    /// The metadata sections: (start of the section, its header included; its end; payload).
    sections: Vec<(usize, usize, Vec<u8>)>,
}

impl Scan {
    /// The component's metadata: none, or the one section read and checked (two are an error:
    /// `annotate` writes one).
    pub fn metadata(&self) -> Result<Option<Metadata>, String> {
        match self.sections.as_slice() {
            [] => Ok(None),
            [(start, _, payload)] => {
                if payload.len() > MAX_METADATA_BYTES {
                    return Err(format!(
                        "its {SECTION} section (at byte {start}) is {} bytes, more than the {} KiB read",
                        payload.len(),
                        MAX_METADATA_BYTES >> 10
                    ));
                }
                let metadata: Metadata = serde_json::from_slice(payload)
                    .map_err(|err| format!("its {SECTION} section (at byte {start}) is not valid metadata: {err}"))?;
                check_fields(&metadata).map_err(|err| format!("its {SECTION} section: {err}"))?;
                Ok(Some(metadata))
            }
            [(first, ..), (second, ..), ..] => Err(format!(
                "it has {} {SECTION} sections (at bytes {first} and {second}): `perennial plugin annotate` \
                 writes one in their place",
                self.sections.len()
            )),
        }
    }
}

/// Reads a component's top-level sections (not the modules and components nested in it): a
/// file cut short, a core module or anything else is an error that says which.
pub fn scan(bytes: &[u8]) -> Result<Scan, String> {
    if bytes.len() < 8 || bytes[..4] != COMPONENT_PREAMBLE[..4] {
        return Err("not a WebAssembly component (no \\0asm header)".into());
    }
    if bytes[..8] == MODULE_PREAMBLE {
        return Err("a core WebAssembly module, not a component: make a component of it (wasm-tools \
                    component new, or a toolchain that targets wasm32-wasip2)"
            .into());
    }
    if bytes[..8] != COMPONENT_PREAMBLE {
        return Err(format!("not a component of the version this host reads (header {:02x?})", &bytes[4..8]));
    }
    let mut scan = Scan { exports: Vec::new(), sections: Vec::new() };
    let mut reader = BinaryReader::new(bytes, 0);
    reader.read_bytes(8).map_err(|err| err.to_string())?;
    while !reader.eof() {
        let start = reader.original_position();
        let cut = |what: &str| format!("cut short: the section at byte {start} {what} ({} bytes in all)", bytes.len());
        let id = reader.read_u8().map_err(|_| cut("has no id"))?;
        let size = reader.read_var_u32().map_err(|_| cut("has no size"))? as usize;
        let body_start = reader.original_position();
        let body = reader.read_bytes(size).map_err(|_| cut(&format!("says {size} bytes, past the end")))?;
        let end = body_start + size;
        match id {
            0 => {
                let mut custom = BinaryReader::new(body, body_start);
                let name = custom.read_string().map_err(|_| cut("has no valid name"))?;
                if name == SECTION {
                    let payload = custom.read_bytes(custom.bytes_remaining()).expect("the rest of the section");
                    scan.sections.push((start, end, payload.to_vec()));
                }
            }
            COMPONENT_EXPORT_SECTION => {
                let exports = ComponentExportSectionReader::new(BinaryReader::new(body, body_start))
                    .map_err(|err| format!("its export section (at byte {start}): {err}"))?;
                for export in exports {
                    let export = export.map_err(|err| format!("its export section (at byte {start}): {err}"))?;
                    scan.exports.push(export.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(scan)
}

/// The policy kind (trigger, splitter, selector) a component's exports make it, if any.
pub fn kind_of(exports: &[String]) -> Option<&'static str> {
    super::plugin::world_of(exports).map(|(world, _)| world.trim_end_matches("-policy")).and_then(|kind| {
        // world_of's worlds are exactly these three.
        KINDS.iter().copied().find(|known| *known == kind)
    })
}

/// Reads and checks a metadata file (YAML or JSON): at most [`MAX_METADATA_BYTES`], every field
/// known, the kind one of the three, the config schema an object and a valid JSON Schema.
pub fn read_file(path: &Path) -> Result<Metadata, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|err| format!("cannot read it: {err}"))?;
    let mut text = String::new();
    file.take(MAX_METADATA_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|err| format!("cannot read it as UTF-8 text: {err}"))?;
    if text.len() > MAX_METADATA_BYTES {
        return Err(format!(
            "larger than {} KiB: metadata is a description and a config schema",
            MAX_METADATA_BYTES >> 10
        ));
    }
    let metadata: Metadata = serde_yaml_ng::from_str(&text).map_err(|err| format!("not valid metadata: {err}"))?;
    check_fields(&metadata)?;
    // The section holds it as JSON, which `inspect` reads up to the same bound.
    let size = serde_json::to_vec(&metadata).map_err(|err| format!("not valid metadata: {err}"))?.len();
    if size > MAX_METADATA_BYTES {
        return Err(format!(
            "{size} bytes as JSON, more than the {} KiB a component's metadata may be",
            MAX_METADATA_BYTES >> 10
        ));
    }
    Ok(metadata)
}

/// The checks of a metadata's fields, whoever wrote it.
fn check_fields(metadata: &Metadata) -> Result<(), String> {
    let line = |field: &str, value: &str, max: usize| {
        if value.trim().is_empty() {
            Err(format!("{field}: missing (empty)"))
        } else if value.len() > max || value.chars().any(char::is_control) {
            Err(format!("{field}: one line of at most {max} bytes, without control characters"))
        } else {
            Ok(())
        }
    };
    line("name", &metadata.name, 128)?;
    // Shown on terminals: no escape sequences (lines and tabs are text).
    if metadata.description.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Err("description: control characters (other than new lines and tabs) are refused".into());
    }
    line("version", &metadata.version, 64)?;
    if let Some(author) = &metadata.author {
        line("author", author, 256)?;
    }
    if !KINDS.contains(&metadata.kind.as_str()) {
        return Err(format!("kind: {:?} is not one of {}", metadata.kind, KINDS.join(", ")));
    }
    if let Some(schema) = &metadata.config_schema {
        check_schema(schema).map_err(|err| format!("configSchema: {err}"))?;
    }
    Ok(())
}

/// A config schema: a JSON Schema object (draft 2020-12 unless its `$schema` says another) for
/// a JSON object, valid against its meta-schema, with no references outside itself.
fn check_schema(schema: &Value) -> Result<(), String> {
    let Value::Object(fields) = schema else {
        return Err(format!("a JSON Schema object is needed, got {}", json_kind(schema)));
    };
    match fields.get("type") {
        None => {}
        Some(Value::String(ty)) if ty == "object" => {}
        Some(other) => return Err(format!("type: a config is a JSON object, so \"object\", got {other}")),
    }
    jsonschema::meta::validate(schema).map_err(|err| {
        let at = err.instance_path().to_string();
        let at = if at.is_empty() { String::new() } else { format!("at {at}: ") };
        format!("not a valid JSON Schema: {at}{err}")
    })?;
    jsonschema::validator_for(schema).map_err(|err| format!("not a usable JSON Schema: {err}"))?;
    Ok(())
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(true) => "true",
        Value::Bool(false) => "false",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a JSON object",
    }
}

/// `bytes` with `metadata` as its one metadata section: any it had are taken out, the new one
/// appended (a custom section may stand anywhere among the top-level sections).
pub fn annotated(bytes: &[u8], scan: &Scan, metadata: &Metadata) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 1024);
    let mut kept_from = 0;
    for (start, end, _) in &scan.sections {
        out.extend_from_slice(&bytes[kept_from..*start]);
        kept_from = *end;
    }
    out.extend_from_slice(&bytes[kept_from..]);
    let payload = serde_json::to_vec(metadata).expect("metadata is JSON");
    let section = CustomSection { name: SECTION.into(), data: payload.into() };
    out.push(ComponentSection::id(&section));
    section.encode(&mut out);
    out
}

/// Checks `config` against the schema; each failure in the words the SDKs use for a config
/// they refuse (`condition.threshold: missing`, `mode: "x" is not one of a, b`, `samples:
/// expected an integer, got "x"`, `x: unknown field (this policy reads: a, b)`).
pub fn config_errors(schema: &Value, config: &Value) -> Vec<String> {
    let validator = match jsonschema::validator_for(schema) {
        Ok(validator) => validator,
        Err(err) => return vec![format!("config: the policy's schema is not usable: {err}")],
    };
    let mut errors: Vec<String> = validator.iter_errors(config).map(|err| worded(schema, &err)).collect();
    errors.dedup();
    errors
}

fn worded(schema: &Value, err: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::{TypeKind, ValidationErrorKind as E};
    let path: Vec<String> = err.instance_path().iter().map(|segment| segment.to_string()).collect();
    let path = path.join(".");
    let at = |field: &str| if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") };
    let named = if path.is_empty() { "config".to_owned() } else { path.clone() };
    let got = || serde_json::to_string(err.instance().as_ref()).unwrap_or_default();
    match err.kind() {
        E::Required { property } => format!("{}: missing", at(property.as_str().unwrap_or_default())),
        E::AdditionalProperties { unexpected } | E::UnevaluatedProperties { unexpected } => {
            let known = known_fields(schema, err);
            let field = unexpected.first().map(String::as_str).unwrap_or_default();
            format!("{}: unknown field (this policy reads: {known})", at(field))
        }
        E::Enum { options } => {
            let options: Vec<String> = options
                .as_array()
                .map(|list| list.iter().map(|o| o.as_str().map_or_else(|| o.to_string(), str::to_owned)).collect())
                .unwrap_or_default();
            format!("{named}: {} is not one of {}", got(), options.join(", "))
        }
        E::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(ty) => expectation(&ty.to_string()).to_owned(),
                TypeKind::Multiple(types) => {
                    types.iter().map(|ty| expectation(&ty.to_string()).to_owned()).collect::<Vec<_>>().join(" or ")
                }
            };
            format!("{named}: expected {expected}, got {}", got())
        }
        E::Minimum { limit } => format!("{named}: {} is below the minimum {limit}", got()),
        E::ExclusiveMinimum { limit } => format!("{named}: {} must be above {limit}", got()),
        E::Maximum { limit } => format!("{named}: {} is above the maximum {limit}", got()),
        E::ExclusiveMaximum { limit } => format!("{named}: {} must be below {limit}", got()),
        _ => format!("{named}: {err}"),
    }
}

/// The properties the schema names for the object at the error's place (for "this policy
/// reads: a, b"), found by the schema path of the failed keyword.
fn known_fields(schema: &Value, err: &jsonschema::ValidationError<'_>) -> String {
    let pointer = err.schema_path().as_str();
    let object_pointer = pointer.rsplit_once('/').map_or("", |(parent, _)| parent);
    let names: Vec<&str> = schema
        .pointer(object_pointer)
        .and_then(|object| object.get("properties"))
        .and_then(Value::as_object)
        .map(|properties| properties.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() { "no fields".to_owned() } else { names.join(", ") }
}

/// JSON Schema's type names as the SDKs say them.
fn expectation(ty: &str) -> &str {
    match ty {
        "integer" => "an integer",
        "number" => "a number",
        "string" => "a string",
        "boolean" => "true or false",
        "object" => "a JSON object",
        "array" => "a list",
        "null" => "null",
        other => other,
    }
}

/// The config schema's fields as lines for a reader: `path (type, required; default X; one of
/// a, b)` then its description, nested objects' fields under their parent's path.
pub fn describe_schema(schema: &Value) -> String {
    let mut out = String::new();
    fields(schema, "", &mut out, 0);
    if out.is_empty() {
        out.push_str("  (no fields)\n");
    }
    // The schema's names and descriptions are the component's text, shown on a terminal: no
    // escape sequences.
    out.chars().map(|c| if c.is_control() && c != '\n' { '?' } else { c }).collect()
}

fn fields(schema: &Value, prefix: &str, out: &mut String, depth: usize) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return };
    if depth > 8 {
        return;
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, field) in properties {
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        let mut traits = Vec::new();
        match field.get("type") {
            Some(Value::String(ty)) => traits.push(ty.clone()),
            Some(Value::Array(types)) => {
                traits.push(types.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" or "))
            }
            _ => {}
        }
        if required.contains(&name.as_str()) {
            traits.push("required".into());
        }
        if let Some(default) = field.get("default") {
            traits.push(format!("default {default}"));
        }
        for (keyword, said) in [("minimum", "at least"), ("exclusiveMinimum", "above"), ("maximum", "at most")] {
            if let Some(limit) = field.get(keyword) {
                traits.push(format!("{said} {limit}"));
            }
        }
        if let Some(options) = field.get("enum").and_then(Value::as_array) {
            let options: Vec<String> =
                options.iter().map(|o| o.as_str().map_or_else(|| o.to_string(), str::to_owned)).collect();
            traits.push(format!("one of {}", options.join(", ")));
        }
        let _ = writeln!(out, "  {path} ({})", traits.join("; "));
        if let Some(description) = field.get("description").and_then(Value::as_str) {
            let _ = writeln!(out, "      {description}");
        }
        fields(field, &path, out, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metadata(schema: Value) -> Metadata {
        Metadata {
            name: "p".into(),
            description: String::new(),
            kind: "trigger".into(),
            version: "1".into(),
            author: None,
            config_schema: Some(schema),
        }
    }

    const EMPTY_COMPONENT: [u8; 8] = COMPONENT_PREAMBLE;

    /// A component's text reaches a terminal: no escape sequences, by `annotate` or `inspect`.
    #[test]
    fn control_characters_are_refused_or_not_shown() {
        let mut coloured = metadata(json!({"type": "object"}));
        coloured.name = "p\u{1b}[31m".into();
        assert!(check_fields(&coloured).unwrap_err().starts_with("name:"));
        let mut described = metadata(json!({"type": "object"}));
        described.description = "two\nlines\tand a tab".into();
        assert!(check_fields(&described).is_ok());
        described.description = "bell\u{7}".into();
        assert!(check_fields(&described).unwrap_err().starts_with("description:"));
        let shown =
            describe_schema(&json!({"properties": {"a\u{1b}]0;x": {"type": "string", "description": "\u{1b}[2J"}}}));
        assert!(!shown.contains('\u{1b}'), "{shown}");
    }

    #[test]
    fn annotating_replaces_the_section_and_keeps_the_rest() {
        let scan0 = scan(&EMPTY_COMPONENT).unwrap();
        assert!(scan0.metadata().unwrap().is_none());
        let once = annotated(&EMPTY_COMPONENT, &scan0, &metadata(json!({"type": "object"})));
        let scan1 = scan(&once).unwrap();
        assert_eq!(scan1.metadata().unwrap().unwrap().name, "p");
        let mut other = metadata(json!({}));
        other.name = "q".into();
        let twice = annotated(&once, &scan1, &other);
        let scan2 = scan(&twice).unwrap();
        assert_eq!(scan2.sections.len(), 1);
        assert_eq!(scan2.metadata().unwrap().unwrap().name, "q");
        // Two sections (written by hand) are refused, naming both places.
        let mut doubled = twice.clone();
        doubled.extend_from_slice(&twice[8..]);
        let err = scan(&doubled).unwrap().metadata().unwrap_err();
        assert!(err.contains("2 perennial:metadata sections (at bytes 8 and"), "{err}");
        // Cut short: the section's size runs past the end.
        let err = scan(&twice[..twice.len() - 3]).unwrap_err();
        assert!(err.starts_with("cut short: the section at byte 8 says"), "{err}");
        assert!(scan(&MODULE_PREAMBLE).unwrap_err().contains("core WebAssembly module"));
        assert!(scan(b"hello world").unwrap_err().contains("no \\0asm header"));
    }

    #[test]
    fn config_errors_use_the_sdks_words() {
        let schema = json!({
            "type": "object", "required": ["condition"], "additionalProperties": false,
            "properties": {
                "mode": {"type": "string", "enum": ["ratio", "hash"]},
                "samples": {"type": "integer", "minimum": 1},
                "condition": {"type": "object", "required": ["threshold"],
                              "properties": {"threshold": {"type": "number"}}}
            }
        });
        assert_eq!(config_errors(&schema, &json!({"condition": {}})), ["condition.threshold: missing"]);
        assert_eq!(config_errors(&schema, &json!({})), ["condition: missing"]);
        let errors =
            config_errors(&schema, &json!({"condition": {"threshold": 1}, "mode": "x", "samples": "3", "smaples": 1}));
        assert!(errors.contains(&r#"mode: "x" is not one of ratio, hash"#.to_owned()), "{errors:?}");
        assert!(errors.contains(&r#"samples: expected an integer, got "3""#.to_owned()), "{errors:?}");
        assert!(
            errors.contains(&"smaples: unknown field (this policy reads: condition, mode, samples)".to_owned()),
            "{errors:?}"
        );
        assert_eq!(
            config_errors(&schema, &json!({"condition": {"threshold": 1}, "samples": 0})),
            ["samples: 0 is below the minimum 1"]
        );
        assert_eq!(config_errors(&schema, &json!([1])), ["config: expected a JSON object, got [1]"]);
        assert!(config_errors(&schema, &json!({"condition": {"threshold": 1.5}})).is_empty());
    }

    #[test]
    fn a_schema_must_be_an_object_schema_and_valid() {
        let err = check_fields(&metadata(json!(["type"]))).unwrap_err();
        assert_eq!(err, "configSchema: a JSON Schema object is needed, got a list");
        let err = check_fields(&metadata(json!({"type": "array"}))).unwrap_err();
        assert!(err.starts_with("configSchema: type: a config is a JSON object"), "{err}");
        let err =
            check_fields(&metadata(json!({"type": "object", "properties": {"a": {"type": "numbr"}}}))).unwrap_err();
        assert!(err.starts_with("configSchema: not a valid JSON Schema: at /properties/a/type"), "{err}");
        let mut bad_kind = metadata(json!({}));
        bad_kind.kind = "trigger-policy".into();
        assert_eq!(
            check_fields(&bad_kind).unwrap_err(),
            r#"kind: "trigger-policy" is not one of trigger, splitter, selector"#
        );
    }

    #[test]
    fn a_metadata_file_is_bounded_as_read_and_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.yaml");
        let head = "name: p\nkind: trigger\nversion: '1'\nconfigSchema:\n  type: object\n  examples: [";
        // Under 64 KiB as YAML, twice that as JSON (each `a,` is `"a",`).
        std::fs::write(&file, format!("{head}{}a]\n", "a,".repeat(20_000))).unwrap();
        let err = read_file(&file).unwrap_err();
        assert!(err.ends_with("bytes as JSON, more than the 64 KiB a component's metadata may be"), "{err}");
        std::fs::write(&file, format!("{head}{}a]\n", "a,".repeat(40_000))).unwrap();
        assert!(read_file(&file).unwrap_err().starts_with("larger than 64 KiB"));
        std::fs::write(&file, format!("{head}a]\n")).unwrap();
        assert_eq!(read_file(&file).unwrap().name, "p");
    }

    #[test]
    fn fields_are_described_with_their_traits() {
        let text = describe_schema(&json!({
            "required": ["condition"],
            "properties": {"condition": {"type": "object", "description": "When.", "required": ["operator"],
                "properties": {"operator": {"type": "string", "enum": [">", "<"]},
                               "metric": {"type": "string", "default": "n"}}}}
        }));
        assert_eq!(
            text,
            "  condition (object; required)\n      When.\n  condition.metric (string; default \"n\")\n  \
             condition.operator (string; required; one of >, <)\n"
        );
    }
}
