//! The HTTP/JSON API of a node (`--http-addr`, docs/http.md): the server
//! (listener, TLS with the node's certificate, connection handling,
//! shutdown) and the router assembly that hands each request to the
//! resource its path names. It decides nothing: every request goes
//! through the client library to this node's own client port, which
//! authenticates the caller (the HTTP caller's bearer token is passed
//! through, never the node's identity) and forwards to the leader by
//! following `NOT_LEADER` hints. It holds no state but a small cache of
//! client handles, one per token.
//!
//! The parts: [`errors`] (the JSON error bodies and the status mapping),
//! [`auth`] (the caller authenticated from the headers), [`codec`] (keys
//! from paths, values and results as JSON), [`body`] (the body read,
//! bounded in size, time and memory), [`limits`] (the port's bounds,
//! connections counted per peer address and in total) and one module per
//! resource — [`kv`] for `/v1/kv/{key}`, [`claims`] for
//! `/v1/claims/{key}`.
//!
//! **A request's way**, so that no one holds or fills the node before
//! being authenticated: the connection takes a place in [`limits`] (past
//! a bound it is answered 503 and closed at once); its headers must come
//! within [`HANDSHAKE_TIMEOUT`]; the path names a resource and a call; the
//! caller is authenticated from the headers (401 before anything of the
//! body is read); the call checks its other headers; the body is read
//! within the body deadline and the body buffer; only then does the
//! request take one of the [`REQUESTS_IN_FLIGHT_MAX`] permits (503 past
//! them) for its forwarded call.
//!
//! **Adding a resource** (as `claims.rs` was for `/v1/claims/{key}`):
//! write the module beside `kv.rs` with a `pub(super) const RESOURCE: Resource`
//! (its path prefix and a function from method and path to a `Call`), and
//! name it in the one line `resources!(kv, claims);` below, which declares
//! the module and adds it to `RESOURCES`. Routing by prefix,
//! authentication, the bounded body read, the in-flight bound and the
//! error bodies then apply to it as to every other resource.

pub mod auth;
pub mod body;
pub mod codec;
pub mod errors;
pub mod limits;

/// Declares each resource's module and lists its `RESOURCE` in
/// `RESOURCES`, in the order paths are matched (prefixes must not nest).
macro_rules! resources {
    ($($module:ident),+ $(,)?) => {
        $(pub mod $module;)+
        /// The API's resources. A request goes to the one whose prefix is
        /// its path or a parent of it; no match is 404.
        const RESOURCES: &[Resource] = &[$($module::RESOURCE),+];
    };
}

// Adding a resource is one line: its module's name here.
resources!(kv, claims);

pub use body::BODY_BYTES_MAX;
pub use errors::{HttpError, client_error};
pub use kv::IDEMPOTENCY_KEY_BYTES_MAX;
pub use limits::HttpLimits;

use crate::network::auth::SharedPolicy;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use oncekv_client::credentials::{BearerToken, Credentials};
use oncekv_client::{Client, ClientConfig};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Forwarded calls in flight at once, each with its request's body read;
/// one more is refused at once with 503 (`UNAVAILABLE`).
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Deadline of one request's forwarded call, retries included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one attempt of a forwarded call.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Client handles kept (one per distinct bearer token, and one for none).
const CLIENTS_MAX: usize = 64;
/// How long a connection may take to send its TLS handshake or a request's
/// headers (an idle keep-alive connection, its next request's).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refused connection is given to take its answer (its TLS
/// handshake included).
const REFUSAL_TIME: Duration = Duration::from_secs(2);
/// Refused connections being answered at once; past it a refused
/// connection is closed unanswered.
const REFUSALS_MAX: usize = 64;
/// Most bytes read (and dropped) from a refused connection after its
/// answer, so that closing it does not reset it before the client has
/// read the answer.
const REFUSAL_DRAIN_BYTES: usize = 64 << 10;
/// How often, at most, refused connections are logged.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long in-flight requests may finish after the node is told to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

// ---- resources -------------------------------------------------------------------

