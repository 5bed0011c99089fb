//! `jepsen-like`: runs one seeded fault-injection run against a fresh
//! 3-node oncekv cluster (local processes, or containers with
//! `--containers`; TLS and authentication on with `--tls`) and exits 0 (valid), 1 (invalid) or 2 (unknown:
//! the run did not exercise enough; also for a run that could not finish).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use oncekv_jepsen::TimingArgs;
use oncekv_jepsen::run::{RunOptions, run_to_exit_code};

#[derive(Parser, Debug)]
#[command(
    name = "jepsen-like",
    about = "Fault-injection run against a throwaway oncekv cluster"
)]
struct Args {
    /// Seeds the fault schedule and the operation streams.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds of workload (the schedule may stretch it a little).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Leader kills to plan [default: one per 12 s of duration, at least 1].
    #[arg(long)]
    leader_kills: Option<u32>,
    /// Clients appending unique values to the hot lists.
    #[arg(long, default_value_t = 4)]
    appenders: u64,
    /// Clients incrementing the shared counters.
    #[arg(long, default_value_t = 2)]
    incrementers: u64,
    /// Clients reading the hot lists and the counters (linearizable `get`).
    #[arg(long, default_value_t = 2)]
    readers: u64,
    /// Producers of keyed calls: `execute_with_key` with no session, each
    /// idempotency key retried until its outcome is known, some repeated
    /// on purpose and some reused with another command (0: none).
    #[arg(long, default_value_t = 2)]
    keyed_producers: u64,
    /// Workers of the claims workload (rule 20): they claim a few
    /// contended jobs, perform each job's effect on a fenced sink and
    /// complete it, some killed or paused mid-effect (0: none).
    #[arg(long, default_value_t = 4)]
    claim_workers: u64,
    /// The lease every claim of the claims workload asks for, in
    /// milliseconds.
    #[arg(long, default_value_t = 1_000)]
    claim_lease_ms: u64,
    /// The oncekv binary to run (a release build, with the
    /// `fault-injection` feature for lost replies).
    #[arg(long, default_value = "target/release/oncekv")]
    server_bin: PathBuf,
    /// Where the history, results and report go [default: target/jepsen/seed-N].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the cluster's data directories and logs.
    #[arg(long)]
    keep_cluster_dir: bool,
    #[command(flatten)]
    timing: TimingArgs,
    /// Small, so that restarts load snapshots and lagging nodes install them.
    #[arg(long, default_value_t = 200)]
    snapshot_every_entries: u64,
    #[arg(long, default_value_t = 50)]
    logs_kept_after_snapshot: u64,
    /// The registry's session TTL at initialisation.
    #[arg(long, default_value_t = 10_000)]
    session_ttl_ms: u64,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Run the three nodes as containers of `--image` on a private network
    /// of their own, with real faults: `docker kill` / `docker start`,
    /// `docker pause` / `unpause`, and partitions by packet filters in the
    /// nodes' network namespaces (`nsenter` + `iptables`; needs root).
    /// `--server-bin` is then unused.
    #[arg(long)]
    containers: bool,
    /// The image of `--containers` (built by `scripts/image.sh`).
    #[arg(long, default_value = "oncekv:latest", requires = "containers")]
    image: String,
    /// Run the cluster with TLS on the client and peer ports (mutual
    /// between peers) and authentication on the client port: the harness
    /// makes a CA, node certificates and a client and an admin identity
    /// with `--server-bin certs`; the workload clients show the client
    /// principal's token or certificate, the Admin calls the admin's token.
    #[arg(long, conflicts_with = "containers")]
    tls: bool,
    /// Run nothing: check the saved run in this directory (its
    /// history.jsonl and results.json) again with this build's checker,
    /// print what it finds, and exit with the verdict's code.
    #[arg(long, value_name = "DIR")]
    recheck: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Some(dir) = &args.recheck {
        match oncekv_jepsen::run::recheck(dir) {
            Ok(verdict) => std::process::exit(verdict.exit_code()),
            Err(error) => {
                eprintln!("jepsen-like: recheck {}: {error:#}", dir.display());
                std::process::exit(2);
            }
        }
    }
    let options = RunOptions {
        seed: args.seed,
        duration: Duration::from_secs(args.duration),
        leader_kills: args
            .leader_kills
            .unwrap_or_else(|| (args.duration / 12).max(1) as u32),
        appenders: args.appenders,
        incrementers: args.incrementers,
        readers: args.readers,
        keyed_producers: args.keyed_producers,
        claim_workers: args.claim_workers,
        claim_lease: Duration::from_millis(args.claim_lease_ms),
        server_bin: args.server_bin,
        out_dir: args
            .out
            .unwrap_or_else(|| PathBuf::from(format!("target/jepsen/seed-{}", args.seed))),
        keep_cluster_dir: args.keep_cluster_dir,
        timing: args.timing.timing(),
        snapshot_every_entries: args.snapshot_every_entries,
        logs_kept_after_snapshot: args.logs_kept_after_snapshot,
        session_ttl_ms: args.session_ttl_ms,
        quiet: args.quiet,
        container_image: args.containers.then_some(args.image),
        tls: args.tls,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("jepsen-like: cannot start the runtime: {error}");
            std::process::exit(2);
        }
    };
    // SIGINT, SIGTERM and SIGHUP (a closed terminal) drop the run, whose
    // cluster kills and reaps its nodes (the nodes also die with this
    // process on Linux, whatever ends it: see oncekv_testkit::local).
    let code = runtime.block_on(run_to_exit_code(&options));
    drop(runtime);
    std::process::exit(code);
}
