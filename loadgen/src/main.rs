//! `loadgen`: the project's closed-loop gRPC load generator, the one
//! `scripts/bench-vs-etcd.sh` drives a local etcd and a local oncekv with, so
//! that both are measured by the same code in the same run.
//!
//! It owns: talking to each system's wire API directly (etcd's `KV.Put` and
//! `KV.Txn`, oncekv's `Client.Register`/`Execute`/`ExecutePlain`/
//! `ExecuteKeyed`/`Claim`/`CompleteClaim`, and each one's `Status` to find the leader), the closed
//! loop (every client sends one operation at a time over HTTP/2 connections
//! shared round-robin; an operation is one request, or in the claim modes
//! one claim → complete cycle of two), the clock and the one-line report
//! (operations per second, p50/p99/p999 of whole operations, errors).
//!
//! Against an oncekv cluster with TLS and authentication (`scripts/cluster.sh
//! start --tls`), `--ca` (and `--token`, or `--cert`/`--key`) make every
//! connection TLS with that CA and every call carry those credentials, the
//! same way the client library does (`oncekv_client::credentials`).
//!
//! It must not: send anything to an address that is not loopback (every
//! endpoint is checked when the arguments are parsed); retry a request (a
//! failed or timed-out request counts as an error and the client goes on with
//! its next one, so both systems are measured alike); use oncekv's client
//! library (its retries and leader discovery would measure something etcd's
//! side does not have); run unbounded (every call has a timeout and the run a
//! duration).

mod load;
mod proto;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use oncekv_client::credentials::{AuthChannel, CredentialPaths, Credentials};
use tokio::time::{Instant, sleep};

use load::{LoadOptions, Target};

/// Deadline of a connection attempt and of one leader-discovery `Status`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const LEADER_POLL: Duration = Duration::from_millis(100);

#[derive(Parser, Debug)]
#[command(
    name = "loadgen",
    about = "Closed-loop gRPC load against a local etcd or a local oncekv"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// etcd `KV.Put` of 64-byte values (send it to the leader).
    EtcdPut(LoadArgs),
    /// oncekv `Client.Execute` of puts: one registered session per client,
    /// seq + 1 each request, the first outstanding seq = seq.
    OncekvExec(LoadArgs),
    /// oncekv `Client.ExecutePlain` of puts (no session, at-least-once).
    OncekvPlain(LoadArgs),
    /// oncekv `Client.ExecuteKeyed` of puts, a new idempotency key per
    /// request (each one a new record of the registry), the puts cycling
    /// over each client's own keys like the other modes.
    OncekvKeyed(LoadArgs),
    /// etcd's deduplication record, one new key per request: a `KV.Txn`
    /// putting the value only if the key was never created
    /// (create_revision == 0) — the etcd side of `oncekv-keyed`.
    EtcdOnce(LoadArgs),
    /// The reserve → record cycle on etcd, one new key per cycle: a `KV.Txn`
    /// putting "in progress" only if the key was never created
    /// (create_revision == 0), then a `KV.Put` of the result (the value).
    /// One operation = one cycle.
    EtcdClaim(LoadArgs),
    /// The claim → complete cycle on oncekv, one new key per cycle: a
    /// `Client.Claim` that must win (fence), then a `Client.CompleteClaim`
    /// of that fence with the result (the value). One operation = one cycle.
    OncekvClaim(LoadArgs),
    /// Print the etcd leader's client address once every member that answers
    /// agrees on it.
    EtcdLeader(LeaderArgs),
    /// Print the oncekv leader's client address once every node that answers
    /// agrees on it.
    OncekvLeader(LeaderArgs),
}