/// One resource of the API: the paths at and under `prefix`.
pub(crate) struct Resource {
    /// `/v1/kv`: the resource answers `/v1/kv` and `/v1/kv/...`.
    pub prefix: &'static str,
    /// The call `method` on `path` (the raw, still percent-encoded path of
    /// the URI, without its query) asks for, or why there is none (404,
    /// 405, a malformed key, ...). Sees neither headers nor body.
    pub call: Route,
}

/// A resource's routing: see [`Resource::call`].
pub(crate) type Route = fn(&Method, &str) -> Result<Box<dyn Call>, HttpError>;

/// One request to a resource, understood from its method and path.
pub(crate) trait Call: Send {
    /// Checks the headers the call needs besides `Authorization` (say
    /// `Idempotency-Key`), before any of the body is read.
    fn check_headers(&mut self, headers: &HeaderMap) -> Result<(), HttpError>;
    /// Whether the call needs the request body (read whole and bounded,
    /// see [`body`], before [`Call::run`]); otherwise `run` gets it empty.
    fn reads_body(&self) -> bool;
    /// Runs the call through `client`, the caller's handle.
    fn run(
        self: Box<Self>,
        client: Client,
        body: Bytes,
    ) -> BoxFuture<'static, Result<Answer, HttpError>>;
}

/// The resource answering `path`.
fn resource(path: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|resource| {
        path.strip_prefix(resource.prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// A successful answer: a status, a JSON body, and for a keyed write or a
/// claim whether it was replayed.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Json,
    /// `Idempotent-Replayed`: `None` (no header) without a key.
    pub replayed: Option<bool>,
}

impl Answer {
    pub(crate) fn new(status: StatusCode, body: Json) -> Answer {
        Answer {
            status,
            body,
            replayed: None,
        }
    }
}

/// The header telling a replay (`true`) from a first execution (`false`).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.status, errors::json_body(&self.body)).into_response();
        if let Some(replayed) = self.replayed {
            response.headers_mut().insert(
                IDEMPOTENT_REPLAYED,
                HeaderValue::from_static(if replayed { "true" } else { "false" }),
            );
        }
        response
    }
}

// ---- the service -------------------------------------------------------------------

/// Client handles to this node's client port, one per bearer token.
struct Gateway {
    /// This node's announced client address (its certificate names it).
    endpoint: String,
    /// The cluster CA when the node has TLS; never the node's own identity.
    credentials: Credentials,
    clients: Mutex<BTreeMap<Option<[u8; 32]>, Client>>,
}

impl Gateway {
    /// The client showing `token` (the caller's), made on first use. The
    /// cache is bounded: when full, an arbitrary entry makes room (its
    /// connections close; no session is lost, the calls have none).
    fn client(&self, token: Option<&str>) -> Result<Client, HttpError> {
        let slot = token.map(|token| *blake3::hash(token.as_bytes()).as_bytes());
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&slot) {
            return Ok(client.clone());
        }
        let bearer = match token {
            Some(token) => BearerToken::new(token).map_err(|error| {
                HttpError::new(
                    StatusCode::UNAUTHORIZED,
                    "UNAUTHENTICATED",
                    error.to_string(),
                )
            })?,
            None => BearerToken::default(),
        };
        let config = ClientConfig {
            call_timeout: CALL_TIMEOUT,
            attempt_timeout: ATTEMPT_TIMEOUT,
            credentials: self.credentials.with_token(bearer),
            ..ClientConfig::default()
        };
        let client = Client::with_config([self.endpoint.clone()], config);
        if clients.len() >= CLIENTS_MAX {
            clients.pop_first();
        }
        clients.insert(slot, client.clone());
        Ok(client)
    }
}

/// The HTTP API's shared state.
#[derive(Clone)]
pub struct HttpApi {
    gateway: Arc<Gateway>,
    /// The client port's authentication policy, live (reloaded on SIGHUP).
    policy: SharedPolicy,
    permits: Arc<Semaphore>,
    bodies: body::BodyBuffer,
    body_timeout: Duration,
}

