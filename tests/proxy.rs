//! `oncekv proxy` (crates/oncekv-proxy, docs/proxy.md) as it runs: real
//! `oncekv proxy` processes in front of a small upstream HTTP server in
//! this test (it counts every call it gets, and sleeps, fails or drops
//! the connection when a request asks), claiming in real 3-node clusters.
//! It proves: twenty concurrent identical keyed requests reach the
//! upstream once and all get the same bytes (nineteen replays); another
//! body under the key is 422; a 5xx is released and the retry reaches the
//! upstream again (attempt 2, a larger fence); requests without a key pass
//! through; `--require-key`, `--key-scope`, the size limits (413, 431) and
//! a cluster out of reach (503, fail closed: nothing forwarded); a proxy
//! SIGKILLed mid-request leaves a lease, after which a second proxy
//! forwards with attempt 2; one paused past its lease answers 409 FENCED
//! and the key keeps the new holder's answer; two proxies share the
//! cluster (in progress behind one is 409 behind the other, after
//! `--wait-ms`); an answer too large to record reaches its first caller
//! and is then 502; an https upstream is reached only with a certificate
//! it can trust, for its name, and with the proxy's own certificate when
//! it asks for one; and a leader killed while the upstream works still
//! leaves exactly one upstream call. Two clusters, in two tests
//! that run side by side.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::Value as Json;
use support::cluster::Cluster;
use support::http::{Http, Response as HttpResponse};
use tokio::time::Instant;

const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a condition the test waits for may take.
const CONDITION_TIMEOUT: Duration = Duration::from_secs(20);

// ---- the upstream ------------------------------------------------------------------

/// One call the upstream received.
#[derive(Clone, Debug)]
struct Call {
    path: String,
    key: Option<String>,
    fence: Option<u64>,
    attempt: Option<u64>,
    body: Vec<u8>,
    /// Whether a `Proxy-Authorization` header reached the upstream.
    proxy_authorization: bool,
}

/// A small upstream HTTP service: every request is an effect, counted
/// (numbered from 1) and answered `201` with a JSON body naming its
/// number, fence and attempt. A request may ask for `x-test-sleep-ms: N`
/// (answer after N ms), `x-test-status: CODE` (answer CODE instead) or
/// `x-test-crash: 1` (close the connection without answering) or
/// `x-test-body-bytes: N` (N more bytes in the body). Dropping
/// it stops it.
struct Upstream {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Upstream {
    async fn start() -> Upstream {
        Upstream::serve(None).await
    }

