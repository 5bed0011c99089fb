//! `oncekv admin …`: the operator commands over the `Admin` gRPC service —
//! membership, sessions, the registry config, idempotency keys, claims,
//! snapshots, state hashes and local reads. It owns finding the leader (following `NOT_LEADER` hints),
//! composing multi-step operations (`promote`, `replace`, `config set`) from
//! single RPCs, and the presentation; the cluster decides everything else.
//! Endpoints, `--json`, `--timeout-ms` (global flags: before `admin`,
//! after it or after the subcommand), the two-line errors and the exit
//! codes are the key-value commands' (see [`super::output`]).
//!
//! | command | does |
//! | --- | --- |
//! | `members` | the leader's membership: id, voter or learner, addresses |
//! | `add-learner ID PEER_ADDR CLIENT_ADDR` | adds a learner, waits until it caught up |
//! | `promote ID` | makes a member a voter (voters + ID) |
//! | `remove ID` | removes a node (voter or learner) from the membership |
//! | `replace --dead ID --new ID=PEER_ADDR/CLIENT_ADDR` | add-learner, wait, voters − dead + new, remove dead |
//! | `sessions` | every live session (leader's applied state) |
//! | `session ID` | one session |
//! | `expire ID` | ends a session through the log |
//! | `config` | the replicated registry config |
//! | `config set [--session-ttl-ms N] [--window N] …` | changes the given fields, keeps the rest |
//! | `keys list [--after-principal P --after-key K] [--limit N]` | live idempotency keys (leader's applied state; [`keys`]) |
//! | `keys show [--principal P] KEY` | one key's record |
//! | `keys forget [--principal P] KEY` | removes the key's record through the log |
//! | `claims list [--after-principal P --after-key K] [--limit N]` | live claim records (leader's applied state; [`claims`]) |
//! | `claims show [--principal P] KEY` | one claim: held (lease left), released or completed (its result) |
//! | `claims forget [--principal P] KEY` | removes the claim's record through the log: claimable anew, larger fence |
//! | `snapshot --node ADDR` | that node builds a snapshot now |
//! | `hash` | every member's applied index and state hash, and whether they agree |
//! | `local-get KEY --node ADDR` | the key in that node's applied state (no read index) |
//!
//! Retries: the client library's one leader-following policy
//! (`oncekv_client::policy`, through `oncekv_client::admin`): a call is
//! retried at the hinted leader on `NOT_LEADER`, and on another endpoint
//! when a node is unreachable or cannot serve this attempt, until
//! `--timeout-ms`. A change whose outcome is unknown at the deadline exits 3.
//!
//! This module holds the subcommands' parser and dispatch; each group is
//! its own module ([`membership`], [`sessions`], [`config`], [`keys`],
//! [`claims`], [`state`]) with its arguments, its calls and its
//! presentation, on the cluster client of `cluster`.

pub mod claims;
mod cluster;
pub mod config;
pub mod keys;
pub mod membership;
pub mod sessions;
pub mod state;

use super::CommonArgs;
use super::output::{Failure, Success, print_report};
use cluster::Admin;
use config::{ConfigAction, ConfigArgs};
use membership::{AddLearnerArgs, NodeArgs, ReplaceArgs};
use sessions::SessionArgs;
use state::{LocalGetArgs, SnapshotArgs};

/// `oncekv admin SUBCOMMAND`.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// The admin subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AdminCommand {
    /// The membership as the leader sees it: each node's id, whether it
    /// votes, its peer and client addresses.
    Members(OnlyCommon),
    /// Add a node as a learner and wait until it has caught up.
    AddLearner(AddLearnerArgs),
    /// Make a member (a caught-up learner) a voter.
    Promote(NodeArgs),
    /// Remove a node from the membership (a voter or a learner).
    Remove(NodeArgs),
    /// Replace a failed voter: add the new node as a learner, wait until it
    /// caught up, make it a voter in place of the dead one, remove the dead.
    Replace(ReplaceArgs),
    /// List every live session (the leader's applied state).
    Sessions(OnlyCommon),
    /// Show one session: floor, cached responses and bytes, activity.
    Session(SessionArgs),
    /// End a session through the log; its client gets SESSION_EXPIRED.
    Expire(SessionArgs),
    /// Show the replicated registry config; `config set` changes it.
    Config(Box<ConfigArgs>),
    /// Idempotency keys: `keys list`, `keys show KEY`, `keys forget KEY`.
    Keys(keys::KeysArgs),
    /// Claims (`oncekv once`, `Client::once`): `claims list`, `claims show
    /// KEY`, `claims forget KEY`.
    Claims(claims::ClaimsArgs),
    /// Make one node build a snapshot now.
    Snapshot(SnapshotArgs),
    /// Every member's applied index and state hash, and whether they agree.
    Hash(OnlyCommon),
    /// Read KEY from one node's applied state (no read index: may be stale).
    LocalGet(LocalGetArgs),
}

/// A subcommand with no arguments of its own.
#[derive(Debug, Clone, clap::Args)]
pub struct OnlyCommon {}

impl AdminArgs {
    /// Runs the command, prints its result (stdout) or error (stderr), and
    /// returns the process exit code.
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let report = match common.endpoints() {
            Ok(endpoints) => match common.credentials() {
                Ok(credentials) => {
                    let admin = Admin::new(endpoints, common.timeout(), credentials);
                    self.command.execute(admin).await
                }
                Err(error) => Err(Failure::usage(error.to_string())),
            },
            Err(failure) => Err(failure),
        };
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        print_report(&mut stdout.lock(), &mut stderr.lock(), common.json, report)
    }
}

