//! `perennial fetch`: placeholder, being written.

#[derive(clap::Args)]
pub struct FetchArgs {}

pub async fn run(_args: FetchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
