//! `oncekv proxy --listen ADDR --upstream URL [...]`: the Idempotency-Key
//! HTTP proxy (docs/proxy.md), a thin command over the `oncekv-proxy`
//! crate. It owns the flags, turning them into the crate's `Config`, the
//! cluster client (the common `--endpoints`, credentials and
//! `--timeout-ms`, as every cluster command reads them), the listeners and
//! the process's stop on SIGTERM or ctrl-c; everything a request meets is
//! the crate's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use oncekv_client::{Client, ClientConfig};
use oncekv_proxy::listener_tls::{CallersCa, ListenerTls};
use oncekv_proxy::{Config, Metrics, Proxy};

use super::CommonArgs;
use super::output::{EXIT_FAILED, EXIT_OK, EXIT_USAGE, print_report};

/// `proxy`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Where to serve (HOST:PORT; port 0 picks a free one, printed).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: SocketAddr,
    /// The service behind the proxy: http://HOST:PORT or
    /// https://HOST[:PORT], with an optional path prefix. Over https the
    /// upstream's certificate must name HOST and chain to --upstream-ca
    /// (the platform's roots without it).
    #[arg(long, value_name = "URL")]
    pub upstream: String,
    /// CA certificates (PEM) an https upstream's certificate must chain
    /// to, instead of the platform's roots.
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<std::path::PathBuf>,
    /// A certificate (PEM) the proxy presents to an https upstream that
    /// asks for one (mutual TLS); with --upstream-key.
    #[arg(long, value_name = "FILE", requires = "upstream_key")]
    pub upstream_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --upstream-cert.
    #[arg(long, value_name = "FILE", requires = "upstream_cert")]
    pub upstream_key: Option<std::path::PathBuf>,
    /// Methods whose requests with an Idempotency-Key are claimed
    /// (comma-separated); other methods pass through.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "POST,PATCH",
        value_name = "METHOD"
    )]
    pub methods: Vec<String>,
    /// Answer 400 to a guarded method without an Idempotency-Key (instead
    /// of passing it through).
    #[arg(long)]
    pub require_key: bool,
    /// The claim's lease, renewed every third of it while the upstream
    /// works: how long a proxy that dies mid-request blocks its key.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(30..)
    )]
    pub lease_ms: u64,
    /// How long a retry waits for the same key's request in progress
    /// before answering 409 with Retry-After.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    pub wait_ms: u64,
    /// How long the upstream has to answer a request (its headers, and a
    /// keyed request's recorded body): then 504, and the key is released.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub upstream_timeout_ms: u64,
    /// A request header that is part of the fingerprint (repeatable):
    /// the same key with another value is KEY_CONFLICT.
    #[arg(long = "fingerprint-header", value_name = "NAME")]
    pub fingerprint_headers: Vec<String>,
    /// A response header recorded and replayed beside the defaults
    /// (content-type, content-encoding, content-language,
    /// content-location, location, etag, last-modified, cache-control;
    /// repeatable).
    #[arg(long = "record-header", value_name = "NAME")]
    pub record_headers: Vec<String>,
    /// Scope keys by a request header's value too (`header:X-Tenant`): a
    /// keyed request without it is 400.
    #[arg(long, value_name = "header:NAME")]
    pub key_scope: Option<String>,
    /// Only the callers named in this file may use the proxy: one `TOKEN
    /// NAME` per line (`#` comments; tokens of at least 16 printable
    /// characters), sent as `Proxy-Authorization: Bearer TOKEN` (407
    /// otherwise, nothing forwarded; the header never reaches the
    /// upstream). Each caller's idempotency keys are its own. Without it,
    /// everyone who reaches the listen address acts as the proxy's own
    /// cluster identity.
    #[arg(long, value_name = "FILE")]
    pub callers_file: Option<std::path::PathBuf>,
    /// Largest keyed request body, read whole to be fingerprinted (413
    /// beyond).
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub body_bytes_max: usize,
    /// Largest keyed request's headers (431 beyond).
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 10)]
    pub header_bytes_max: usize,
    /// Largest recorded answer (status, recorded headers and body); a
    /// larger answer is passed on whole to its first caller and recorded
    /// without its body. At most the cluster's claim_result_bytes_max.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 10)]
    pub response_bytes_max: usize,
    /// Give a keyed request's final answer to its caller as soon as the
    /// upstream gives it, and record it after (one consensus write less on
    /// the caller's path). The key stays held until the record lands, so a
    /// retry meanwhile waits and gets the replay; but an answer whose
    /// record then fails (the lease taken over, the cluster out of reach)
    /// was given and is not the key's (docs/proxy.md).
    #[arg(long)]
    pub reply_before_record: bool,
    /// Serve HTTPS on --listen with this certificate chain (PEM, the
    /// proxy's own certificate first; with --tls-key). Read again on
    /// SIGHUP: a pair that does not load leaves the one in force.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Ask callers for client certificates signed by a CA in this PEM
    /// file (HTTPS only, with --tls-cert): the certificate's common name
    /// (else its first DNS name) names the caller, whose idempotency keys
    /// are its own, as --callers-file's names are. Without --callers-file
    /// the certificate is required at the handshake; with it, a caller
    /// gives a token or a certificate (407 with neither). Read again on
    /// SIGHUP with the certificate and key.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub callers_ca: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
}

