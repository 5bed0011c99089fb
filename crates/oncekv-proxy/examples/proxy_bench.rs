//! The proxy's overhead, measured (docs/benchmarks.md, "The Idempotency-Key
//! proxy"): a closed-loop load (each client one request at a time over its
//! own keep-alive connection) against a small upstream in this process,
//! called directly and through a real `oncekv proxy` process in front of
//! a running cluster, at each number of clients:
//!
//! - `direct`: `POST` to the upstream itself, the baseline;
//! - `passed_through`: through the proxy without a key;
//! - `keyed_new`: through the proxy with a new `Idempotency-Key` each time
//!   (claim, forward, complete: two log writes);
//! - `keyed_new_early`: the same through a second proxy run with
//!   `--reply-before-record` (the answer given before the complete: one log
//!   write on the caller's path);
//! - `keyed_replay`: through the proxy with each client's one key again
//!   (answered from the record: one claim call, the upstream untouched);
//! - `once_cycle`: no HTTP at all — the client library's `Client::once`
//!   with an empty effect (claim and complete), what the cluster costs a
//!   keyed request;
//! - `claim_only`: no HTTP either — one `Client::claim` of a new key (one
//!   log write, left to its lease): what the claim alone costs, the part
//!   of a new key's time the proxy cannot remove;
//! - `claim_early`: the same claim with its complete sent in the
//!   background as the next claim goes out — what a new key's claim costs
//!   behind `--reply-before-record`, whose previous complete is still
//!   being written.
//!
//! Each prints operations per second, p50 and p99, and the p50/p99 added
//! over `direct`. Run it against `scripts/cluster.sh start` with a
//! release build:
//!
//! ```sh
//! cargo build --release --bin oncekv --example proxy_bench -p oncekv -p oncekv-proxy
//! target/release/examples/proxy_bench --oncekv target/release/oncekv \
//!     --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 --clients 1,64 --seconds 8
//! ```
//!
//! `--modes direct,keyed_new_early,claim_only` runs only those modes, in
//! that order (the added columns are over `direct`, so name it first).
//!
//! It only talks to loopback addresses, kills the proxy it started when it
//! ends, and every request has a timeout.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Deadline of one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

