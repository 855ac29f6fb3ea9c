//! The getting-started page's commands, run as written: each `sh` block of
//! docs/src/getting-started.md marked `<!-- run: getting-started -->`, in order, by `sh`, in a
//! fresh folder holding the checkout's example, as a reader runs them from the repository's root.
//! `cargo run --release -- ARGS` there runs this build's `perennial ARGS`: a `cargo` first on the
//! PATH does that and refuses anything else (the release build is the reader's, not the test's).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::embedded::{dies_with_its_test, wait_exit};

const MARKER: &str = "<!-- run: getting-started -->";

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The marked `sh` blocks of the page, in order.
fn blocks() -> Vec<String> {
    let page = std::fs::read_to_string(repo().join("docs/src/getting-started.md")).expect("the page");
    let mut blocks = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if line.trim() != MARKER {
            continue;
        }
        assert_eq!(lines.next().map(str::trim), Some("```sh"), "a `sh` block follows {MARKER}");
        let block: Vec<&str> = lines.by_ref().take_while(|line| line.trim() != "```").collect();
        blocks.push(block.join("\n") + "\n");
    }
    blocks
}

#[test]
fn the_getting_started_commands_run_as_written() {
    let blocks = blocks();
    assert_eq!(blocks.len(), 4, "the page's runnable blocks: run, status, decisions, two jobs");
    // The README's run command is the page's first.
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    assert!(readme.contains(blocks[0].trim()), "the README's run command is not the page's: {}", blocks[0]);

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("examples")).expect("examples");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(repo().join("examples/thermal-comfort"))
        .arg(dir.path().join("examples"))
        .status()
        .expect("cp");
    assert!(copied.success(), "copying the example");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let cargo = bin.join("cargo");
    std::fs::write(
        &cargo,
        "#!/bin/sh\nif [ \"$1\" = run ] && [ \"$2\" = --release ] && [ \"$3\" = -- ]; then\n    shift 3\n    \
         exec \"$PERENNIAL_UNDER_TEST\" \"$@\"\nfi\necho \"this test's cargo runs only 'cargo run --release -- ...', not: $*\" >&2\nexit 97\n",
    )
    .expect("the cargo shim");
    let mut permissions = std::fs::metadata(&cargo).expect("shim").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&cargo, permissions).expect("chmod");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

    let mut outputs = Vec::new();
    for block in &blocks {
        let mut shell = dies_with_its_test(&mut Command::new("sh"))
            .args(["-e", "-c", block])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("PERENNIAL_UNDER_TEST", env!("CARGO_BIN_EXE_perennial"))
            .env("PERENNIAL_CACHE_DIR", dir.path().join("cache"))
            .env_remove("PERENNIAL_STATE_DIR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        let out = wait_exit(&mut shell, Duration::from_secs(300));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{block}failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        outputs.push(stdout);
    }
    // What the page says each shows.
    assert!(outputs[0].contains("default/thermal-comfort round 3: deployed"), "{}", outputs[0]);
    assert!(outputs[1].contains("default/thermal-comfort") && outputs[1].contains("DEPLOYED"), "{}", outputs[1]);
    assert!(outputs[2].starts_with("ID ") && outputs[2].contains("builtin:threshold-trigger"), "{}", outputs[2]);
    assert!(outputs[3].contains("metric-select"), "the second job's rows: {}", outputs[3]);
}