impl ProxyArgs {
    /// Runs the proxy until SIGTERM or ctrl-c; the exit code.
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let config = match self.config() {
            Ok(config) => config,
            Err(message) => {
                eprintln!("error: {message}");
                return EXIT_USAGE;
            }
        };
        let endpoints = match common.endpoints() {
            Ok(endpoints) => endpoints,
            Err(failure) => {
                return print_report(
                    &mut std::io::stdout(),
                    &mut std::io::stderr(),
                    false,
                    Err(failure),
                );
            }
        };
        let credentials = match common.credentials() {
            Ok(credentials) => credentials,
            Err(error) => {
                eprintln!("error: {error}");
                return EXIT_USAGE;
            }
        };
        let client = Client::with_config(
            endpoints,
            ClientConfig {
                call_timeout: common.timeout(),
                credentials,
                ..ClientConfig::default()
            },
        );
        let metrics = Arc::new(Metrics::new());
        let proxy = match Proxy::new(config, client, Arc::clone(&metrics)) {
            Ok(proxy) => Arc::new(proxy),
            Err(error) => {
                eprintln!("error: {error}");
                return EXIT_USAGE;
            }
        };
        match self.serve(proxy, metrics).await {
            Ok(()) => EXIT_OK,
            Err(message) => {
                eprintln!("error: {message}");
                EXIT_FAILED
            }
        }
    }

    fn config(&self) -> Result<Config, String> {
        let header = |flag: &str, name: &str| {
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{flag} {name:?}: not a header name"))
        };
        let mut config = Config::new(self.upstream.clone());
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|error| format!("{flag} {}: {error}", path.display()))
        };
        config.upstream_tls.ca_pem = self
            .upstream_ca
            .as_deref()
            .map(|path| read("--upstream-ca", path))
            .transpose()?;
        if let (Some(cert), Some(key)) = (&self.upstream_cert, &self.upstream_key) {
            config.upstream_tls.identity_pem =
                Some((read("--upstream-cert", cert)?, read("--upstream-key", key)?));
        }
        config.methods = self
            .methods
            .iter()
            .map(|method| {
                http::Method::from_bytes(method.trim().to_ascii_uppercase().as_bytes())
                    .map_err(|_| format!("--methods: {method:?} is not a method"))
            })
            .collect::<Result<_, _>>()?;
        config.require_key = self.require_key;
        config.lease = Duration::from_millis(self.lease_ms);
        config.wait = Duration::from_millis(self.wait_ms);
        config.upstream_timeout = Duration::from_millis(self.upstream_timeout_ms);
        config.fingerprint_headers = self
            .fingerprint_headers
            .iter()
            .map(|name| header("--fingerprint-header", name))
            .collect::<Result<_, _>>()?;
        config.record_headers = self
            .record_headers
            .iter()
            .map(|name| header("--record-header", name))
            .collect::<Result<_, _>>()?;
        config.key_scope = self
            .key_scope
            .as_deref()
            .map(oncekv_proxy::parse_key_scope)
            .transpose()?;
        config.callers = self
            .callers_file
            .as_deref()
            .map(oncekv_proxy::callers::SharedCallers::load)
            .transpose()?
            .map(Arc::new);
        config.callers_certificates = self.callers_ca.is_some();
        config.body_bytes_max = self.body_bytes_max;
        config.header_bytes_max = self.header_bytes_max;
        config.response_bytes_max = self.response_bytes_max;
        config.reply_before_record = self.reply_before_record;
        Ok(config)
    }

    /// Binds the listeners, says where on stdout (`listening on ADDR`,
    /// then `metrics on ADDR`), and serves until asked to stop.
    async fn serve(&self, proxy: Arc<Proxy>, metrics: Arc<Metrics>) -> Result<(), String> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let callers_ca = self.callers_ca.as_ref().map(|path| CallersCa {
                    path: path.clone(),
                    required: self.callers_file.is_none(),
                });
                Some(Arc::new(ListenerTls::load(cert, key, callers_ca)?))
            }
            _ => None,
        };
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|error| format!("cannot listen on {}: {error}", self.listen))?;
        let metrics_listener = match self.metrics_listen {
            None => None,
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|error| format!("cannot serve metrics on {addr}: {error}"))?,
            ),
        };
        let local = listener
            .local_addr()
            .map_err(|error| format!("the listener's address: {error}"))?;
        println!("listening on {local}");
        if let Some(listener) = &metrics_listener
            && let Ok(addr) = listener.local_addr()
        {
            println!("metrics on {addr}");
        }
        eprintln!(
            "oncekv proxy: {}://{local} -> {} (keyed methods: {})",
            if tls.is_some() { "https" } else { "http" },
            proxy.upstream().describe(),
            self.methods.join(",")
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await.map(drop);
        };
        let metrics_server = metrics_listener.map(|listener| {
            tokio::spawn(oncekv_proxy::server::serve_metrics(
                listener,
                metrics.clone(),
                until_stopped(stopped.clone()),
            ))
        });
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|error| format!("cannot listen for SIGHUP: {error}"))?;
        let reloader = tokio::spawn(reload_on_hangup(
            hangups,
            proxy.config().callers.clone(),
            tls.clone(),
            metrics,
        ));
        let proxy_server = tokio::spawn(oncekv_proxy::server::serve(
            listener,
            tls,
            proxy,
            until_stopped(stopped),
        ));
        stop_requested().await;
        reloader.abort();
        let _ = stop.send(true);
        let _ = proxy_server.await;
        if let Some(server) = metrics_server {
            let _ = server.await;
        }
        Ok(())
    }
}

