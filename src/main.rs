//! The `oncekv` binary: run a node, or talk to a cluster.

use clap::{Parser, Subcommand};
use oncekv::node::{self, config::NodeOptions};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "oncekv",
    version,
    about = "Exactly-once key-value service on Raft",
    after_help = oncekv::cli::kv::EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one node of a cluster.
    Node(Box<NodeOptions>),
    /// Show every node's id, role, term and log / applied indexes.
    Status(oncekv::cli::status::StatusArgs),
    /// Ask one node's gRPC health service: exit 0 when SERVING, 1 otherwise.
    Health(oncekv::cli::health::HealthArgs),
    /// Closed-loop load against a running cluster: throughput and latency;
    /// or, with --failover, leader kills on a fresh local cluster of its own.
    Bench(oncekv::cli::bench::BenchArgs),
    /// Operator commands: membership, sessions, registry config, snapshots,
    /// state hashes, local reads.
    Admin(oncekv::cli::admin::AdminArgs),
    /// The key-value commands: put, get, del, incr, append, cas, sessions.
    #[command(flatten)]
    Kv(oncekv::cli::kv::KvCommand),
}

/// Resolves when the process is asked to stop (SIGTERM or ctrl-c).
async fn stop_requested() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,sled=warn,h2=warn,tower=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Command::Node(options) = cli.command {
        init_tracing();
        let config = options.resolve()?;
        if let Some(threads) = config.worker_threads {
            runtime.worker_threads(threads);
        }
        return runtime
            .build()?
            .block_on(node::run(config, stop_requested()));
    }
    runtime.build()?.block_on(run_tool(cli.command))
}

/// Every subcommand but `node`.
async fn run_tool(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Node(_) => unreachable!("handled in main"),
        Command::Bench(args) => {
            // Progress events (and the client library's tracing), only when
            // asked for (stderr): `--failover` logs its kills, for reading
            // side by side with the node logs.
            if std::env::var_os("RUST_LOG").is_some() {
                init_tracing();
            }
            args.run().await
        }
        Command::Status(args) => {
            if !args.run().await? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Admin(args) => std::process::exit(args.run().await),
        Command::Health(args) => std::process::exit(if args.run().await { 0 } else { 1 }),
        Command::Kv(command) => {
            // The client library's tracing, only when asked for (stderr).
            if std::env::var_os("RUST_LOG").is_some() {
                init_tracing();
            }
            std::process::exit(command.run().await);
        }
    }
}
