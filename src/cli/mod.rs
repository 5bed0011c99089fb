//! The `oncekv` command line for people: [`Cli`] is the whole binary's
//! argument parser (`main.rs` parses, runs `oncekv node` itself and hands
//! every other command to [`run`]). Each command has its module (`kv/`
//! for the key-value verbs, `once/` for running a command at most once
//! under a claim, `admin/` with a file per group, `status`, `health`,
//! `bench`, `certs`, `proxy` for the Idempotency-Key HTTP proxy) holding
//! its arguments and its talking to the cluster; what
//! they print and how they exit is one library (`output`, `values`), and
//! why a cluster cannot be reached is `reach`. The flags every cluster command shares ([`CommonArgs`]: endpoints,
//! `--json`, `--timeout-ms`) are global: they go before or after the
//! subcommand. Errors are one line of what happened and one of what to do
//! ([`reach`]); details go to tracing (`RUST_LOG=debug`). Nothing here
//! decides anything about the cluster.

use crate::node::config::NodeOptions;

pub mod admin;
pub mod bench;
pub mod certs;
mod common;
pub mod health;
pub mod kv;
pub mod once;
pub mod output;
pub mod proxy;
pub mod reach;
pub mod status;
mod values;

/// The `oncekv` binary's arguments.
#[derive(Debug, clap::Parser)]
#[command(
    name = "oncekv",
    version,
    about = "Exactly-once key-value service on Raft",
    after_help = output::EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run one node of a cluster (takes none of --endpoints, --json,
    /// --timeout-ms).
    Node(Box<NodeOptions>),
    /// Show every node's id, role, term and log / applied indexes
    /// (--timeout-ms: per node, default 2000).
    Status,
    /// Ask each node's gRPC health service (--endpoint: one node; else
    /// every endpoint): exit 0 when every one is SERVING, 1 otherwise
    /// (--timeout-ms: per node, default 2000).
    Health(health::HealthArgs),
    /// Closed-loop load against a running cluster: throughput and latency
    /// (--timeout-ms: per request, default 30000). Leader-kill timings are
    /// the harness's `failover-bench` (docs/benchmarks.md).
    Bench(bench::BenchArgs),
    /// Operator commands: membership, sessions, registry config,
    /// idempotency keys, claims, snapshots, state hashes, local reads.
    Admin(admin::AdminArgs),
    /// Make a local CA, node certificates and client identities with
    /// tokens, for a cluster with TLS and authentication (docs/security.md).
    Certs(certs::CertsArgs),
    /// Run a command at most once across every machine that asks: KEY is
    /// claimed, the command runs with ONCEKV_FENCE, ONCEKV_ATTEMPT and
    /// ONCEKV_CLAIM_KEY in its environment, and its exit code and stdout
    /// are recorded; a later run with KEY replays them (--timeout-ms: the
    /// wait for another holder, default 10000).
    #[command(after_help = output::ONCE_EXIT_CODES_HELP)]
    Once(once::OnceArgs),
    /// The Idempotency-Key HTTP proxy: forwards every request to
    /// --upstream; a keyed request on a guarded method is claimed first,
    /// forwarded once and its final answer replayed to every retry
    /// (docs/proxy.md; --timeout-ms: each cluster call, default 10000).
    Proxy(Box<proxy::ProxyArgs>),
    /// The guard `once` runs its command under (internal).
    #[command(name = "once-guard", hide = true)]
    OnceGuard(once::guard::GuardArgs),
    /// The key-value commands: put, get, del, incr, append, cas, sessions.
    #[command(flatten)]
    Kv(kv::KvCommand),
}