/// On every SIGHUP, reads the listener's certificate and key again (with
/// --tls-cert; and --callers-ca) and the callers file (if the proxy has one): files that
/// read and parse are in force from then on (the certificate from the
/// next handshake, the callers for every request), ones that do not leave
/// the old in force. Either way stderr says which. (Without a handler,
/// SIGHUP — a closed terminal — would end the proxy.)
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    callers: Option<Arc<oncekv_proxy::callers::SharedCallers>>,
    tls: Option<Arc<ListenerTls>>,
    metrics: Arc<Metrics>,
) {
    while hangups.recv().await.is_some() {
        if let Some(tls) = &tls {
            let reloaded = tls.reload();
            metrics.tls_reload(reloaded.is_ok());
            match reloaded {
                Ok(()) if tls.asks_for_certificates() => eprintln!(
                    "oncekv proxy: SIGHUP: reloaded the listener's certificate and key and the callers' CA: in force from the next handshake on"
                ),
                Ok(()) => eprintln!(
                    "oncekv proxy: SIGHUP: reloaded the listener's certificate and key: presented from the next handshake on"
                ),
                Err(error) => eprintln!(
                    "oncekv proxy: SIGHUP: listener TLS (certificate, key, callers' CA) not reloaded, the previous one stays in force: {error}"
                ),
            }
        }
        let Some(callers) = &callers else {
            if tls.is_none() {
                eprintln!("oncekv proxy: SIGHUP: no callers file or certificate to reload");
            }
            continue;
        };
        let reloaded = callers.reload();
        metrics.callers_reload(reloaded.is_ok());
        match reloaded {
            Ok(count) => eprintln!(
                "oncekv proxy: SIGHUP: reloaded {} ({count} callers): every request from now on is checked against it",
                callers.path().display()
            ),
            Err(error) => eprintln!(
                "oncekv proxy: SIGHUP: callers file not reloaded, the previous callers stay in force: {error}"
            ),
        }
    }
}

/// Resolves when the process is asked to stop (SIGTERM or ctrl-c).
async fn stop_requested() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
