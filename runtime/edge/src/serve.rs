//! The worker API's HTTP server, bounded ([`Limits::DEFAULT`]): at most 256 connections open at
//! once (more wait in the kernel's backlog, so idle or slow clients cannot take the process's
//! file descriptors from ingestion), one request per connection (Sedna's library opens one per
//! report), the request's head within 3 s (a worker sends it as it connects: idle connections
//! hold a slot that long at most) and the whole exchange within 30 s (a partial body is not held
//! open). Bodies are capped by the router (`worker_api::MAX_REPORT_BYTES`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How much the server gives its clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time for a client to send its request line and headers.
    pub head_timeout: Duration,
    /// Time for a whole connection: request, body and answer.
    pub connection_timeout: Duration,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_connections: 256,
        head_timeout: Duration::from_secs(3),
        connection_timeout: Duration::from_secs(30),
    };
}

/// Serves `router` on `listener` within [`Limits::DEFAULT`] until `shutdown` completes.
pub async fn serve(listener: TcpListener, router: axum::Router, shutdown: impl Future<Output = ()>) {
    serve_with(listener, router, Limits::DEFAULT, shutdown).await
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes; connections then in
/// flight finish (each within `limits.connection_timeout`).
pub async fn serve_with(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let Limits { max_connections, head_timeout, connection_timeout } = limits;
    let permits = Arc::new(Semaphore::new(max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(head_timeout).keep_alive(false);
    let builder = Arc::new(builder.http1_only());
    tokio::pin!(shutdown);
    let mut said_full = false;
    loop {
        // Wait for a free slot before accepting: the backlog holds the rest.
        let permit = tokio::select! {
            () = &mut shutdown => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        if permits.available_permits() == 0 && !said_full {
            tracing::warn!(connections = max_connections, "the worker API is at its connection limit");
            said_full = true;
        } else if permits.available_permits() > max_connections / 2 {
            said_full = false;
        }
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, or a connection reset before it was taken: wait a
                    // little rather than spin.
                    tracing::debug!("worker API accept: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (builder, service) = (builder.clone(), TowerToHyperService::new(router.clone()));
        tokio::spawn(async move {
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(connection_timeout, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::debug!(%peer, "worker API connection: {err}"),
                Err(_) => tracing::debug!(%peer, "worker API connection closed after {connection_timeout:?}"),
            }
            drop(permit);
        });
    }
}
