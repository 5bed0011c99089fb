//! Serving: the proxy's listener (HTTP/1.1 connections, over TLS with
//! `--tls-cert`, each request handed to [`Proxy::handle`] with the caller
//! its connection's verified certificate names under `--callers-ca`), the metrics
//! listener (`GET /metrics`), and shutdown — stop accepting, let requests
//! in flight finish within a grace period. It owns connections and
//! nothing of a request's meaning.

use crate::Proxy;
use crate::body::{ProxyBody, full};
use crate::listener_tls::{ListenerTls, certified_caller};
use crate::metrics::{CONTENT_TYPE, Metrics};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// How long a connection may take to send a request's headers (an idle
/// keep-alive connection: its next request's); a TLS connection has as
/// long again for its handshake.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long requests in flight may finish after the proxy is told to stop
/// (a keyed request is then recorded or released, not cut).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `proxy` on `listener` (HTTPS with `tls`) until `shutdown`
/// completes; then requests in flight get [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ListenerTls>>,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) {
    let keyed = Arc::clone(&proxy);
    let service = move |request: Request<Incoming>| {
        let proxy = Arc::clone(&proxy);
        async move { Ok::<_, Infallible>(proxy.handle(request).await) }
    };
    // Keyed requests record or release in tasks of their own, which may
    // outlive their connection (`--reply-before-record`): waited for too.
    serve_with(listener, tls, service, shutdown, async move {
        keyed.keyed_tasks_done().await;
    })
    .await;
}

/// Serves `metrics` on `listener` (`GET /metrics`, anything else 404)
/// until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let service = move |request: Request<Incoming>| {
        let metrics = Arc::clone(&metrics);
        async move { Ok::<_, Infallible>(metrics_answer(&metrics, &request)) }
    };
    serve_with(listener, None, service, shutdown, async {}).await;
}

fn metrics_answer(metrics: &Metrics, request: &Request<Incoming>) -> Response<ProxyBody> {
    if request.method() == Method::GET && request.uri().path() == "/metrics" {
        let mut response = Response::new(full(metrics.encode()));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        response
    } else {
        let mut response = Response::new(full("not found; the metrics are at GET /metrics\n"));
        *response.status_mut() = StatusCode::NOT_FOUND;
        response
    }
}

/// Serves until `shutdown`, then waits up to [`SHUTDOWN_GRACE`] for the
/// connections to end and then for `drained`.
async fn serve_with<S, F>(
    listener: TcpListener,
    tls: Option<Arc<ListenerTls>>,
    service: S,
    shutdown: impl Future<Output = ()>,
    drained: impl Future<Output = ()>,
) where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static,
{
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(error) => {
                        // Out of descriptors, say: pause rather than spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                let stopped = stopped.clone();
                let tls = tls.as_ref().map(|tls| tls.config());
                connections.spawn(async move {
                    let Some(config) = tls else {
                        return serve_connection(stream, service, stopped).await;
                    };
                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                    match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            // A certificate the handshake verified names
                            // the caller of each request on the connection.
                            let caller = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(<[_]>::first)
                                .map(|der| certified_caller(der));
                            let service = move |mut request: Request<Incoming>| {
                                if let Some(caller) = &caller {
                                    request.extensions_mut().insert(caller.clone());
                                }
                                service(request)
                            };
                            serve_connection(stream, service, stopped).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let _ = stop.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
        drained.await;
    })
    .await;
}

/// Serves one connection's requests until it ends, or — once `stopped`
/// says so — until its request in flight is answered.
async fn serve_connection<IO, S, F>(
    io: IO,
    service: S,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Fn(Request<Incoming>) -> F + Send + 'static,
    F: Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(io), service_fn(service));
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended");
            }
        }
        () = async {
            // The guard `wait_for` returns is not `Send`: drop it here.
            let _ = stopped.wait_for(|stop| *stop).await.map(drop);
        } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