/// The flags every command that talks to a cluster takes, before or after
/// its subcommand (`oncekv --json incr c` and `oncekv incr c --json` alike).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct CommonArgs {
    /// Client endpoints, as host:port, comma-separated or repeated [default:
    /// the local cluster of scripts/cluster.sh, 127.0.0.1 ports
    /// ONCEKV_PORT_BASE+1..=+3]
    #[arg(long, global = true, value_delimiter = ',', value_name = "HOST:PORT")]
    pub endpoints: Vec<String>,
    /// Print JSON on stdout instead of plain text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Deadline in milliseconds, retries included [default: 10000; status
    /// and health: 2000 per node; bench: 30000 per request; once: how long
    /// to wait for another holder]
    #[arg(
        long,
        global = true,
        value_name = "MS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub timeout_ms: Option<u64>,
    /// The cluster CA (PEM): talk TLS to the nodes [env: ONCEKV_CA].
    #[arg(long = "ca", id = "client_ca", global = true, value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mutual TLS [env: ONCEKV_CERT].
    #[arg(long = "cert", id = "client_cert", global = true, value_name = "FILE")]
    pub cert: Option<std::path::PathBuf>,
    /// Key of --cert (PEM) [env: ONCEKV_KEY].
    #[arg(long = "key", id = "client_key", global = true, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,
    /// Bearer token from the nodes' token file [env: ONCEKV_TOKEN].
    #[arg(
        long = "token",
        id = "client_token",
        global = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

impl CommonArgs {
    /// The credentials of `--ca/--cert/--key/--token`, each else its
    /// `ONCEKV_*` environment variable. (Read here rather than by clap, so
    /// that `oncekv node`, which refuses client flags, ignores them.)
    pub fn credentials(
        &self,
    ) -> Result<oncekv_client::credentials::Credentials, oncekv_client::credentials::CredentialsError>
    {
        use oncekv_client::credentials::{CredentialPaths, Credentials};
        let flags = CredentialPaths {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            token: self.token.clone(),
        };
        Credentials::load(&flags.or(CredentialPaths::from_env()))
    }

    /// `--timeout-ms`, or `default_ms`.
    pub fn timeout_or(&self, default_ms: u64) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms.unwrap_or(default_ms))
    }
}

impl Cli {
    /// Parses the process's arguments; on a usage error prints it and exits
    /// with 2 (clap's code), as [`Cli::try_parse_checked`] explains.
    pub fn parse_checked() -> Cli {
        Cli::try_parse_checked(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }

    /// Parses `args` (the program name first), refusing the common flags
    /// for `node`, which talks to no cluster as a client.
    pub fn try_parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, Parser};
        let mut cli = Cli::try_parse_from(args)?;
        let conflict = |message: &str| {
            Err(Cli::command().error(clap::error::ErrorKind::ArgumentConflict, message))
        };
        // `oncekv once --key KEY -- COMMAND`: with no positional KEY, the
        // global `--key` names the claim (a TLS client key then comes from
        // ONCEKV_KEY only).
        if let Command::Once(once) = &mut cli.command {
            once.key = match (once.key_arg.take(), cli.common.key.take()) {
                (Some(key), tls_key) => {
                    cli.common.key = tls_key;
                    key
                }
                (None, Some(key)) => key.to_string_lossy().into_owned(),
                (None, None) => {
                    return Err(Cli::command().error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "`oncekv once` needs a KEY: `oncekv once KEY -- COMMAND` or \
                         `oncekv once --key KEY -- COMMAND`",
                    ));
                }
            };
        }
        match &cli.command {
            Command::Node(_) if cli.common != CommonArgs::default() => {
                conflict("`oncekv node` takes none of --endpoints, --json, --timeout-ms")
            }
            _ => Ok(cli),
        }
    }
}

/// Runs every command but `node`; returns the process's exit code. A
/// command's error is printed here, on stderr, on one line (`bench` and
/// `status`; the key-value and admin commands print their own, see
/// [`output`]).
pub async fn run(command: Command, common: CommonArgs) -> i32 {
    // What the command line gives is what every helper shows the nodes
    // (a bad setting is reported by the command that uses it).
    if let Ok(credentials) = common.credentials() {
        oncekv_client::credentials::Credentials::set_process_default(credentials);
    }
    match command {
        Command::Node(_) => {
            eprintln!("error: `oncekv node` runs in main");
            output::EXIT_USAGE
        }
        Command::Status => status::run(&common).await,
        Command::Health(args) => args.run(&common).await,
        Command::Bench(args) => match args.run(&common).await {
            Ok(()) => output::EXIT_OK,
            Err(error) => {
                tracing::debug!(error = ?error, "bench failed");
                eprintln!("error: {error:#}");
                output::EXIT_FAILED
            }
        },
        Command::Admin(args) => args.run(&common).await,
        Command::Certs(args) => match args.run() {
            Ok(()) => output::EXIT_OK,
            Err(error) => {
                eprintln!("error: {error:#}");
                output::EXIT_FAILED
            }
        },
        Command::Once(args) => args.run(&common).await,
        Command::OnceGuard(args) => once::guard::run(&args).await,
        Command::Proxy(args) => args.run(&common).await,
        Command::Kv(command) => command.run(&common).await,
    }
}