#[derive(Args, Debug)]
struct LoadArgs {
    /// The node every request goes to (host:port on loopback).
    #[arg(long, value_parser = loopback)]
    endpoint: SocketAddr,
    /// Concurrent clients, each with one request in flight.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    clients: u32,
    /// Seconds of measured load.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    duration_s: u64,
    /// HTTP/2 connections, shared round-robin by the clients.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1_024))]
    connections: u32,
    /// Bytes per value (the result, in the claim modes).
    #[arg(long, default_value_t = 64)]
    value_bytes: usize,
    /// Deadline of one operation; one past it counts as an error.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    request_timeout_s: u64,
    /// Stop after this many operations in all (answered or failed), or at
    /// --duration-s, whichever comes first: a fixed amount of load, such as
    /// N new idempotency keys (scripts/bench-state.sh).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    total_ops: Option<u64>,
    #[command(flatten)]
    credentials: CredentialArgs,
}

/// TLS and credentials (an oncekv cluster with TLS and authentication);
/// none: plain connections.
#[derive(Args, Debug, Default)]
struct CredentialArgs {
    /// The cluster CA (PEM): connect with TLS and trust only this CA.
    #[arg(long, value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for mutual TLS, with --key.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// A bearer token sent with every call (needs --ca: tokens only travel
    /// over TLS here).
    #[arg(long, value_name = "TOKEN", requires = "ca")]
    token: Option<String>,
}

impl CredentialArgs {
    fn load(&self) -> anyhow::Result<Credentials> {
        Credentials::load(&CredentialPaths {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            token: self.token.clone(),
        })
        .context("loading --ca / --cert / --key / --token")
    }
}

#[derive(Args, Debug)]
struct LeaderArgs {
    /// The members' client endpoints (host:port on loopback, comma-separated).
    #[arg(long, value_delimiter = ',', required = true, value_parser = loopback)]
    endpoints: Vec<SocketAddr>,
    /// Seconds to wait for an agreed leader before failing.
    #[arg(long, default_value_t = 30)]
    wait_s: u64,
    /// The cluster CA (PEM): connect with TLS (`Status` needs no token).
    #[arg(long, value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
}

/// Parses `host:port` and refuses anything but a loopback address.
fn loopback(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim_start_matches("http://");
    let addr: SocketAddr = text
        .parse()
        .map_err(|error| format!("{text}: not an IP:port ({error})"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("{addr}: loadgen only talks to loopback addresses"));
    }
    Ok(addr)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().mode {
        Mode::EtcdPut(args) => load(Target::EtcdPut, &args).await,
        Mode::OncekvExec(args) => load(Target::OncekvExec, &args).await,
        Mode::OncekvPlain(args) => load(Target::OncekvPlain, &args).await,
        Mode::OncekvKeyed(args) => load(Target::OncekvKeyed, &args).await,
        Mode::EtcdOnce(args) => load(Target::EtcdOnce, &args).await,
        Mode::EtcdClaim(args) => load(Target::EtcdClaim, &args).await,
        Mode::OncekvClaim(args) => load(Target::OncekvClaim, &args).await,
        Mode::EtcdLeader(args) => print_leader(&args, etcd_view).await,
        Mode::OncekvLeader(args) => print_leader(&args, oncekv_view).await,
    }
}

async fn load(target: Target, args: &LoadArgs) -> anyhow::Result<()> {
    let options = LoadOptions {
        target,
        clients: args.clients as usize,
        duration: Duration::from_secs(args.duration_s),
        value_bytes: args.value_bytes,
        request_timeout: Duration::from_secs(args.request_timeout_s),
        total_ops: args.total_ops,
    };
    let credentials = args.credentials.load()?;
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(args.endpoint, &credentials).await?);
    }
    let report = load::run(&options, &channels).await?;
    println!("{report}");
    Ok(())
}

/// One HTTP/2 connection (each `connect` opens its own): TLS with the
/// credentials' CA when they have one, every call carrying their token.
pub(crate) async fn connect(
    addr: SocketAddr,
    credentials: &Credentials,
) -> anyhow::Result<AuthChannel> {
    let channel = credentials
        .endpoint(&addr.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .with_context(|| format!("connect to {addr}"))?;
    Ok(credentials.wrap(channel))
}

/// What one member says about itself and the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct View {
    addr: SocketAddr,
    member: u64,
    /// The leader this member knows (0: none).
    leader: u64,
}

