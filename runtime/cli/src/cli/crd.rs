//! `perennial crd`: prints the CustomResourceDefinitions (LifelongLearningJob, Dataset), generated
//! from the types, as one multi-document YAML: `perennial crd | kubectl apply -f -`. The same
//! files are checked in under `deploy/crds/`.

use std::io::Write;

pub fn run() -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(perennial_api::crds_yaml().as_bytes()).and_then(|()| stdout.flush()) {
        // `perennial crd | head` is not an error.
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => Ok(result?),
    }
}
