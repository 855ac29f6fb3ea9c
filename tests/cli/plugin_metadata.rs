//! A policy's metadata inside its component (`perennial:metadata`): `plugin annotate` writes it
//! (or refuses, writing nothing), `plugin inspect` shows it, `plugin check --config` validates a
//! config against its schema before the policy runs. Real components built from `plugins/`.

use std::path::{Path, PathBuf};
use std::process::Output;

use perennial_policy::builtin;

use crate::plugin::{assert_user_error, perennial};

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A copy of the built test trigger (which carries no metadata) in `dir`.
fn bare_trigger(dir: &Path) -> PathBuf {
    let built = builtin::built_plugin_path("hostile-trigger").expect("the hostile trigger is built");
    let copy = dir.join("hostile.wasm");
    std::fs::copy(built, &copy).unwrap();
    copy
}

/// The hostile trigger's config, as a schema: `behaviour` required, one of a few.
const METADATA: &str = r#"# the hostile trigger, described
name: hostile
description: Misbehaves on request.
kind: trigger
version: 1.2.3
author: Tests
configSchema:
  type: object
  required: [behaviour]
  additionalProperties: false
  properties:
    behaviour:
      type: string
      enum: [ok, loop, loop-in-configure]
      description: What to do.
    onlyWhen:
      type: integer
      minimum: 0
      default: 7