struct Args {
    oncekv: String,
    endpoints: String,
    clients: Vec<usize>,
    seconds: u64,
    /// The modes to run, in this order (`--modes`; all by default).
    modes: Vec<Mode>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        oncekv: "target/release/oncekv".into(),
        endpoints: "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into(),
        clients: vec![1, 64],
        seconds: 8,
        modes: Mode::ALL.to_vec(),
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--oncekv" => args.oncekv = value()?,
            "--endpoints" => args.endpoints = value()?,
            "--clients" => {
                args.clients = value()?
                    .split(',')
                    .map(|n| n.trim().parse().map_err(|_| format!("--clients {n:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--seconds" => args.seconds = value()?.parse().map_err(|_| "--seconds N")?,
            "--modes" => {
                args.modes = value()?
                    .split(',')
                    .map(|name| {
                        Mode::ALL
                            .into_iter()
                            .find(|mode| mode.name() == name.trim())
                            .ok_or(format!("--modes: no mode {name:?}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    for endpoint in args.endpoints.split(',') {
        if !endpoint.starts_with("127.0.0.1:") && !endpoint.starts_with("localhost:") {
            return Err(format!("{endpoint}: loopback endpoints only"));
        }
    }
    Ok(args)
}

/// The upstream: every `POST` is answered 201 with a small JSON body.
async fn start_upstream() -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let effects = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let effects = Arc::clone(&effects);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let effects = Arc::clone(&effects);
                    async move {
                        let _ = request.into_body().collect().await;
                        let effect = effects.fetch_add(1, Ordering::Relaxed) + 1;
                        let body = format!("{{\"order\":\"created\",\"effect\":{effect}}}");
                        Response::builder()
                            .status(StatusCode::CREATED)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// CPU time (user + system) `pid` has used so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The fields after the command's `(name)`: utime and stime are the
    // 12th and 13th (fields 14 and 15 of the line), in clock ticks.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // USER_HZ is 100 on Linux.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The `oncekv proxy` process; killed and reaped on drop.
struct ProxyProcess(Child);

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_proxy(
    args: &Args,
    upstream: std::net::SocketAddr,
    extra: &[&str],
) -> Result<(ProxyProcess, String), Failure> {
    let mut child = Command::new(&args.oncekv)
        .args([
            "--endpoints",
            &args.endpoints,
            "proxy",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--upstream")
        .arg(format!("http://{upstream}"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let process = ProxyProcess(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("the proxy said {line:?}"))?
        .to_owned();
    Ok((process, addr))
}

/// One measured mode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Direct,
    PassedThrough,
    KeyedNew,
    /// New keys through a second proxy run with `--reply-before-record`.
    KeyedNewEarly,
    KeyedReplay,
    OnceCycle,
    ClaimOnly,
    ClaimEarly,
}

impl Mode {
    const ALL: [Mode; 8] = [
        Mode::Direct,
        Mode::PassedThrough,
        Mode::KeyedNew,
        Mode::KeyedNewEarly,
        Mode::KeyedReplay,
        Mode::OnceCycle,
        Mode::ClaimOnly,
        Mode::ClaimEarly,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::PassedThrough => "passed_through",
            Mode::KeyedNew => "keyed_new",
            Mode::KeyedNewEarly => "keyed_new_early",
            Mode::KeyedReplay => "keyed_replay",
            Mode::OnceCycle => "once_cycle",
            Mode::ClaimOnly => "claim_only",
            Mode::ClaimEarly => "claim_early",
        }
    }
}

struct Outcome {
    operations: usize,
    errors: u64,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * fraction).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `clients` closed loops of `mode` for `seconds`.
/// Where requests go: the upstream itself, the proxy, the proxy that
/// replies before it records.
struct Targets {
    upstream: String,
    proxy: String,
    early_proxy: String,
}

async fn measure(
    mode: Mode,
    clients: usize,
    seconds: u64,
    targets: &Targets,
    library: &oncekv_client::Client,
    run: &str,
) -> Outcome {
    let stop = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let target = match mode {
            Mode::Direct => targets.upstream.clone(),
            Mode::KeyedNewEarly => targets.early_proxy.clone(),
            _ => targets.proxy.clone(),
        };
        let library = library.clone();
        let run = run.to_owned();
        tasks.push(tokio::spawn(async move {
            // One connection per client: its own keep-alive client.
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            let http: HttpClient<HttpConnector, Full<Bytes>> =
                HttpClient::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(1)
                    .build(connector);
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let replay_key = format!("bench-{run}-replay-{client}");
            if mode == Mode::KeyedReplay && send(&http, &target, Some(&replay_key)).await.is_err() {
                errors += 1;
            }
            let mut n = 0u64;
            while Instant::now() < stop {
                n += 1;
                let began = Instant::now();
                let result = match mode {
                    Mode::Direct | Mode::PassedThrough => send(&http, &target, None).await,
                    Mode::KeyedNew | Mode::KeyedNewEarly => {
                        let key = format!("bench-{run}-{}-{client}-{n}", mode.name());
                        send(&http, &target, Some(&key)).await
                    }
                    Mode::KeyedReplay => send(&http, &target, Some(&replay_key)).await,
                    Mode::OnceCycle => {
                        let key = format!("bench-{run}-once-{client}-{n}");
                        let options = oncekv_client::OnceOptions::default();
                        library
                            .once(key.as_bytes(), b"bench", &options, |_| async {
                                Ok::<_, Failure>(b"{\"order\":\"created\"}".to_vec())
                            })
                            .await
                            .map(drop)
                            .map_err(|error| Failure::from(error.to_string()))
                    }
                    Mode::ClaimEarly => {
                        let key = format!("bench-{run}-early-{client}-{n}");
                        match library
                            .claim(key.as_bytes(), b"bench", Duration::from_secs(30))
                            .await
                        {
                            Ok(oncekv_client::ClaimAnswer::Won { fence, .. }) => {
                                let library = library.clone();
                                tokio::spawn(async move {
                                    let _ =
                                        library.complete_claim(key.as_bytes(), fence, b"x").await;
                                });
                                Ok(())
                            }
                            Ok(_) => Err(Failure::from("not won")),
                            Err(error) => Err(Failure::from(error.to_string())),
                        }
                    }
                    Mode::ClaimOnly => {
                        let key = format!("bench-{run}-claim-{client}-{n}");
                        library
                            .claim(key.as_bytes(), b"bench", Duration::from_secs(30))
                            .await
                            .map(drop)
                            .map_err(|error| Failure::from(error.to_string()))
                    }
                };
                match result {
                    Ok(()) => latencies.push(began.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut outcome = Outcome {
        operations: 0,
        errors: 0,
        latencies: Vec::new(),
        elapsed: Duration::ZERO,
    };
    for task in tasks {
        if let Ok((latencies, errors)) = task.await {
            outcome.operations += latencies.len();
            outcome.errors += errors;
            outcome.latencies.extend(latencies);
        }
    }
    outcome.elapsed = started.elapsed();
    outcome.latencies.sort_unstable();
    outcome
}

/// One `POST /orders` to `target` (with `key` as its Idempotency-Key);
/// Ok on a 201.
async fn send(
    http: &HttpClient<HttpConnector, Full<Bytes>>,
    target: &str,
    key: Option<&str>,
) -> Result<(), Failure> {
    let mut request =
        Request::post(format!("http://{target}/orders")).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Full::new(Bytes::from_static(
        b"{\"item\":\"book\",\"qty\":1}",
    )))?;
    let response = tokio::time::timeout(REQUEST_TIMEOUT, http.request(request)).await??;
    let status = response.status();
    response.into_body().collect().await?;
    if status == StatusCode::CREATED {
        Ok(())
    } else {
        Err(format!("status {status}").into())
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args = parse_args().map_err(|error| format!("usage: {error}"))?;
    let upstream = start_upstream().await?;
    let (proxy_process, proxy) = start_proxy(&args, upstream, &[])?;
    let (early_process, early_proxy) = start_proxy(&args, upstream, &["--reply-before-record"])?;
    let proxy_pid = proxy_process.0.id();
    let early_pid = early_process.0.id();
    let targets = Targets {
        upstream: upstream.to_string(),
        proxy,
        early_proxy,
    };
    let library = oncekv_client::Client::connect(args.endpoints.split(',').map(str::to_owned));
    #[allow(clippy::disallowed_methods)] // a run id only keeps keys of two runs apart
    let run: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    // Warm up: the proxy's connections to the cluster and the upstream.
    let warm_up = format!("{run}-warm-up");
    let _ = measure(Mode::KeyedNew, 4, 1, &targets, &library, &warm_up).await;
    let _ = measure(Mode::KeyedNewEarly, 4, 1, &targets, &library, &warm_up).await;
    println!(
        "{:>7} {:<15} {:>9} {:>8} {:>8} {:>10} {:>10} {:>14} {:>7}",
        "clients",
        "mode",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "+p50 ms",
        "+p99 ms",
        "proxy CPU µs/op",
        "errors"
    );
    for &clients in &args.clients {
        let mut direct = (Duration::ZERO, Duration::ZERO);
        for &mode in &args.modes {
            let pid = if mode == Mode::KeyedNewEarly {
                early_pid
            } else {
                proxy_pid
            };
            let cpu_before = cpu_time(pid);
            let outcome = measure(
                mode,
                clients,
                args.seconds,
                &targets,
                &library,
                &format!("{run}-{clients}"),
            )
            .await;
            let proxy_cpu = cpu_time(pid).saturating_sub(cpu_before);
            let p50 = percentile(&outcome.latencies, 0.50);
            let p99 = percentile(&outcome.latencies, 0.99);
            if mode == Mode::Direct {
                direct = (p50, p99);
            }
            let added = |value: Duration, base: Duration| ms(value) - ms(base);
            println!(
                "{:>7} {:<15} {:>9.0} {:>8.3} {:>8.3} {:>10.3} {:>10.3} {:>14.0} {:>7}",
                clients,
                mode.name(),
                outcome.operations as f64 / outcome.elapsed.as_secs_f64(),
                ms(p50),
                ms(p99),
                added(p50, direct.0),
                added(p99, direct.1),
                proxy_cpu.as_secs_f64() * 1e6 / outcome.operations.max(1) as f64,
                outcome.errors
            );
        }
    }
    Ok(())
}
