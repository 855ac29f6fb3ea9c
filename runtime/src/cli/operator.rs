//! `perennial operator`: being written.

#[derive(clap::Args)]
pub struct OperatorArgs {}

pub async fn run(_args: OperatorArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