impl HttpApi {
    /// An API forwarding to the client port announced as `endpoint`,
    /// trusting the CA at `ca` when the node has TLS, authenticating
    /// callers by that port's `policy` before reading their bodies, within
    /// the body bounds of `limits`.
    pub fn new(
        endpoint: String,
        ca: Option<&Path>,
        policy: SharedPolicy,
        limits: &HttpLimits,
    ) -> Result<HttpApi, HttpSetupError> {
        let credentials = match ca {
            None => Credentials::none(),
            Some(ca) => Credentials::load(&oncekv_client::credentials::CredentialPaths {
                ca: Some(ca.to_path_buf()),
                ..Default::default()
            })
            .map_err(|error| HttpSetupError(error.to_string()))?,
        };
        Ok(HttpApi {
            gateway: Arc::new(Gateway {
                endpoint,
                credentials,
                clients: Mutex::new(BTreeMap::new()),
            }),
            policy,
            permits: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
            bodies: body::BodyBuffer::new(limits.body_buffer_bytes_max),
            body_timeout: limits.body_timeout,
        })
    }

    /// The axum router: every path goes to one handler, which routes itself
    /// (keys are raw percent-decoded bytes, which axum's extractors are not).
    pub fn router(self) -> axum::Router {
        axum::Router::new().fallback(handle).with_state(self)
    }

    async fn serve(&self, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
        match self.answer(&method, &uri, &headers, body).await {
            Ok(answer) => answer.into_response(),
            Err(error) => error.into_response(),
        }
    }

    async fn answer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Answer, HttpError> {
        let path = uri.path();
        let resource = resource(path).ok_or_else(|| HttpError::no_such_endpoint(path))?;
        let mut call = (resource.call)(method, path)?;
        // From the headers alone: nothing of an unauthenticated request's
        // body is read, and it takes no permit.
        let token = auth::authenticate(&self.policy.current(), headers)?;
        call.check_headers(headers)?;
        let body = if call.reads_body() {
            body::read_body(headers, body, &self.bodies, self.body_timeout).await?
        } else {
            body::HeldBody::empty()
        };
        // Only a request whose body has arrived takes a permit: a slow body
        // holds none.
        let Ok(_permit) = self.permits.clone().try_acquire_owned() else {
            return Err(HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!("overloaded: {REQUESTS_IN_FLIGHT_MAX} HTTP requests in flight"),
            ));
        };
        let client = self.gateway.client(token.as_deref())?;
        // The body's bytes stay counted in the buffer until the call ends.
        call.run(client, body.bytes.clone()).await
    }
}

async fn handle(
    State(api): State<HttpApi>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    api.serve(method, uri, headers, body).await
}

// ---- serving -------------------------------------------------------------------------

/// Why the HTTP API cannot start.
#[derive(Debug, thiserror::Error)]
#[error("HTTP API: {0}")]
pub struct HttpSetupError(String);