/// Polls every endpoint until the members that answer are a majority, all
/// name the same leader, and the leader is one of them; prints its address.
async fn print_leader<F, Fut>(args: &LeaderArgs, view: F) -> anyhow::Result<()>
where
    F: Fn(SocketAddr, Credentials) -> Fut,
    Fut: Future<Output = anyhow::Result<View>>,
{
    let credentials = CredentialArgs {
        ca: args.ca.clone(),
        ..CredentialArgs::default()
    }
    .load()?;
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    let mut last = String::from("no member answered");
    loop {
        let mut views = Vec::new();
        for &addr in &args.endpoints {
            match tokio::time::timeout(CONNECT_TIMEOUT, view(addr, credentials.clone())).await {
                Ok(Ok(seen)) => views.push(seen),
                Ok(Err(error)) => last = format!("{addr}: {error:#}"),
                Err(_) => last = format!("{addr}: no Status answer within {CONNECT_TIMEOUT:?}"),
            }
        }
        if let Some(leader) = agreed_leader(&views, args.endpoints.len()) {
            println!("{}", leader.addr);
            return Ok(());
        }
        if !views.is_empty() {
            last = format!("{views:?}");
        }
        if Instant::now() >= deadline {
            bail!(
                "no agreed leader within {} s; last seen: {last}",
                args.wait_s
            );
        }
        sleep(LEADER_POLL).await;
    }
}

/// The leader every answering member names, if a majority answered and the
/// leader is among them.
fn agreed_leader(views: &[View], members: usize) -> Option<View> {
    let first = views.first()?;
    let agreed = views.len() > members / 2
        && first.leader != 0
        && views.iter().all(|view| view.leader == first.leader);
    agreed
        .then(|| views.iter().find(|view| view.member == first.leader))
        .flatten()
        .copied()
}

async fn etcd_view(addr: SocketAddr, credentials: Credentials) -> anyhow::Result<View> {
    use proto::etcd::{StatusRequest, maintenance_client::MaintenanceClient};
    let reply = MaintenanceClient::new(connect(addr, &credentials).await?)
        .status(StatusRequest {})
        .await?
        .into_inner();
    let member = reply
        .header
        .context("etcd Status without a header")?
        .member_id;
    Ok(View {
        addr,
        member,
        leader: reply.leader,
    })
}

async fn oncekv_view(addr: SocketAddr, credentials: Credentials) -> anyhow::Result<View> {
    use proto::oncekv::{StatusRequest, client_client::ClientClient};
    let reply = ClientClient::new(connect(addr, &credentials).await?)
        .status(StatusRequest {})
        .await?
        .into_inner();
    Ok(View {
        addr,
        member: reply.node_id,
        leader: reply.leader_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(port: u16, member: u64, leader: u64) -> View {
        View {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            member,
            leader,
        }
    }

    /// A leader counts only when a majority answers, all name it, and it
    /// answered itself.
    #[test]
    fn leader_needs_agreement() {
        let all = [view(1, 1, 2), view(2, 2, 2), view(3, 3, 2)];
        assert_eq!(agreed_leader(&all, 3), Some(all[1]));
        assert_eq!(agreed_leader(&all[..2], 3), Some(all[1]));
        assert_eq!(agreed_leader(&all[1..2], 3), None, "a minority");
        assert_eq!(agreed_leader(&[all[0], all[2]], 3), None, "leader silent");
        assert_eq!(agreed_leader(&[all[0], view(2, 2, 3)], 3), None);
        assert_eq!(agreed_leader(&[view(1, 1, 0), view(2, 2, 0)], 3), None);
    }

    /// Only loopback endpoints are accepted.
    #[test]
    fn endpoints_must_be_loopback() {
        assert!(loopback("127.0.0.1:2379").is_ok());
        assert!(loopback("http://127.0.0.1:2379").is_ok());
        assert!(loopback("[::1]:2379").is_ok());
        assert!(loopback("10.0.0.1:2379").is_err());
        assert!(loopback("localhost:2379").is_err());
    }
}