"#;

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn annotate_then_inspect_shows_the_metadata_as_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = bare_trigger(dir.path());
    let metadata = dir.path().join("metadata.yaml");
    std::fs::write(&metadata, METADATA).unwrap();
    let before = std::fs::read(&wasm).unwrap();

    // Without metadata: said plainly, not an error.
    let bare = stdout(&perennial(&["plugin", "inspect", path(&wasm)]));
    assert!(bare.contains("world:       trigger-policy (perennial:policy@"), "{bare}");
    assert!(bare.contains("metadata:    none (`perennial plugin annotate` writes it)"), "{bare}");
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&perennial(&["plugin", "inspect", path(&wasm), "--output", "json"]))).unwrap();
    assert_eq!(json["metadata"], serde_json::Value::Null, "{json}");
    assert_eq!(json["world"], "trigger-policy", "{json}");

    // Annotated to another file: the original is untouched, the new digest printed.
    let out = dir.path().join("annotated.wasm");
    let said =
        stdout(&perennial(&["plugin", "annotate", path(&wasm), "--metadata", path(&metadata), "-o", path(&out)]));
    assert_eq!(std::fs::read(&wasm).unwrap(), before);
    let annotated = std::fs::read(&out).unwrap();
    let digest = perennial_policy::artifact::sha256_hex(&annotated);
    assert!(said.contains(&format!(": hostile 1.2.3 (trigger); sha256 {digest} (was ")), "{said}");
    assert!(annotated.starts_with(&before), "the section is appended after the component's own");

    let text = stdout(&perennial(&["plugin", "inspect", path(&out)]));
    for line in [
        &format!("sha256:      {digest}\n"),
        &format!("size:        {} bytes\n", annotated.len()),
        "name:        hostile\n",
        "kind:        trigger\n",
        "version:     1.2.3\n",
        "author:      Tests\n",
        "description: Misbehaves on request.\n",
        "config:\n  behaviour (string; required; one of ok, loop, loop-in-configure)\n      What to do.\n",
        "  onlyWhen (integer; default 7; at least 0)\n",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&perennial(&["plugin", "inspect", path(&out), "--output", "json"]))).unwrap();
    assert_eq!(json["sha256"], digest.as_str());
    assert_eq!(json["size"], annotated.len());
    assert_eq!(json["metadata"]["name"], "hostile");
    assert_eq!(json["metadata"]["version"], "1.2.3");
    assert_eq!(json["metadata"]["configSchema"]["required"], serde_json::json!(["behaviour"]));

    // Annotated again, in place: one section, the new one (not two); the file's mode kept.
    std::fs::write(&metadata, METADATA.replace("version: 1.2.3", "version: 2.0.0")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
    stdout(&perennial(&["plugin", "annotate", path(&out), "--metadata", path(&metadata)]));
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o644);
    let again = std::fs::read(&out).unwrap();
    assert_eq!(again.len(), annotated.len(), "the section was replaced, not added");
    let text = stdout(&perennial(&["plugin", "inspect", path(&out)]));
    assert!(text.contains("version:     2.0.0\n"), "{text}");
    // The annotated component still loads and runs.
    let call = perennial(&["plugin", "call", path(&out), "--config", r#"{"behaviour": "ok"}"#, "--trigger", "{}"]);
    stdout(&call);
}

#[test]
fn annotate_refuses_bad_metadata_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = bare_trigger(dir.path());
    let before = std::fs::read(&wasm).unwrap();
    let metadata = dir.path().join("metadata.yaml");
    let refused = |text: &str, expected: &str| {
        std::fs::write(&metadata, text).unwrap();
        let out = perennial(&["plugin", "annotate", path(&wasm), "--metadata", path(&metadata)]);
        assert_user_error(&out, expected);
        assert_eq!(std::fs::read(&wasm).unwrap(), before, "nothing written for {expected:?}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
    };
    let file = path(&metadata).to_owned();
    refused("name: [unclosed", &format!("{file}: not valid metadata: "));
    refused(&METADATA.replace("kind: trigger", "kind: splitter"), &format!("{file}: kind: \"splitter\", but "));
    refused(&METADATA.replace("kind: trigger", "kind: trigger-policy"), "kind: \"trigger-policy\" is not one of");
    refused(
        &METADATA.replace("type: integer", "type: integr"),
        "configSchema: not a valid JSON Schema: at /properties/onlyWhen/type",
    );
    refused(
        &METADATA.replace("configSchema:\n  type: object", "configSchema:\n  type: array"),
        "configSchema: type: a config is a JSON object",
    );
    refused(
        "name: a\nkind: trigger\nversion: '1'\nconfigSchema: [1, 2]\n",
        "configSchema: a JSON Schema object is needed, got a list",
    );
    refused(&format!("{METADATA}colour: blue\n"), "unknown field `colour`");
    refused("kind: trigger\nversion: '1'\n", "missing field `name`");
    refused(&format!("{METADATA}description2: '{}'\n", "x".repeat(70_000)), "larger than 64 KiB");

    // The component itself: cut short, or not a component at all.
    std::fs::write(&metadata, METADATA).unwrap();
    let cut = dir.path().join("cut.wasm");
    std::fs::write(&cut, &before[..before.len() / 2]).unwrap();
    let out = perennial(&["plugin", "annotate", path(&cut), "--metadata", path(&metadata)]);
    assert_user_error(&out, "cut.wasm: cut short: the section at byte ");
    assert_eq!(std::fs::read(&cut).unwrap(), &before[..before.len() / 2]);
    std::fs::write(&cut, "not wasm").unwrap();
    let out = perennial(&["plugin", "annotate", path(&cut), "--metadata", path(&metadata)]);
    assert_user_error(&out, "cut.wasm: not a WebAssembly component");
}

#[test]
fn check_names_what_a_config_lacks_before_the_policy_runs() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = bare_trigger(dir.path());
    let metadata = dir.path().join("metadata.yaml");
    std::fs::write(&metadata, METADATA).unwrap();
    stdout(&perennial(&["plugin", "annotate", path(&wasm), "--metadata", path(&metadata)]));
    let wasm = path(&wasm);

    // `behaviour` missing: the schema says so, in the SDKs' words. The policy is not run.
    let out = perennial(&["plugin", "check", wasm, "--config", r#"{"onlyWhen": 3}"#]);
    assert_user_error(
        &out,
        "the config does not match the policy's config schema (the policy was not run): behaviour: missing",
    );
    // Wrong values, each named; a loop in configure is never reached.
    let out =
        perennial(&["plugin", "check", wasm, "--config", r#"{"behaviour": "spin", "onlyWhen": "x", "colour": 1}"#]);
    assert_user_error(&out, r#"behaviour: "spin" is not one of ok, loop, loop-in-configure"#);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(r#"onlyWhen: expected an integer, got "x""#), "{stderr}");
    assert!(stderr.contains("colour: unknown field (this policy reads: behaviour, onlyWhen)"), "{stderr}");
    let out = perennial(&["plugin", "check", wasm, "--config", "[1]"]);
    assert_user_error(&out, "config: expected a JSON object, got [1]");
    let out = perennial(&["plugin", "check", wasm, "--config", "{not json"]);
    assert_user_error(&out, "--config is not valid JSON");

    // `plugin call` and `plugin test` check it too, in the same words, before the policy runs.
    let lacking = r#"{"onlyWhen": 3}"#;
    let not_run = "the config does not match the policy's config schema (the policy was not run): behaviour: missing";
    assert_user_error(&perennial(&["plugin", "call", wasm, "--config", lacking, "--trigger", "{}"]), not_run);
    let fixture = dir.path().join("fixture.json");
    std::fs::write(&fixture, "[]").unwrap();
    assert_user_error(&perennial(&["plugin", "test", wasm, "--config", lacking, path(&fixture)]), not_run);

    // A config the schema accepts goes on to the policy's configure.
    let ok = stdout(&perennial(&["plugin", "check", wasm, "--config", r#"{"behaviour": "ok"}"#]));
    assert!(ok.contains("metadata: hostile 1.2.3 (trigger)\n") && ok.contains("config:   accepted\n"), "{ok}");
    // Without metadata, check is as it was: the policy's configure says what is wrong.
    let bare_dir = tempfile::tempdir().unwrap();
    let bare = bare_trigger(bare_dir.path());
    let out = perennial(&["plugin", "check", path(&bare), "--config", r#"{"behaviour": "spin"}"#]);
    assert_user_error(&out, "configure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("behaviour: ") && !stderr.contains("config schema"), "{stderr}");
}

#[test]
fn the_builtins_carry_their_metadata() {
    for (name, kind, field) in [
        ("threshold-trigger", "trigger", "  condition.operator (string; required; one of >, >=,"),
        ("ratio-split", "splitter", "  trainProb (number; required; at least 0; at most 1)"),
        ("metric-select", "selector", "  better (string; default \"higher\"; one of higher, lower)"),
        ("first-select", "selector", "config:\n  (no fields)\n"),
    ] {
        let text = stdout(&perennial(&["plugin", "inspect", &format!("builtin:{name}")]));
        assert!(text.contains(&format!("name:        {name}\n")), "{text}");
        assert!(text.contains(&format!("kind:        {kind}\n")), "{text}");
        assert!(text.contains(field), "{field:?} in:\n{text}");
    }
    // The schema before the policy: the trigger's condition lacks its threshold.
    let out =
        perennial(&["plugin", "check", "builtin:threshold-trigger", "--config", r#"{"condition": {"operator": ">"}}"#]);
    assert_user_error(&out, "condition.threshold: missing");
    let ok = stdout(&perennial(&[
        "plugin",
        "check",
        "builtin:ratio-split",
        "--config",
        r#"{"trainProb": 0.8, "mode": "hash"}"#,
    ]));
    assert!(ok.contains("metadata: ratio-split 0.1.0 (splitter)") && ok.contains("config:   accepted"), "{ok}");
}

#[test]
fn a_component_with_two_metadata_sections_or_a_huge_one_is_refused_by_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = bare_trigger(dir.path());
    let bare = std::fs::read(&wasm).unwrap();
    let section = |payload: &[u8]| {
        let name = b"perennial:metadata";
        let mut body = vec![name.len() as u8];
        body.extend_from_slice(name);
        body.extend_from_slice(payload);
        let mut out = vec![0u8];
        let mut size = body.len();
        loop {
            let byte = (size & 0x7f) as u8;
            size >>= 7;
            out.push(if size == 0 { byte } else { byte | 0x80 });
            if size == 0 {
                break;
            }
        }
        out.extend_from_slice(&body);
        out
    };
    let one = br#"{"name": "a", "kind": "trigger", "version": "1"}"#;
    let twice = [bare.clone(), section(one), section(one)].concat();
    std::fs::write(&wasm, &twice).unwrap();
    let out = perennial(&["plugin", "inspect", path(&wasm)]);
    assert_user_error(&out, "it has 2 perennial:metadata sections (at bytes ");
    // Annotating it leaves one.
    let metadata = dir.path().join("m.yaml");
    std::fs::write(&metadata, METADATA).unwrap();
    stdout(&perennial(&["plugin", "annotate", path(&wasm), "--metadata", path(&metadata)]));
    assert!(stdout(&perennial(&["plugin", "inspect", path(&wasm)])).contains("name:        hostile\n"));

    let huge = [bare.clone(), section(&vec![b' '; 70_000])].concat();
    std::fs::write(&wasm, &huge).unwrap();
    assert_user_error(&perennial(&["plugin", "inspect", path(&wasm)]), "more than the 64 KiB read");
    let wrong_kind = [bare.clone(), section(br#"{"name": "a", "kind": "selector", "version": "1"}"#)].concat();
    std::fs::write(&wasm, &wrong_kind).unwrap();
    assert_user_error(
        &perennial(&["plugin", "inspect", path(&wasm)]),
        "its metadata says it is a selector, but it is a trigger",
    );
    let not_json = [bare, section(b"{nope")].concat();
    std::fs::write(&wasm, &not_json).unwrap();
    assert_user_error(&perennial(&["plugin", "inspect", path(&wasm)]), "is not valid metadata: ");
}