/// Serves `router` on `listener` (HTTP/1.1, over TLS when `tls` is given:
/// the node's certificate and key, no client certificates — callers
/// authenticate with bearer tokens; each connection with the settings
/// current when it arrives), at most `limits`' connections in total and
/// per peer address, until `shutdown` completes; then in-flight requests
/// get `SHUTDOWN_GRACE` to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<super::tls::NodeTls>,
    router: axum::Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let open = limits::Connections::new(limits);
    let mut refusals = Refusals::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors, say: pause rather than spin.
                        tracing::warn!(%error, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let acceptor = tls.as_ref().map(|tls| {
                    tokio_rustls::TlsAcceptor::from(tls.server_config(super::tls::Port::Http))
                });
                let slot = match open.open(peer.ip()) {
                    Ok(slot) => slot,
                    Err(refusal) => {
                        refusals.refuse(stream, acceptor, &refusal, &mut connections);
                        continue;
                    }
                };
                let service = hyper_util::service::TowerToHyperService::new(router.clone());
                let stopped = stopped.clone();
                connections.spawn(async move {
                    // The connection's place is given back when it ends.
                    let _slot = slot;
                    match acceptor {
                        None => connection(hyper_util::rt::TokioIo::new(stream), service, stopped).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => {
                                    connection(hyper_util::rt::TokioIo::new(tls), service, stopped).await
                                }
                                Ok(Err(error)) => tracing::debug!(%error, "HTTPS handshake failed"),
                                Err(_) => tracing::debug!("HTTPS handshake timed out"),
                            }
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let _ = stop.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    // Dropping the set aborts whatever is left.
}

/// Connections refused for a bound: answered, few at a time, and logged
/// now and then.
struct Refusals {
    answering: Arc<Semaphore>,
    /// Refused since the last log line, and when that was.
    unlogged: u64,
    logged: Option<tokio::time::Instant>,
}

impl Refusals {
    fn new() -> Refusals {
        Refusals {
            answering: Arc::new(Semaphore::new(REFUSALS_MAX)),
            unlogged: 0,
            logged: None,
        }
    }

    /// Answers `stream` with `refusal` (after the TLS handshake when
    /// `acceptor` is given) and closes it, within `REFUSAL_TIME`, as a
    /// task of `tasks`; closes it unanswered when `REFUSALS_MAX` refusals
    /// are being answered already.
    fn refuse(
        &mut self,
        stream: tokio::net::TcpStream,
        acceptor: Option<tokio_rustls::TlsAcceptor>,
        refusal: &HttpError,
        tasks: &mut tokio::task::JoinSet<()>,
    ) {
        self.unlogged += 1;
        let now = tokio::time::Instant::now();
        if self
            .logged
            .is_none_or(|logged| now.duration_since(logged) >= REFUSAL_LOG_EVERY)
        {
            tracing::warn!(
                refused = self.unlogged,
                reason = %refusal.message,
                "HTTP connections refused"
            );
            self.unlogged = 0;
            self.logged = Some(now);
        }
        let Ok(answering) = self.answering.clone().try_acquire_owned() else {
            return;
        };
        let answer = refusal.http1_response();
        tasks.spawn(async move {
            let _answering = answering;
            let _ = tokio::time::timeout(REFUSAL_TIME, async move {
                match acceptor {
                    None => answer_and_close(stream, &answer).await,
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(stream).await {
                            answer_and_close(tls, &answer).await;
                        }
                    }
                }
            })
            .await;
        });
    }
}

/// Writes `answer`, closes the writing side, and reads (dropping it) what
/// the client still sends — its request — until it closes too, so that
/// the close does not reset the connection before the answer is read.
async fn answer_and_close<I>(mut io: I, answer: &[u8])
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if io.write_all(answer).await.is_err() || io.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < REFUSAL_DRAIN_BYTES {
        match io.read(&mut sink).await {
            Ok(0) | Err(_) => break,
            Ok(read) => drained += read,
        }
    }
}

/// Serves one connection; on shutdown lets its request in flight finish.
async fn connection<I, S>(io: I, service: S, mut stopped: tokio::sync::watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Send,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "HTTP connection ended");
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

/// Request headers from (name, value) pairs, for the unit tests.
#[cfg(test)]
pub(crate) fn test_headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            axum::http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path goes to the resource whose prefix is the path or a parent of
    /// it; a name that only starts the same (`/v1/kvx`) is no resource.
    #[test]
    fn paths_find_their_resource() {
        for path in ["/v1/kv", "/v1/kv/", "/v1/kv/a", "/v1/kv/a/incr"] {
            assert_eq!(
                resource(path).map(|found| found.prefix),
                Some("/v1/kv"),
                "{path}"
            );
        }
        for path in ["/v1/claims", "/v1/claims/a", "/v1/claims/a/complete"] {
            assert_eq!(
                resource(path).map(|found| found.prefix),
                Some("/v1/claims"),
                "{path}"
            );
        }
        for path in [
            "/",
            "/v1",
            "/v1/kvx",
            "/v1/kvx/a",
            "/v2/kv/a",
            "/v1/claimsx",
        ] {
            assert!(resource(path).is_none(), "{path}");
        }
    }
}
