//! `deploy/helm/perennial/`, the Helm chart: its `crds/` are deploy/crds/'s CRDs, file for file
//! and byte for byte. They are copies, not links: Helm's CLI follows a link out of the chart
//! (with a warning on every command), but other chart loaders (Flux's, a packaged chart's
//! consumers) refuse one. What the chart renders, and that it installs, is checked against the
//! kustomize installs in tests/cluster/helm.rs.

use std::collections::BTreeMap;
use std::path::Path;

use crate::repo_path;

/// The CRD files of a folder (`*.yaml`: deploy/crds/'s `Kustomization` is no CRD), by name.
fn crd_files(folder: &Path) -> BTreeMap<String, Vec<u8>> {
    let entries = std::fs::read_dir(folder).unwrap_or_else(|err| panic!("read {}: {err}", folder.display()));
    let mut files = BTreeMap::new();
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
        if name.ends_with(".yaml") {
            assert!(!path.is_symlink(), "{}: a copy, not a link (see this file's doc)", path.display());
            let bytes = std::fs::read(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
            files.insert(name, bytes);
        }
    }
    files
}

#[test]
fn the_charts_crds_are_deploy_crds() {
    let deploy = crd_files(&repo_path("deploy/crds"));
    let chart = crd_files(&repo_path("deploy/helm/perennial/crds"));
    let names = |files: &BTreeMap<String, Vec<u8>>| files.keys().cloned().collect::<Vec<_>>();
    let fix = "PERENNIAL_UPDATE_CRDS=1 cargo test -p perennial-api --lib crd writes both (or cp deploy/crds/*.yaml deploy/helm/perennial/crds/)";
    assert_eq!(names(&chart), names(&deploy), "the chart's crds/ has other files than deploy/crds/: {fix}");
    assert!(!deploy.is_empty(), "no CRD in deploy/crds/");
    for (name, bytes) in &deploy {
        assert!(chart[name] == *bytes, "deploy/helm/perennial/crds/{name} is not deploy/crds/{name}: {fix}");
    }
}