/// Client port base of the local cluster when `ONCEKV_PORT_BASE` is unset:
/// node N serves clients on base + N (as `scripts/cluster.sh` does).
pub const DEFAULT_PORT_BASE: u16 = 7100;

/// The client endpoints of the local 3-node cluster that `scripts/cluster.sh`
/// starts: `127.0.0.1:{base+1}`, `{base+2}`, `{base+3}`, where base is
/// `ONCEKV_PORT_BASE` (default 7100). An unusable value (not a number, or too
/// large for three ports above it) falls back to the default with a warning on
/// stderr, so a typo is visible rather than silently pointing elsewhere.
pub fn default_endpoints() -> Vec<String> {
    let base = match std::env::var("ONCEKV_PORT_BASE") {
        Err(_) => DEFAULT_PORT_BASE,
        Ok(text) => match parse_port_base(&text) {
            Some(base) => base,
            None => {
                eprintln!(
                    "warning: ignoring ONCEKV_PORT_BASE={text:?} (want a port number \
                     below 65533); using {DEFAULT_PORT_BASE}"
                );
                DEFAULT_PORT_BASE
            }
        },
    };
    endpoints_for_base(base)
}

/// `127.0.0.1:{base+1}` to `127.0.0.1:{base+3}`; `base` must be below 65533.
pub fn endpoints_for_base(base: u16) -> Vec<String> {
    (1..=3u16)
        .map(|node| format!("127.0.0.1:{}", base + node))
        .collect()
}

fn parse_port_base(text: &str) -> Option<u16> {
    text.trim()
        .parse::<u16>()
        .ok()
        .filter(|base| base.checked_add(3).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The endpoints are the three client ports above the base.
    #[test]
    fn endpoints_are_the_three_ports_above_the_base() {
        assert_eq!(
            endpoints_for_base(7100),
            ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]
        );
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_checked(std::iter::once("oncekv").chain(args.iter().copied()))
    }

    /// `status` and `bench` take the common flags on either side too; `node`
    /// refuses them, wherever given (exit 2).
    #[test]
    fn common_flags_per_command() {
        for args in [
            &["--json", "--timeout-ms", "5", "status"][..],
            &["status", "--json", "--timeout-ms", "5"],
        ] {
            let cli = parse(args).unwrap();
            assert!(matches!(cli.command, Command::Status), "{args:?}");
            assert!(
                cli.common.json && cli.common.timeout_ms == Some(5),
                "{args:?}"
            );
        }
        for args in [
            &["--endpoints", "h:1", "bench", "--clients", "2"][..],
            &["bench", "--endpoints", "h:1", "--clients", "2"],
        ] {
            let cli = parse(args).unwrap();
            assert!(matches!(cli.command, Command::Bench(_)), "{args:?}");
            assert_eq!(cli.common.endpoints, ["h:1"], "{args:?}");
        }
        for bad in [
            &["--json", "node", "--id", "1"][..],
            &["node", "--id", "1", "--endpoints", "h:1"],
            &["--endpoints", "h:1", "node", "--id", "1"],
        ] {
            let error = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
    }

    /// A base that is not a port, or leaves no room for three ports, is refused.
    #[test]
    fn unusable_port_bases_are_refused() {
        assert_eq!(parse_port_base(" 9000 "), Some(9000));
        assert_eq!(parse_port_base("65532"), Some(65532));
        assert_eq!(parse_port_base("65533"), None);
        assert_eq!(parse_port_base("-1"), None);
        assert_eq!(parse_port_base("x"), None);
    }
}