impl AdminCommand {
    async fn execute(&self, mut admin: Admin) -> Result<Success, Failure> {
        match self {
            AdminCommand::Members(_) => membership::members(&admin).await,
            AdminCommand::AddLearner(args) => {
                admin.extend(args.catch_up_timeout_ms);
                membership::add_learner(&admin, args).await
            }
            AdminCommand::Promote(args) => membership::promote(&admin, args.id).await,
            AdminCommand::Remove(args) => membership::remove(&admin, args.id).await,
            AdminCommand::Replace(args) => {
                admin.extend(args.catch_up_timeout_ms);
                membership::replace(&admin, args).await
            }
            AdminCommand::Sessions(_) => sessions::sessions(&admin).await,
            AdminCommand::Session(args) => sessions::session(&admin, args.client_id).await,
            AdminCommand::Expire(args) => sessions::expire(&admin, args.client_id).await,
            AdminCommand::Config(args) => match &args.action {
                None => config::show(&admin).await,
                Some(ConfigAction::Set(set)) => config::set(&admin, set).await,
            },
            AdminCommand::Keys(args) => args.action.execute(&admin).await,
            AdminCommand::Claims(args) => args.action.execute(&admin).await,
            AdminCommand::Snapshot(args) => state::snapshot(&admin, &args.node).await,
            AdminCommand::Hash(_) => state::hash(&admin).await,
            AdminCommand::LocalGet(args) => state::local_get(&admin, &args.key, &args.node).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};

    /// `oncekv admin ARGS…`, as the binary parses it.
    fn parse(args: &[&str]) -> Result<AdminCommand, clap::Error> {
        parse_with_common(args).map(|(command, _)| command)
    }

    fn parse_with_common(args: &[&str]) -> Result<(AdminCommand, CommonArgs), clap::Error> {
        let args = ["oncekv", "admin"].into_iter().chain(args.iter().copied());
        let cli = Cli::try_parse_checked(args)?;
        match cli.command {
            Command::Admin(admin) => Ok((admin.command, cli.common)),
            other => panic!("not an admin command: {other:?}"),
        }
    }

    /// The subcommands parse as documented; `config set` takes any subset.
    #[test]
    fn subcommands_parse() {
        assert!(matches!(
            parse(&["add-learner", "4", "127.0.0.1:7204", "127.0.0.1:7104"]),
            Ok(AdminCommand::AddLearner(args)) if args.id == 4 && args.client_addr == "127.0.0.1:7104"
        ));
        assert!(matches!(
            parse(&["replace", "--dead", "3", "--new", "4=127.0.0.1:7204/127.0.0.1:7104"]),
            Ok(AdminCommand::Replace(args)) if args.dead == 3
        ));
        let Ok(AdminCommand::Config(config)) = parse(&["config", "set", "--window", "8"]) else {
            panic!("config set parses");
        };
        let Some(ConfigAction::Set(set)) = config.action else {
            panic!("a set action");
        };
        assert_eq!((set.window, set.session_ttl_ms), (Some(8), None));
        assert!(matches!(parse(&["config"]), Ok(AdminCommand::Config(c)) if c.action.is_none()));
        assert!(parse(&["snapshot"]).is_err(), "--node is required");
        assert!(matches!(
            parse_with_common(&["local-get", "k", "--node", "127.0.0.1:7101", "--json"]),
            Ok((AdminCommand::LocalGet(args), common)) if common.json && args.key == "k"
        ));
    }

    /// The common flags mean the same before `admin`, between `admin` and
    /// its subcommand, and after it, for every admin subcommand (`config
    /// set` one level deeper included).
    #[test]
    fn common_flags_go_anywhere() {
        let expected = CommonArgs {
            endpoints: vec!["a:1".into()],
            json: true,
            timeout_ms: Some(700),
            ..CommonArgs::default()
        };
        let flags = ["--json", "--endpoints", "a:1", "--timeout-ms", "700"];
        for command in [
            &["members"][..],
            &["add-learner", "4", "127.0.0.1:7204", "127.0.0.1:7104"],
            &["promote", "4"],
            &["remove", "4"],
            &["replace", "--dead", "3", "--new", "4=p:1/c:1"],
            &["sessions"],
            &["session", "5"],
            &["expire", "5"],
            &["config"],
            &["config", "set", "--window", "8"],
            &["keys", "list"],
            &[
                "keys",
                "list",
                "--after-principal",
                "p",
                "--after-key",
                "k",
                "--limit",
                "3",
            ],
            &["keys", "show", "--principal", "p", "k"],
            &["keys", "forget", "k"],
            &["claims", "list"],
            &["claims", "show", "--principal", "p", "k"],
            &["claims", "forget", "k"],
            &["snapshot", "--node", "n:1"],
            &["hash"],
            &["local-get", "k", "--node", "n:1"],
        ] {
            let before: Vec<&str> = ["oncekv"]
                .iter()
                .chain(&flags)
                .chain(&["admin"])
                .chain(command)
                .copied()
                .collect();
            let middle: Vec<&str> = ["oncekv", "admin"]
                .iter()
                .chain(&flags)
                .chain(command)
                .copied()
                .collect();
            let after: Vec<&str> = ["oncekv", "admin"]
                .iter()
                .chain(command)
                .chain(&flags)
                .copied()
                .collect();
            for args in [before, middle, after] {
                let cli = Cli::try_parse_checked(&args)
                    .unwrap_or_else(|error| panic!("{args:?}: {error}"));
                assert!(matches!(cli.command, Command::Admin(_)), "{args:?}");
                assert_eq!(cli.common, expected, "{args:?}");
            }
        }
    }
}
