//! The process's stop: Ctrl-C, or SIGTERM (systemd, the kubelet). Beside `open_files`: what
//! each long-running subcommand of the one binary needs of its process.

/// Resolves at Ctrl-C or SIGTERM (SIGTERM listened for from the first poll on).
pub async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = async {
            match term.as_mut() {
                Some(term) => { term.recv().await; }
                None => std::future::pending().await,
            }
        } => {}
    }
}
