//! `failover-bench`: how long writes stop when the leader of a fresh local
//! 3-node cluster is SIGKILLed, `--kills` times, with a probe writer and
//! optional background load (see `oncekv_jepsen::failover`). Exits 0 when
//! every kill was measured and the counter is consistent, 1 otherwise.

use std::path::PathBuf;

use clap::Parser;
use oncekv_jepsen::TimingArgs;
use oncekv_jepsen::failover::{FailoverOptions, run};

#[derive(Parser, Debug)]
#[command(
    name = "failover-bench",
    about = "Times leader kills of a throwaway local oncekv cluster: kill -> first acknowledged write"
)]
struct Args {
    /// Leader kills.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    kills: u32,
    /// The oncekv binary the nodes run (a release build for figures).
    #[arg(long, default_value = "target/release/oncekv")]
    server_bin: PathBuf,
    #[command(flatten)]
    timing: TimingArgs,
    /// This many more clients (each its own session) write as fast as they
    /// can (closed loop, one 64-byte put at a time each) throughout the run,
    /// so that failover and spurious elections are measured under load. The
    /// kill -> first acknowledged write figure stays the probe's; any
    /// client's first acknowledgement and the load's puts/s between kills
    /// are reported beside it.
    #[arg(long, default_value_t = 0)]
    load_clients: usize,
    /// Keep the cluster's data and node logs (the path is printed on stderr).
    #[arg(long)]
    keep_cluster_dir: bool,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // Progress (kills, restarts, term changes) with RUST_LOG=info.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let options = FailoverOptions {
        server_bin: args.server_bin,
        kills: args.kills,
        timing: args.timing.timing(),
        json: args.json,
        keep_dir: args.keep_cluster_dir,
        load_clients: args.load_clients,
    };
    if let Err(error) = run(&options).await {
        eprintln!("failover-bench: {error:#}");
        std::process::exit(1);
    }
}
