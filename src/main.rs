//! The `oncekv` binary: run a node, or talk to a cluster. Arguments are
//! parsed by [`oncekv::cli::Cli`]; this file owns the runtime, tracing and
//! the process's exit.

use oncekv::cli::{Cli, Command};
use oncekv::node;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

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

/// The allocator of the node and the CLI (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse_checked();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Command::Node(options) = cli.command {
        init_tracing();
        let run = || -> anyhow::Result<()> {
            let config = options.resolve()?;
            match config.worker_threads {
                // One thread: tokio's current-thread scheduler. It runs woken
                // tasks in the order they were woken, so when an entry's
                // answers wake a few hundred request tasks, each connection
                // task runs after all of them and writes their responses in
                // one `writev`. The multi-thread scheduler's LIFO slot runs
                // the connection task right after each request task instead:
                // one `writev` per response, 17% of the leader's time at
                // 256 clients (docs/benchmarks.md).
                Some(1) => {
                    runtime = tokio::runtime::Builder::new_current_thread();
                    runtime.enable_all();
                }
                Some(threads) => {
                    runtime.worker_threads(threads);
                }
                None => {}
            }
            runtime
                .build()?
                .block_on(node::run(config, stop_requested()))
        };
        let result = run();
        if let Err(error) = result {
            tracing::debug!(error = ?error, "the node stopped on an error");
            eprintln!("error: {error:#}");
            std::process::exit(1);
        }
        return;
    }
    // The tools' own tracing (the client library's retries, the reasons
    // behind a one-line error), only when asked for: stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        init_tracing();
    }
    let code = match runtime.build() {
        Ok(runtime) => runtime.block_on(oncekv::cli::run(cli.command, cli.common)),
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            1
        }
    };
    std::process::exit(code);
}