    /// The same service over TLS: `cert`/`key` (PEM files) as its
    /// identity and, with `client_ca`, only clients with a certificate of
    /// that CA let in.
    async fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: Option<&std::path::Path>,
    ) -> Upstream {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls::server::WebPkiClientVerifier;
        use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};
        let provider = Arc::new(crypto::ring::default_provider());
        let chain = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let config = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for certificate in CertificateDer::pem_file_iter(ca).unwrap() {
                    roots.add(certificate.unwrap()).unwrap();
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        }
        .with_single_cert(chain, key)
        .unwrap();
        Upstream::serve(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let counted = Arc::clone(&calls);
        let server = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let calls = Arc::clone(&counted);
                let service =
                    hyper::service::service_fn(move |request| answer(Arc::clone(&calls), request));
                let tls = tls.clone();
                connections.spawn(async move {
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                        Some(tls) => {
                            // A failed handshake is a connection never
                            // served: no call counted.
                            if let Ok(stream) = tls.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            calls,
            server,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its URL over TLS.
    fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The calls made with idempotency key `key`.
    fn calls_with(&self, key: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|call| call.key.as_deref() == Some(key))
            .collect()
    }

    /// Waits until `count` calls with `key` have arrived.
    async fn wait_for_calls(&self, key: &str, count: usize) {
        let deadline = Instant::now() + CONDITION_TIMEOUT;
        while self.calls_with(key).len() < count {
            assert!(
                Instant::now() < deadline,
                "the upstream got {:?} for {key}, waited for {count}",
                self.calls_with(key)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Rewrites the callers file with `text`, sends `proxy` SIGHUP and waits
/// until it says (`oncekv_proxy_callers_reloads_total{result}`) that a
/// reload ended with `result`.
async fn reload_callers(proxy: &ProxyProcess, file: &std::path::Path, text: &str, result: &str) {
    std::fs::write(file, text).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_until("the callers file's reload", || async {
        let text = proxy.metrics().await;
        support::metrics::counter(
            &text,
            "oncekv_proxy_callers_reloads_total",
            &[("result", result)],
        ) >= 1.0
    })
    .await;
}

/// Waits (polling, within [`CONDITION_TIMEOUT`]) until `condition` holds.
async fn wait_until<F, Fut>(what: &str, condition: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + CONDITION_TIMEOUT;
    while !condition().await {
        assert!(Instant::now() < deadline, "waited in vain until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn header<'a>(request: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

async fn answer(
    calls: Arc<Mutex<Vec<Call>>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let number = |name: &str| header(&request, name).and_then(|v| v.parse::<u64>().ok());
    let (fence, attempt) = (number("idempotency-fence"), number("idempotency-attempt"));
    let sleep_ms = number("x-test-sleep-ms");
    let status = number("x-test-status");
    let padding = number("x-test-body-bytes").unwrap_or(0) as usize;
    let crash = header(&request, "x-test-crash").is_some();
    let key = header(&request, "idempotency-key").map(str::to_owned);
    let proxy_authorization = header(&request, "proxy-authorization").is_some();
    let path = request.uri().to_string();
    let body = request.into_body().collect().await?.to_bytes().to_vec();
    let effect = {
        let mut calls = calls.lock().unwrap();
        calls.push(Call {
            path: path.clone(),
            key,
            fence,
            attempt,
            body,
            proxy_authorization,
        });
        calls.len()
    };
    if let Some(ms) = sleep_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if crash {
        // An error from the service closes the connection unanswered.
        return Err("crash on demand".into());
    }
    let body = serde_json::json!({
        "effect": effect, "path": path, "fence": fence, "attempt": attempt,
        "padding": "x".repeat(padding),
    })
    .to_string();
    let response = Response::builder()
        .status(status.map_or(StatusCode::CREATED, |code| {
            StatusCode::from_u16(code as u16).unwrap()
        }))
        .header("content-type", "application/json")
        .header("x-effect", effect.to_string())
        .body(Full::new(Bytes::from(body)))?;
    Ok(response)
}

// ---- the proxy -----------------------------------------------------------------------

/// A running `oncekv proxy`; dropping it SIGKILLs and reaps it.
struct ProxyProcess {
    child: Child,
    addr: String,
    metrics: Option<String>,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ProxyProcess {
    /// Starts `oncekv --endpoints ENDPOINTS proxy --listen 127.0.0.1:0
    /// --upstream UPSTREAM ARGS...` and waits for the address it prints.
    async fn start(endpoints: &[String], upstream: &str, args: &[&str]) -> ProxyProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .arg("--endpoints")
            .arg(endpoints.join(","))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .arg("--upstream")
            .arg(upstream)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start oncekv proxy");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut process = ProxyProcess {
            child,
            addr: String::new(),
            metrics: None,
        };
        // Its first lines say where it listens.
        let lines = tokio::task::spawn_blocking(move || {
            BufReader::new(stdout)
                .lines()
                .take(2)
                .map_while(Result::ok)
                .collect::<Vec<String>>()
        });
        let lines = tokio::time::timeout(CONDITION_TIMEOUT, lines)
            .await
            .expect("the proxy said where it listens in time")
            .unwrap();
        for line in lines {
            if let Some(addr) = line.strip_prefix("listening on ") {
                process.addr = addr.to_owned();
            } else if let Some(addr) = line.strip_prefix("metrics on ") {
                process.metrics = Some(addr.to_owned());
            }
        }
        assert!(!process.addr.is_empty(), "the proxy printed no address");
        process
    }

    fn http(&self) -> Http {
        Http::plain(&self.addr)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its metrics' text.
    async fn metrics(&self) -> String {
        let addr = self.metrics.as_deref().expect("a metrics address");
        let response = Http::plain(addr)
            .request("GET", "/metrics", &[], b"")
            .await
            .unwrap();
        String::from_utf8(response.body).unwrap()
    }
}

/// `POST path` with `headers` and `body` through `http`; the response.
async fn post(http: &Http, path: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
    http.request("POST", path, headers, body.as_bytes())
        .await
        .unwrap_or_else(|error| panic!("POST {path}: {error}"))
}

fn json(response: &HttpResponse) -> Json {
    response.json()
}

/// `POST /orders` with Idempotency-Key `key` through `proxy`, once per
/// value of header `name` in `values` (in order): each answered 201; the
/// bodies.
async fn created_bodies(
    proxy: &ProxyProcess,
    key: &str,
    name: &str,
    values: &[&str],
) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    for value in values {
        let answer = post(
            &proxy.http(),
            "/orders",
            &[("Idempotency-Key", key), (name, value)],
            "x",
        )
        .await;
        assert_eq!(answer.status, 201, "{answer:?}");
        bodies.push(answer.body);
    }
    bodies
}

/// A problem answer: `status`, `application/problem+json`, `reason`.
fn assert_problem(response: &HttpResponse, status: u16, reason: &str) {
    let body = response.json();
    assert_eq!(response.status, status, "{body}");
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json"),
        "{body}"
    );
    assert_eq!(body["reason"], reason, "{body}");
    assert_eq!(body["status"], status, "{body}");
}

// ---- the tests -----------------------------------------------------------------------

/// The stack of the thread that runs [`forwards_each_keyed_request_once`]:
/// its parts' futures nest deep, and in a debug build their poll frames
/// came within a quarter of the test thread's default 2 MiB.
const DEEP_TEST_STACK_BYTES: usize = 16 << 20;

#[test]
fn proxy_forwards_each_keyed_request_once() {
    let run = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(forwards_each_keyed_request_once());
    };
    let test = std::thread::Builder::new()
        .name("proxy_forwards_each_keyed_request_once".into())
        .stack_size(DEEP_TEST_STACK_BYTES)
        .spawn(run)
        .expect("a thread");
    if let Err(panic) = test.join() {
        std::panic::resume_unwind(panic);
    }
}

async fn forwards_each_keyed_request_once() {
    let cluster = Cluster::start("proxy").await;
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.client_addrs();
    let upstream = Upstream::start().await;
    let proxy = ProxyProcess::start(
        &endpoints,
        &upstream.url(),
        &["--lease-ms", "2000", "--wait-ms", "15000"],
    )
    .await;
    let http = proxy.http();

    // Twenty identical requests at once: the upstream sees one, and all
    // twenty get its bytes — one first answer, nineteen replays.
    let sends = (0..20).map(|_| {
        post(
            &http,
            "/orders?id=1",
            &[("Idempotency-Key", "k1"), ("x-test-sleep-ms", "300")],
            "{\"amount\":10}",
        )
    });
    let answers = futures::future::join_all(sends).await;
    assert_eq!(upstream.calls_with("k1").len(), 1, "{:?}", upstream.calls());
    let call = &upstream.calls_with("k1")[0];
    assert_eq!(call.path, "/orders?id=1");
    assert_eq!(call.body, b"{\"amount\":10}");
    assert_eq!(call.attempt, Some(1));
    let fence = call.fence.expect("the upstream saw Idempotency-Fence");
    for answer in &answers {
        assert_eq!(answer.status, 201, "{answer:?}");
        assert_eq!(answer.body, answers[0].body, "identical bodies");
        assert_eq!(answer.header("content-type"), Some("application/json"));
    }
    let replayed = |value: &str| {
        answers
            .iter()
            .filter(|answer| answer.header("idempotent-replayed") == Some(value))
            .count()
    };
    assert_eq!((replayed("false"), replayed("true")), (1, 19));
    assert_eq!(json(&answers[0])["fence"], fence);

    // Later: a replay, untouched upstream; another body under the key is
    // 422, forwarded nowhere.
    let again = post(
        &http,
        "/orders?id=1",
        &[("Idempotency-Key", "k1")],
        "{\"amount\":10}",
    )
    .await;
    assert_eq!((again.status, &again.body), (201, &answers[0].body));
    let other = post(
        &http,
        "/orders?id=1",
        &[("Idempotency-Key", "k1")],
        "{\"amount\":99}",
    )
    .await;
    assert_problem(&other, 422, "KEY_CONFLICT");
    let other_path = post(
        &http,
        "/orders?id=2",
        &[("Idempotency-Key", "k1")],
        "{\"amount\":10}",
    )
    .await;
    assert_problem(&other_path, 422, "KEY_CONFLICT");
    assert_eq!(upstream.calls_with("k1").len(), 1);

    // A 5xx is passed on and releases the key: the retry reaches the
    // upstream again, as attempt 2 with a larger fence, and is recorded.
    let failed = post(
        &http,
        "/pay",
        &[("Idempotency-Key", "k2"), ("x-test-status", "500")],
        "pay 5",
    )
    .await;
    assert_eq!(failed.status, 500, "{failed:?}");
    assert_eq!(upstream.calls_with("k2").len(), 1);
    let retried = post(&http, "/pay", &[("Idempotency-Key", "k2")], "pay 5").await;
    assert_eq!(
        retried.status,
        201,
        "{}",
        String::from_utf8_lossy(&retried.body)
    );
    assert_eq!(retried.header("idempotent-replayed"), Some("false"));
    let calls = upstream.calls_with("k2");
    assert_eq!(calls.len(), 2, "the retry reached the upstream");
    assert_eq!((calls[0].attempt, calls[1].attempt), (Some(1), Some(2)));
    assert!(calls[1].fence > calls[0].fence, "{calls:?}");
    let replay = post(&http, "/pay", &[("Idempotency-Key", "k2")], "pay 5").await;
    assert_eq!((replay.status, &replay.body), (201, &retried.body));
    assert_eq!(upstream.calls_with("k2").len(), 2);
    // So is a 429 (not final), and an upstream that drops the connection
    // (502, released).
    let busy = post(
        &http,
        "/pay",
        &[("Idempotency-Key", "k3"), ("x-test-status", "429")],
        "x",
    )
    .await;
    assert_eq!(busy.status, 429);
    let crashed = post(
        &http,
        "/pay",
        &[("Idempotency-Key", "k3"), ("x-test-crash", "1")],
        "x",
    )
    .await;
    assert_problem(&crashed, 502, "UPSTREAM_UNREACHABLE");
    let done = post(&http, "/pay", &[("Idempotency-Key", "k3")], "x").await;
    assert_eq!(done.status, 201);
    let calls = upstream.calls_with("k3");
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [Some(1), Some(2), Some(3)]
    );
    // A 4xx is final: recorded and replayed.
    let refused = post(
        &http,
        "/pay",
        &[("Idempotency-Key", "k4"), ("x-test-status", "402")],
        "x",
    )
    .await;
    let refused_again = post(&http, "/pay", &[("Idempotency-Key", "k4")], "x").await;
    assert_eq!((refused.status, refused_again.status), (402, 402));
    assert_eq!(refused.body, refused_again.body);
    assert_eq!(upstream.calls_with("k4").len(), 1);

    // Without a key, or on a method not guarded, requests pass through
    // (every time), and a caller's own fence header never reaches the
    // upstream.
    let before = upstream.calls().len();
    for _ in 0..2 {
        let plain = post(&http, "/plain", &[("Idempotency-Fence", "999")], "p").await;
        assert_eq!(plain.status, 201);
        assert_eq!(plain.header("idempotent-replayed"), None);
        let get = http
            .request("GET", "/plain", &[("Idempotency-Key", "k5")], b"")
            .await
            .unwrap();
        assert_eq!(get.status, 201);
    }
    let passed = upstream.calls();
    assert_eq!(passed.len(), before + 4);
    assert!(
        passed[before..].iter().all(|call| call.fence.is_none()),
        "{passed:?}"
    );

    // The metrics counted it.
    let metrics = proxy.metrics().await;
    for line in [
        "oncekv_proxy_requests_total{outcome=\"replayed\"} 22",
        "oncekv_proxy_requests_total{outcome=\"conflict\"} 2",
        "oncekv_proxy_requests_total{outcome=\"passed_through\"} 4",
        "oncekv_proxy_upstream_responses_total{class=\"5xx\"} 1",
        "oncekv_proxy_upstream_responses_total{class=\"unreachable\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    // (How many of the nineteen came while the first was at work, and
    // waited, depends on the machine's scheduling; some did.)
    let waits: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("oncekv_proxy_in_progress_waits_total "))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!((1..=19).contains(&waits), "waits {waits}:\n{metrics}");

    // --require-key and the limits, on a second proxy.
    let strict = ProxyProcess::start(
        &endpoints,
        &upstream.url(),
        &[
            "--require-key",
            "--wait-ms",
            "200",
            "--response-bytes-max",
            "1000",
            "--body-bytes-max",
            "16",
            "--header-bytes-max",
            "400",
        ],
    )
    .await;
    let before = upstream.calls().len();
    let missing = post(&strict.http(), "/orders", &[], "x").await;
    assert_problem(&missing, 400, "MISSING_IDEMPOTENCY_KEY");
    let large = post(
        &strict.http(),
        "/orders",
        &[("Idempotency-Key", "k6")],
        &"x".repeat(17),
    )
    .await;
    assert_problem(&large, 413, "BODY_TOO_LARGE");
    let long_header = "h".repeat(400);
    let headers = post(
        &strict.http(),
        "/orders",
        &[("Idempotency-Key", "k6"), ("x-long", long_header.as_str())],
        "x",
    )
    .await;
    assert_problem(&headers, 431, "HEADERS_TOO_LARGE");
    let malformed = post(
        &strict.http(),
        "/orders",
        &[("Idempotency-Key", "\"open")],
        "x",
    )
    .await;
    assert_problem(&malformed, 400, "INVALID_IDEMPOTENCY_KEY");
    assert_eq!(
        upstream.calls().len(),
        before,
        "nothing refused was forwarded"
    );
    let get = strict
        .http()
        .request("GET", "/plain", &[], b"")
        .await
        .unwrap();
    assert_eq!(get.status, 201, "GET is not guarded: it passes");

    // Two proxies share the cluster: a request at work behind one is in
    // progress behind the other, which waits 200 ms, then answers 409
    // with Retry-After; once it is done, the other replays it.
    let http = proxy.http();
    let slow = tokio::spawn(async move {
        post(
            &http,
            "/orders",
            &[("Idempotency-Key", "k9"), ("x-test-sleep-ms", "1000")],
            "x",
        )
        .await
    });
    upstream.wait_for_calls("k9", 1).await;
    let busy = post(&strict.http(), "/orders", &[("Idempotency-Key", "k9")], "x").await;
    assert_problem(&busy, 409, "IN_PROGRESS");
    assert_eq!(busy.header("retry-after"), Some("1"));
    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 201);
    let replay = post(&strict.http(), "/orders", &[("Idempotency-Key", "k9")], "x").await;
    assert_eq!((replay.status, &replay.body), (201, &slow.body));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(upstream.calls_with("k9").len(), 1);

    // An answer larger than --response-bytes-max reaches its first caller
    // whole; it is recorded without its body, so a retry is told so
    // (502), and nothing is forwarded again.
    let large = post(
        &strict.http(),
        "/orders",
        &[("Idempotency-Key", "k10"), ("x-test-body-bytes", "5000")],
        "x",
    )
    .await;
    assert_eq!(large.status, 201);
    assert!(large.body.len() > 5000);
    let retry = post(
        &strict.http(),
        "/orders",
        &[("Idempotency-Key", "k10")],
        "x",
    )
    .await;
    assert_problem(&retry, 502, "ANSWER_NOT_RECORDED");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(upstream.calls_with("k10").len(), 1);

    // --key-scope: a keyed request needs the tenant; two tenants' equal
    // keys are two requests; one tenant's retry is a replay.
    let scoped = ProxyProcess::start(
        &endpoints,
        &upstream.url(),
        &["--key-scope", "header:X-Tenant"],
    )
    .await;
    let no_tenant = post(&scoped.http(), "/orders", &[("Idempotency-Key", "k7")], "x").await;
    assert_problem(&no_tenant, 400, "MISSING_TENANT");
    let bodies = created_bodies(&scoped, "k7", "X-Tenant", &["acme", "globex", "acme"]).await;
    assert_eq!(upstream.calls_with("k7").len(), 2, "one call per tenant");
    assert_ne!(bodies[0], bodies[1]);
    assert_eq!(bodies[0], bodies[2], "the tenant's retry is a replay");

    // --callers-file: a request without a listed token is 407 and goes
    // nowhere, keyed or not; the token never reaches the upstream; two
    // callers' equal keys are two requests (neither can replay or block
    // the other's), one caller's retry is a replay.
    let callers = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        callers.path(),
        "# test callers\nbilling-token-0123456789 billing\nshipping-token-012345678 shipping\n",
    )
    .unwrap();
    let guarded = ProxyProcess::start(
        &endpoints,
        &upstream.url(),
        &["--callers-file", callers.path().to_str().unwrap()],
    )
    .await;
    let before = upstream.calls().len();
    for headers in [
        vec![("Idempotency-Key", "k11")],
        vec![],
        vec![
            ("Idempotency-Key", "k11"),
            ("Proxy-Authorization", "Bearer not-a-listed-token-000"),
        ],
    ] {
        let refused = post(&guarded.http(), "/orders", &headers, "x").await;
        assert_problem(&refused, 407, "PROXY_UNAUTHENTICATED");
        assert_eq!(
            refused.header("proxy-authenticate"),
            Some("Bearer realm=\"oncekv proxy\"")
        );
    }
    assert_eq!(upstream.calls().len(), before, "nothing forwarded");
    let bodies = created_bodies(
        &guarded,
        "k11",
        "Proxy-Authorization",
        &[
            "Bearer billing-token-0123456789",
            "Bearer shipping-token-012345678",
            "Bearer billing-token-0123456789",
        ],
    )
    .await;
    assert_eq!(upstream.calls_with("k11").len(), 2, "one call per caller");
    assert_ne!(bodies[0], bodies[1]);
    assert_eq!(bodies[0], bodies[2], "the caller's retry is a replay");
    let unkeyed = post(
        &guarded.http(),
        "/plain",
        &[("Proxy-Authorization", "Bearer shipping-token-012345678")],
        "p",
    )
    .await;
    assert_eq!(unkeyed.status, 201);
    assert!(
        upstream.calls()[before..]
            .iter()
            .all(|call| !call.proxy_authorization),
        "the proxy's token reached the upstream"
    );
    // SIGHUP reloads the callers file: a file that does not parse leaves
    // the callers in force; one that does is in force from then on (a
    // token removed is refused, one added is let in, keys stay per caller).
    let shipping = || async {
        let token = [("Proxy-Authorization", "Bearer shipping-token-012345678")];
        post(&guarded.http(), "/plain", &token, "p").await
    };
    reload_callers(&guarded, callers.path(), "short shipping\n", "failed").await;
    let still = shipping().await;
    assert_eq!(still.status, 201, "the previous callers stay in force");
    reload_callers(
        &guarded,
        callers.path(),
        "billing-token-0123456789 billing\naudit-token-0123456789x audit\n",
        "ok",
    )
    .await;
    let removed = shipping().await;
    assert_problem(&removed, 407, "PROXY_UNAUTHENTICATED");
    let bodies = created_bodies(
        &guarded,
        "k11",
        "Proxy-Authorization",
        &[
            "Bearer audit-token-0123456789x",
            "Bearer billing-token-0123456789",
        ],
    )
    .await;
    assert_eq!(
        upstream.calls_with("k11").len(),
        3,
        "the new caller's own key"
    );
    assert_ne!(bodies[0], bodies[1]);

    // A cluster out of reach: keyed requests are refused (503), never
    // forwarded; requests without a key still pass.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = vec![closed.local_addr().unwrap().to_string()];
    drop(closed);
    let cut_off = ProxyProcess::start(&nowhere, &upstream.url(), &["--timeout-ms", "1000"]).await;
    let before = upstream.calls().len();
    let refused = cut_off
        .http()
        .request("POST", "/orders", &[("Idempotency-Key", "k8")], b"x")
        .await
        .unwrap();
    assert_problem(&refused, 503, "CLAIM_UNAVAILABLE");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        upstream.calls().len(),
        before,
        "fail closed: nothing forwarded"
    );
    let plain = post(&cut_off.http(), "/plain", &[], "p").await;
    assert_eq!(plain.status, 201);

    https_upstreams(&endpoints).await;
    https_listener(&endpoints).await;
    callers_certificates(&endpoints).await;
}

/// `--tls-cert`/`--tls-key`: the proxy's own listener speaks HTTPS (a
/// keyed request forwarded once and replayed over it; plain HTTP gets no
/// answer), and SIGHUP reads the pair again — a new pair is presented from
/// the next handshake, one that does not load leaves the old in force.
async fn https_listener(endpoints: &[String]) {
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    // node-1 names 127.0.0.1; node-2 only `elsewhere.test`.
    support::cluster::make_certs(dir, &["--node", "1"]);
    support::cluster::make_certs(dir, &["--node", "2", "--host", "elsewhere.test"]);
    let (cert, key) = (dir.join("listener.pem"), dir.join("listener-key.pem"));
    let install = |name: &str| {
        std::fs::copy(dir.join(format!("{name}.pem")), &cert).unwrap();
        std::fs::copy(dir.join(format!("{name}-key.pem")), &key).unwrap();
    };
    install("node-1");
    let upstream = Upstream::start().await;
    let proxy = ProxyProcess::start(
        endpoints,
        &upstream.url(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    )
    .await;
    let https = Http::tls(&proxy.addr, &dir.join("ca.pem"));
    let first = post(&https, "/orders", &[("Idempotency-Key", "s1")], "tls").await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let again = post(&https, "/orders", &[("Idempotency-Key", "s1")], "tls").await;
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(upstream.calls_with("s1").len(), 1);
    assert!(
        proxy
            .http()
            .request("POST", "/orders", &[("Idempotency-Key", "s2")], b"plain")
            .await
            .is_err(),
        "plain HTTP on the HTTPS listener gets no answer"
    );
    assert!(upstream.calls_with("s2").is_empty());

    let hang_up = |result: &'static str| reload_tls(&proxy, result);
    // A certificate for another name: from the next handshake on, a
    // client that checks the name refuses the proxy.
    install("node-2");
    hang_up("ok").await;
    let refused = https
        .request("POST", "/orders", &[("Idempotency-Key", "s3")], b"tls")
        .await;
    assert!(
        refused.is_err(),
        "the reloaded certificate names another host"
    );
    // A pair that does not load: the previous one (node-2's) stays.
    std::fs::write(&cert, "not a certificate").unwrap();
    hang_up("failed").await;
    assert!(
        https
            .request("POST", "/orders", &[("Idempotency-Key", "s3")], b"tls")
            .await
            .is_err(),
        "still node-2's certificate"
    );
    install("node-1");
    hang_up("ok").await;
    let served = post(&https, "/orders", &[("Idempotency-Key", "s3")], "tls").await;
    assert_eq!(
        served.status,
        201,
        "{}",
        String::from_utf8_lossy(&served.body)
    );
    assert_eq!(upstream.calls_with("s3").len(), 1);
}

/// Sends `proxy` SIGHUP and waits until its listener's TLS reload counts
/// one more `result` ("ok" or "failed").
async fn reload_tls(proxy: &ProxyProcess, result: &str) {
    let count = || async {
        support::metrics::counter(
            &proxy.metrics().await,
            "oncekv_proxy_tls_reloads_total",
            &[("result", result)],
        )
    };
    let before = count().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_until("the listener TLS's reload", || async {
        count().await > before
    })
    .await;
}

/// HTTPS to `addr` trusting `dir`'s CA, as the caller whose identity
/// `oncekv certs --client NAME` wrote into `dir`.
fn caller_http(addr: &str, dir: &std::path::Path, name: &str) -> Http {
    Http::tls_as(
        addr,
        &dir.join("ca.pem"),
        &dir.join(format!("{name}.pem")),
        &dir.join(format!("{name}-key.pem")),
    )
}

/// The proxy refused the TLS handshake of a request made `how` (a fatal
/// alert from it, not a connection refused or a timeout).
fn assert_handshake_refused(result: Result<HttpResponse, String>, how: &str) {
    match result {
        Ok(response) => panic!("answered {how}: {response:?}"),
        Err(error) => assert!(
            error.contains("received fatal alert"),
            "refused {how}, but not at the handshake: {error}"
        ),
    }
}

/// No call with `key` brought a `Proxy-Authorization` to `upstream`.
fn assert_no_proxy_authorization(upstream: &Upstream, key: &str) {
    assert!(
        upstream
            .calls_with(key)
            .iter()
            .all(|call| !call.proxy_authorization),
        "a Proxy-Authorization reached the upstream with {key}"
    );
}

/// Issues `DIR/nameless.pem` and its key: a client certificate signed by
/// `DIR`'s CA with neither a common name nor a DNS name.
fn issue_nameless(dir: &std::path::Path) {
    use rcgen::{CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, Issuer, KeyPair};
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let ca_key = KeyPair::from_pem(&read("ca-key.pem")).unwrap();
    let ca = Issuer::from_ca_cert_pem(&read("ca.pem"), ca_key).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = DistinguishedName::new();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let certificate = params.signed_by(&key, &ca).unwrap();
    std::fs::write(dir.join("nameless.pem"), certificate.pem()).unwrap();
    std::fs::write(dir.join("nameless-key.pem"), key.serialize_pem()).unwrap();
}

/// `--callers-ca`: a verified client certificate names its caller. Alone,
/// a certificate is required at the handshake (none, or one of another
/// CA: no answer), one that names nobody is 407, and two callers' equal
/// keys are two requests while one caller's retry is a replay; a token
/// sent anyway never reaches the upstream. SIGHUP reads the CA again: the
/// old CA's certificates are refused from the next handshake, the new
/// one's let in. With `--callers-file` too, a caller gives a token or a
/// certificate: neither is 407, a token and a certificate of one name
/// share its keys, and a token given is checked even beside a good
/// certificate.
async fn callers_certificates(endpoints: &[String]) {
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    let args = ["--node", "1", "--client", "billing", "--client", "shipping"];
    support::cluster::make_certs(dir, &args);
    let foreign = tempfile::tempdir().unwrap();
    support::cluster::make_certs(foreign.path(), &["--client", "billing"]);
    issue_nameless(dir);
    // The proxy's own copy of the callers' CA, to be swapped on reload
    // (the clients keep trusting dir/ca.pem for the proxy's certificate).
    std::fs::copy(dir.join("ca.pem"), dir.join("callers-ca.pem")).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let as_caller = |addr: &str, name: &str| caller_http(addr, dir, name);
    let upstream = Upstream::start().await;
    let listener = [
        "--tls-cert".to_owned(),
        path("node-1.pem"),
        "--tls-key".to_owned(),
        path("node-1-key.pem"),
        "--callers-ca".to_owned(),
        path("callers-ca.pem"),
    ];
    let listener: Vec<&str> = listener.iter().map(String::as_str).collect();
    let required = ProxyProcess::start(endpoints, &upstream.url(), &listener).await;
    let anonymous = Http::tls(&required.addr, &dir.join("ca.pem"));
    let no_certificate = anonymous
        .request("POST", "/orders", &[("Idempotency-Key", "c1")], b"x")
        .await;
    assert_handshake_refused(no_certificate, "without a certificate");
    let other_ca = Http::tls_as(
        &required.addr,
        &dir.join("ca.pem"),
        &foreign.path().join("billing.pem"),
        &foreign.path().join("billing-key.pem"),
    );
    let wrong_ca = other_ca
        .request("POST", "/orders", &[("Idempotency-Key", "c1")], b"x")
        .await;
    assert_handshake_refused(wrong_ca, "with another CA's certificate");
    let nameless = as_caller(&required.addr, "nameless");
    let refused = post(&nameless, "/orders", &[("Idempotency-Key", "c1")], "x").await;
    assert_problem(&refused, 407, "PROXY_UNAUTHENTICATED");
    assert!(upstream.calls_with("c1").is_empty(), "nothing forwarded");
    let mut bodies = Vec::new();
    for name in ["billing", "shipping", "billing"] {
        let http = as_caller(&required.addr, name);
        let token = ("Proxy-Authorization", "Bearer billing-token-0123456789");
        let answer = post(&http, "/orders", &[("Idempotency-Key", "c1"), token], "x").await;
        assert_eq!(answer.status, 201, "{answer:?}");
        bodies.push(answer.body);
    }
    assert_eq!(upstream.calls_with("c1").len(), 2, "one call per caller");
    assert_ne!(bodies[0], bodies[1]);
    assert_eq!(bodies[0], bodies[2], "the caller's retry is a replay");
    assert_no_proxy_authorization(&upstream, "c1");
    // SIGHUP with another CA in the file: from the next handshake on, its
    // certificates are callers and the old CA's are not.
    std::fs::copy(foreign.path().join("ca.pem"), dir.join("callers-ca.pem")).unwrap();
    reload_tls(&required, "ok").await;
    let old_ca = as_caller(&required.addr, "shipping")
        .request("POST", "/orders", &[("Idempotency-Key", "c3")], b"x")
        .await;
    assert_handshake_refused(old_ca, "with the old CA's certificate");
    let new_ca = post(&other_ca, "/orders", &[("Idempotency-Key", "c3")], "x").await;
    assert_eq!(new_ca.status, 201, "{new_ca:?}");
    assert_eq!(upstream.calls_with("c3").len(), 1);
    std::fs::copy(dir.join("ca.pem"), dir.join("callers-ca.pem")).unwrap();
    drop(required);
    callers_tokens_or_certificates(endpoints, &upstream, dir, &listener).await;
}

/// The second half of [`callers_certificates`]: `--callers-ca` with
/// `--callers-file`, on the certificates in `dir` and the `listener`'s
/// flags.
async fn callers_tokens_or_certificates(
    endpoints: &[String],
    upstream: &Upstream,
    dir: &std::path::Path,
    listener: &[&str],
) {
    let as_caller = |addr: &str, name: &str| caller_http(addr, dir, name);

    // With a callers file: a token or a certificate.
    let callers = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(callers.path(), "billing-token-0123456789 billing\n").unwrap();
    let mut either = listener.to_vec();
    either.extend(["--callers-file", callers.path().to_str().unwrap()]);
    let either = ProxyProcess::start(endpoints, &upstream.url(), &either).await;
    let anonymous = Http::tls(&either.addr, &dir.join("ca.pem"));
    let refused = post(&anonymous, "/orders", &[("Idempotency-Key", "c2")], "x").await;
    assert_problem(&refused, 407, "PROXY_UNAUTHENTICATED");
    let why = refused.json()["detail"].to_string();
    assert!(why.contains("client certificate"), "{why}");
    let token = ("Proxy-Authorization", "Bearer billing-token-0123456789");
    let by_token = post(
        &anonymous,
        "/orders",
        &[("Idempotency-Key", "c2"), token],
        "x",
    )
    .await;
    assert_eq!(by_token.status, 201, "{by_token:?}");
    let billing = as_caller(&either.addr, "billing");
    let by_certificate = post(&billing, "/orders", &[("Idempotency-Key", "c2")], "x").await;
    assert_eq!(
        (by_certificate.status, &by_certificate.body),
        (201, &by_token.body)
    );
    assert_eq!(by_certificate.header("idempotent-replayed"), Some("true"));
    let shipping = as_caller(&either.addr, "shipping");
    let bad_token = ("Proxy-Authorization", "Bearer not-a-listed-token-000");
    let refused = post(
        &shipping,
        "/orders",
        &[("Idempotency-Key", "c2"), bad_token],
        "x",
    )
    .await;
    assert_problem(&refused, 407, "PROXY_UNAUTHENTICATED");
    let own = post(&shipping, "/orders", &[("Idempotency-Key", "c2")], "x").await;
    assert_eq!(own.status, 201, "{own:?}");
    assert_ne!(own.body, by_token.body, "shipping's c2 is its own");
    assert_eq!(upstream.calls_with("c2").len(), 2);
    assert_no_proxy_authorization(upstream, "c2");
}

/// An https upstream: forwarded once and replayed with `--upstream-ca`;
/// refused (502, released, nothing reaches the service) when its
/// certificate chains to no trusted root or does not name the host; and,
/// behind an upstream that asks for client certificates, let in only with
/// `--upstream-cert`/`--upstream-key`.
async fn https_upstreams(endpoints: &[String]) {
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    // node-1 names 127.0.0.1 (and localhost); node-2 only `elsewhere.test`.
    support::cluster::make_certs(dir, &["--node", "1", "--client", "proxy"]);
    support::cluster::make_certs(dir, &["--node", "2", "--host", "elsewhere.test"]);
    let path = |name: &str| dir.join(name);
    let ca = path("ca.pem");
    let ca_arg = ca.to_str().unwrap();
    let keyed = |proxy: &ProxyProcess, key: &'static str| {
        let http = proxy.http();
        async move { post(&http, "/orders", &[("Idempotency-Key", key)], "tls").await }
    };

    let upstream = Upstream::start_tls(&path("node-1.pem"), &path("node-1-key.pem"), None).await;
    let trusted =
        ProxyProcess::start(endpoints, &upstream.https_url(), &["--upstream-ca", ca_arg]).await;
    let first = keyed(&trusted, "t1").await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.header("idempotent-replayed"), Some("false"));
    let again = keyed(&trusted, "t1").await;
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(upstream.calls_with("t1").len(), 1);

    // The platform's roots do not trust this test's CA.
    let untrusted = ProxyProcess::start(endpoints, &upstream.https_url(), &[]).await;
    let refused = keyed(&untrusted, "t2").await;
    assert_problem(&refused, 502, "UPSTREAM_UNREACHABLE");
    let detail = refused.json()["detail"].to_string();
    assert!(detail.contains("certificate"), "{detail}");
    assert!(upstream.calls_with("t2").is_empty());
    // Released: the same key through a proxy that trusts the CA goes on.
    let retried = keyed(&trusted, "t2").await;
    assert_eq!(
        retried.status,
        201,
        "{}",
        String::from_utf8_lossy(&retried.body)
    );
    assert_eq!(upstream.calls_with("t2")[0].attempt, Some(2));

    // A certificate of the right CA for another name.
    let misnamed = Upstream::start_tls(&path("node-2.pem"), &path("node-2-key.pem"), None).await;
    let proxy =
        ProxyProcess::start(endpoints, &misnamed.https_url(), &["--upstream-ca", ca_arg]).await;
    let refused = keyed(&proxy, "t3").await;
    assert_problem(&refused, 502, "UPSTREAM_UNREACHABLE");
    assert!(misnamed.calls().is_empty());

    // Mutual TLS: without a client certificate the handshake fails.
    let mutual = Upstream::start_tls(&path("node-1.pem"), &path("node-1-key.pem"), Some(&ca)).await;
    let anonymous =
        ProxyProcess::start(endpoints, &mutual.https_url(), &["--upstream-ca", ca_arg]).await;
    let refused = keyed(&anonymous, "t4").await;
    assert_problem(&refused, 502, "UPSTREAM_UNREACHABLE");
    assert!(mutual.calls().is_empty());
    let identified = ProxyProcess::start(
        endpoints,
        &mutual.https_url(),
        &[
            "--upstream-ca",
            ca_arg,
            "--upstream-cert",
            path("proxy.pem").to_str().unwrap(),
            "--upstream-key",
            path("proxy-key.pem").to_str().unwrap(),
        ],
    )
    .await;
    let accepted = keyed(&identified, "t5").await;
    assert_eq!(
        accepted.status,
        201,
        "{}",
        String::from_utf8_lossy(&accepted.body)
    );
    assert_eq!(mutual.calls_with("t5").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_survives_its_own_crash_and_the_leaders() {
    let cluster = Cluster::start("proxy-faults").await;
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.client_addrs();
    let upstream = Upstream::start().await;
    let args = ["--lease-ms", "1500", "--wait-ms", "15000"];

    // A proxy SIGKILLed while the upstream works on its request leaves a
    // lease, not a stuck key: after the lease, the retry through another
    // proxy forwards again, as attempt 2 with a larger fence.
    let first = ProxyProcess::start(&endpoints, &upstream.url(), &args).await;
    let second = ProxyProcess::start(&endpoints, &upstream.url(), &args).await;
    let http = first.http();
    let lost = tokio::spawn(async move {
        http.request(
            "POST",
            "/ship",
            &[("Idempotency-Key", "s1"), ("x-test-sleep-ms", "3000")],
            b"ship 1",
        )
        .await
    });
    upstream.wait_for_calls("s1", 1).await;
    let killed_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let retried = post(
        &second.http(),
        "/ship",
        &[("Idempotency-Key", "s1")],
        "ship 1",
    )
    .await;
    assert_eq!(
        retried.status,
        201,
        "{}",
        String::from_utf8_lossy(&retried.body)
    );
    assert_eq!(retried.header("idempotent-replayed"), Some("false"));
    let calls = upstream.calls_with("s1");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!((calls[0].attempt, calls[1].attempt), (Some(1), Some(2)));
    assert!(calls[1].fence > calls[0].fence, "{calls:?}");
    assert!(
        killed_at.elapsed() >= Duration::from_millis(500),
        "the takeover waited for the dead proxy's lease"
    );
    assert_eq!(json(&retried)["attempt"], 2);
    let lost = lost.await.unwrap();
    assert!(lost.is_err(), "the killed proxy answered: {lost:?}");
    drop(first);

    // A proxy paused past its lease while the upstream works: another
    // takes the key over and records its own answer; the paused one,
    // resumed, gets the upstream's answer but cannot record it: 409
    // FENCED, and its caller's retry gets the recorded answer.
    let paused = ProxyProcess::start(&endpoints, &upstream.url(), &args).await;
    let http = paused.http();
    let stale = tokio::spawn(async move {
        post(
            &http,
            "/ship",
            &[("Idempotency-Key", "s3"), ("x-test-sleep-ms", "1000")],
            "ship 3",
        )
        .await
    });
    upstream.wait_for_calls("s3", 1).await;
    let pid = nix::unistd::Pid::from_raw(paused.pid());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let taken_over = post(
        &second.http(),
        "/ship",
        &[("Idempotency-Key", "s3")],
        "ship 3",
    )
    .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(taken_over.status, 201, "{taken_over:?}");
    assert_eq!(json(&taken_over)["attempt"], 2);
    let stale = stale.await.unwrap();
    assert_problem(&stale, 409, "FENCED");
    let calls = upstream.calls_with("s3");
    assert_eq!(json(&stale)["fence"], calls[0].fence.unwrap());
    assert_eq!(json(&stale)["current_fence"], calls[1].fence.unwrap());
    let retry = post(
        &paused.http(),
        "/ship",
        &[("Idempotency-Key", "s3")],
        "ship 3",
    )
    .await;
    assert_eq!((retry.status, &retry.body), (201, &taken_over.body));
    assert_eq!(upstream.calls_with("s3").len(), 2);
    drop(paused);

    // The library's `once` cancelled mid-effect (its future dropped, as a
    // caller that gives up does) stops its heartbeat: the lease runs out
    // and the next claim takes over.
    let client = oncekv_client::Client::connect(endpoints.clone());
    let options = oncekv_client::OnceOptions {
        lease: Duration::from_millis(600),
        wait: Duration::from_secs(10),
        heartbeat: None,
    };
    let cancelled = tokio::time::timeout(
        Duration::from_millis(800),
        client.once(b"cancelled", b"job", &options, |_| {
            std::future::pending::<Result<Vec<u8>, String>>()
        }),
    )
    .await;
    assert!(cancelled.is_err(), "the effect never ends");
    let next = client
        .once(b"cancelled", b"job", &options, |token| async move {
            Ok::<_, String>(token.attempt.to_string().into_bytes())
        })
        .await
        .expect("the next claim takes over");
    assert_eq!(next.result(), b"2");

    // The leader killed while the upstream works — twice as long as the
    // lease, so the heartbeat must carry the lease across the election:
    // the request still ends with one upstream call and its answer
    // recorded; a concurrent retry and a later one get the same bytes.
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let http = second.http();
    let request = tokio::spawn(async move {
        post(
            &http,
            "/ship",
            &[("Idempotency-Key", "s2"), ("x-test-sleep-ms", "3000")],
            "ship 2",
        )
        .await
    });
    upstream.wait_for_calls("s2", 1).await;
    cluster.kill(leader);
    let http = second.http();
    let retry =
        tokio::spawn(
            async move { post(&http, "/ship", &[("Idempotency-Key", "s2")], "ship 2").await },
        );
    let answer = request.await.unwrap();
    let retry = retry.await.unwrap();
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.header("idempotent-replayed"), Some("false"));
    assert_eq!(
        (retry.status, &retry.body),
        (201, &answer.body),
        "{retry:?}"
    );
    let later = post(
        &second.http(),
        "/ship",
        &[("Idempotency-Key", "s2")],
        "ship 2",
    )
    .await;
    assert_eq!((later.status, &later.body), (201, &answer.body));
    assert_eq!(upstream.calls_with("s2").len(), 1, "{:?}", upstream.calls());

    // --reply-before-record: the upstream's answer goes to its caller
    // before the record is written — here while the cluster cannot write
    // (the killed leader still down, a second node paused), where a proxy
    // that records first holds the answer until the cluster is back or its
    // call deadline (10 s) passes. The key stays held meanwhile: once the
    // cluster is back, the retry gets the replay, and the upstream saw one
    // call.
    let early = ProxyProcess::start(
        &endpoints,
        &upstream.url(),
        &["--wait-ms", "15000", "--reply-before-record"],
    )
    .await;
    let http = early.http();
    let request = tokio::spawn(async move {
        post(
            &http,
            "/ship",
            &[("Idempotency-Key", "s4"), ("x-test-sleep-ms", "1000")],
            "ship 4",
        )
        .await
    });
    upstream.wait_for_calls("s4", 1).await;
    let paused = (1..=3)
        .find(|&node| node != leader && cluster.is_running(node))
        .expect("a live node besides the killed leader");
    cluster.pause(paused);
    let answer = tokio::time::timeout(Duration::from_secs(5), request).await;
    cluster.resume(paused);
    let answer = answer
        .expect("answered while the cluster could not record")
        .unwrap();
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.header("idempotent-replayed"), Some("false"));
    let retry = post(
        &early.http(),
        "/ship",
        &[("Idempotency-Key", "s4")],
        "ship 4",
    )
    .await;
    assert_eq!((retry.status, &retry.body), (201, &answer.body));
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(upstream.calls_with("s4").len(), 1, "{:?}", upstream.calls());
}

/// The count of the metric line `name{labels}` in `metrics` (0 when absent).
fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Without a cluster (nothing here is keyed past its body): a request
/// without a key whose chunked body breaks off is the caller's fault —
/// 400 `BODY_BROKEN`, counted `refused`, never an upstream failure (the
/// upstream got no whole request: no call) — as a keyed one's is; and the
/// `Proxy-Authorization` scheme is case-insensitive (RFC 9110 §11.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_bodies_and_bearer_in_any_case() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = vec![closed.local_addr().unwrap().to_string()];
    drop(closed);
    let upstream = Upstream::start().await;
    let callers = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(callers.path(), "billing-token-0123456789 billing\n").unwrap();
    let proxy = ProxyProcess::start(
        &nowhere,
        &upstream.url(),
        &[
            "--timeout-ms",
            "1000",
            "--callers-file",
            callers.path().to_str().unwrap(),
        ],
    )
    .await;
    for (key, expected_refused) in [("", 1.0), ("Idempotency-Key: k1\r\n", 2.0)] {
        let broken = format!(
            "POST /chunk HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer \
             billing-token-0123456789\r\n{key}Transfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\nzz\r\n"
        );
        let answer = proxy.http().raw(broken.as_bytes()).await.unwrap();
        assert_problem(&answer, 400, "BODY_BROKEN");
        let metrics = proxy.metrics().await;
        assert_eq!(
            metric(
                &metrics,
                "oncekv_proxy_upstream_responses_total{class=\"unreachable\"}"
            ),
            0.0,
            "{metrics}"
        );
        assert_eq!(
            metric(&metrics, "oncekv_proxy_requests_total{outcome=\"refused\"}"),
            expected_refused,
            "{metrics}"
        );
    }
    assert!(upstream.calls().is_empty(), "{:?}", upstream.calls());

    for scheme in ["Bearer", "bearer", "BEARER"] {
        let authorization = format!("{scheme} billing-token-0123456789");
        let passed = post(
            &proxy.http(),
            "/plain",
            &[("Proxy-Authorization", &authorization)],
            "p",
        )
        .await;
        assert_eq!(passed.status, 201, "{scheme}: {passed:?}");
    }
    let refused = post(
        &proxy.http(),
        "/plain",
        &[("Proxy-Authorization", "Basic billing-token-0123456789")],
        "p",
    )
    .await;
    assert_problem(&refused, 407, "PROXY_UNAUTHENTICATED");
    assert_eq!(upstream.calls().len(), 3);
    assert!(
        upstream
            .calls()
            .iter()
            .all(|call| !call.proxy_authorization)
    );
}
