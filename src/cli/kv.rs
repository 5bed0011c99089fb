//! `oncekv put | get | del | incr | append | cas | sessions`: the key-value
//! commands for people and scripts. Each command (but `sessions`) makes one
//! [`Client`], runs one call through it — exactly once, with the library's
//! retries until the `--timeout-ms` deadline — and closes the client, which
//! unregisters its session, so CLI calls leave no sessions behind.
//! `sessions` only asks every node for its `Status`.
//!
//! # Commands
//!
//! | command | prints (plain) |
//! | --- | --- |
//! | `put KEY VALUE [--int \| --list]` | `OK` |
//! | `get KEY` | the value; nothing (and exit 1) when the key is absent |
//! | `del KEY` | `deleted`, or `absent` when there was nothing to delete |
//! | `incr KEY [DELTA]` | the new value (DELTA defaults to 1) |
//! | `append KEY ELEMENT` | the list's new length |
//! | `cas KEY NEW (--expected VALUE \| --absent) [--int]` | `swapped <current>` or `not swapped <current>` |
//! | `sessions` | one line per node: id, endpoint, role, applied index, live sessions, cluster time |
//!
//! VALUE, ELEMENT, NEW and `--expected` are taken as UTF-8 bytes; with `--int`
//! they are parsed as an i64, and `put --list` takes comma-separated items
//! (an empty string is the empty list). Every command takes the common
//! flags ([`CommonArgs`], before or after the subcommand): `--endpoints
//! a,b,c` (default: [`super::default_endpoints`]), `--json` and
//! `--timeout-ms` (the call's deadline, retries included; default 10000).
//!
//! `put`, `del`, `incr`, `append` and `cas` take `--idempotency-key K`: the
//! command then runs once per key K (UTF-8) through
//! [`Client::execute_with_key`], with no session. Running it again with the
//! same K and command (within the key's TTL) prints the first run's answer
//! unchanged on stdout — a replay: nothing executed now — and says so on
//! stderr (`replay: …`); with `--json` the object carries
//! `"idempotency_key"`, `"duplicate"` (true for a replay) and
//! `"log_index"`. K used with another command is KEY_CONFLICT (exit 4).
//!
//! Plain values: bytes print as text when they are valid UTF-8, otherwise as
//! hex with a `0x` prefix; ints in decimal; a list one item per line (in a
//! `cas` line, comma-separated); an absent `cas` value as `(absent)`.
//!
//! # JSON
//!
//! With `--json` the result is one JSON object on one line of stdout, with
//! `"ok"` telling success from failure:
//!
//! - `{"ok":true,"key":"k","value":{"int":5}}` (`get`); a value is
//!   `{"bytes":"text"}` or `{"bytes_hex":"00ff"}`, `{"int":5}`, or
//!   `{"list":["a","b"]}` (`{"list_hex":[…]}` when an item is not UTF-8);
//! - `put` echoes `"value"`, `del` gives `"existed"`, `incr` `"value"` (a
//!   number), `append` `"length"`, `cas` `"swapped"` and `"current"` (a value
//!   or null), `sessions` `"nodes"` (one object per endpoint);
//! - `{"ok":false,"error":"…","kind":"unavailable","outcome":"none"}` on a
//!   failure: `kind` names the error (`not_found`, `unavailable`,
//!   `outcome_unknown`, `session_expired`, `wrong_cluster`, `seq_conflict`,
//!   `response_discarded`, `invalid_argument`, `resource_exhausted`,
//!   `overflow`, `wrong_type`, `key_conflict`), and `outcome` is `"none"` (the command had no
//!   effect) or `"unknown"` (it may have had one; then `"seq"` and `"fenced"`
//!   are given too). `"hint"` says what to do, when there is advice; an
//!   `unavailable` failure also has `"nodes"`: what each endpoint said when
//!   asked why (`{"endpoint","reachable":false,"error":"connection
//!   refused"}`, or `{"endpoint","reachable":true,"node_id","role",
//!   "leader_id"}`).
//!
//! The error is also written to stderr, in both modes: `error: ` and one
//! line of what happened, then `hint: ` and one line of what to do. A call
//! that did not get through is explained by asking every endpoint once
//! ([`super::reach`]): nothing listening, no answer, unknown host, no
//! leader, not initialised, or a leader that answered too slowly. The
//! client library's own words are logged at debug level (`RUST_LOG=debug`).
//!
//! # Exit codes
//!
//! - 0: success (a `cas` that did not swap, and a `del` of an absent key,
//!   are successes: the command ran and the answer is definite).
//! - 1: definite failure, nothing was executed: invalid argument (an empty
//!   key included), a limit the request breaks (a key, value or list too
//!   large: `kind` `limit_exceeded`, with `limit`, `limit_max` and
//!   `limit_requested`), wrong cluster, seq conflict, response discarded, session expired on the first
//!   attempt, cluster unavailable before the command was sent (no node
//!   reachable, no leader, no session), an increment that would overflow or a
//!   value of the wrong type (nothing changed), the key absent for `get`; for
//!   `sessions`, no node answered.
//! - 2: usage error (clap's, or a VALUE that is not an i64 with `--int`);
//!   reported on stderr only, even with `--json`.
//! - 3: outcome unknown ([`Error::OutcomeUnknown`]): the command may or may
//!   not have taken effect. When `fenced` is true the raised floor is
//!   committed, so no late copy can execute; either way the session is then
//!   closed (best effort), which also stops late copies. With
//!   `--idempotency-key` ([`Error::KeyOutcomeUnknown`]): running the same
//!   command with the same key again learns the outcome.
//! - 4: key conflict ([`Error::KeyConflict`], kind `key_conflict`): the
//!   `--idempotency-key` was used before (by this principal, within its TTL)
//!   with another command. Nothing executed, like exit 1, but final in a
//!   stronger sense: the same command with the same key can never succeed.

use std::io::Write;
use std::time::Duration;

use serde_json::{Map, Value as Json, json};

use oncekv_client::{Client, ClientConfig, Error, KeyedReply};
use oncekv_core::{Command, CommandResult, Value, ValueKind};
use oncekv_wire::proto::StatusReply;

use super::reach::{self, plain_reason};
use super::status::{QueryError, query};
use super::{CommonArgs, default_endpoints};

/// Exit code of a success.
pub const EXIT_OK: i32 = 0;
/// Exit code of a definite failure: nothing was executed.
pub const EXIT_FAILED: i32 = 1;
/// Exit code of a usage error (as clap's).
pub const EXIT_USAGE: i32 = 2;
/// Exit code of an unknown outcome: the command may have been executed.
pub const EXIT_UNKNOWN: i32 = 3;
/// Exit code of KEY_CONFLICT: the `--idempotency-key` was used before with
/// another command. A definite failure (nothing executed) like exit 1, but
/// its own code: running the same command again can never succeed — the
/// key keeps answering its first command — so a script must not retry it.
pub const EXIT_KEY_CONFLICT: i32 = 4;

/// The exit codes, for `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes of put, get, del, incr, append, cas and sessions:
  0  success (also a cas that did not swap, a del of an absent key)
  1  definite failure, nothing executed: invalid argument (an empty key too),
     a limit the request breaks (key, value or list too large), wrong cluster,
     seq conflict, response discarded, session expired, cluster unavailable
     before the command was sent, overflow or wrong type, key absent (get), no
     node answered (sessions)
  2  usage error
  3  outcome unknown: the command may or may not have taken effect (the error
     says whether its seq is fenced; the session is closed either way); with
     --idempotency-key, run it again with the same key to learn the outcome
  4  key conflict: the --idempotency-key was used before with another command;
     nothing executed (the key keeps answering its first command)

With --json the result is one JSON object on stdout: {\"ok\":true,...} or
{\"ok\":false,\"error\":...,\"kind\":...,\"outcome\":\"none\"|\"unknown\"}.";

/// Default deadline of a key-value or admin command.
pub const TIMEOUT_MS_DEFAULT: u64 = 10_000;

impl CommonArgs {
    /// The command's deadline: `--timeout-ms`, default 10 s.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout_or(TIMEOUT_MS_DEFAULT)
    }

    pub(super) fn endpoints(&self) -> Result<Vec<String>, Failure> {
        if self.endpoints.is_empty() {
            Ok(default_endpoints())
        } else {
            normalize_endpoints(&self.endpoints)
        }
    }
}

/// The key-value commands, flattened into the binary's subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum KvCommand {
    /// Store VALUE at KEY, replacing any value; prints OK.
    #[command(after_help = EXIT_CODES_HELP)]
    Put(PutArgs),
    /// Print the value at KEY (a linearizable read through the leader);
    /// nothing, "key not found" on stderr and exit 1 when it is absent.
    #[command(after_help = EXIT_CODES_HELP)]
    Get(KeyArgs),
    /// Delete KEY; prints "deleted", or "absent" when there was none.
    #[command(after_help = EXIT_CODES_HELP)]
    Del(DelArgs),
    /// Add DELTA (default 1) to the int at KEY (absent counts as 0); prints
    /// the new value.
    #[command(after_help = EXIT_CODES_HELP)]
    Incr(IncrArgs),
    /// Append ELEMENT to the list at KEY (absent counts as empty); prints the
    /// list's new length.
    #[command(after_help = EXIT_CODES_HELP)]
    Append(AppendArgs),
    /// Store NEW at KEY if its value is --expected (or it is --absent);
    /// prints "swapped <current>" or "not swapped <current>".
    #[command(after_help = EXIT_CODES_HELP)]
    Cas(CasArgs),
    /// Summarise every node's Status: id, role, applied index, live
    /// sessions, cluster time.
    #[command(after_help = EXIT_CODES_HELP)]
    Sessions(SessionsArgs),
}

/// `--idempotency-key K`, on the commands that change something.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KeyedArg {
    /// Run the command once per idempotency key K (UTF-8), with no
    /// session: running it again with the same K and the same command
    /// (within the key's TTL) answers the first run's result and executes
    /// nothing — a replay; K used with another command is KEY_CONFLICT
    /// (exit 4).
    #[arg(long, value_name = "K")]
    pub idempotency_key: Option<String>,
}

/// `put KEY VALUE [--int | --list]`.
#[derive(Debug, Clone, clap::Args)]
pub struct PutArgs {
    pub key: String,
    /// The value: UTF-8 bytes, an i64 with --int, comma-separated items
    /// with --list.
    #[arg(allow_hyphen_values = true)]
    pub value: String,
    /// Store VALUE as an i64.
    #[arg(long, conflicts_with = "list")]
    pub int: bool,
    /// Store VALUE as a list of comma-separated items ("" is the empty list).
    #[arg(long)]
    pub list: bool,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `get KEY`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    pub key: String,
}

/// `del KEY`.
#[derive(Debug, Clone, clap::Args)]
pub struct DelArgs {
    pub key: String,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `incr KEY [DELTA]`.
#[derive(Debug, Clone, clap::Args)]
pub struct IncrArgs {
    pub key: String,
    /// How much to add; may be negative.
    #[arg(default_value_t = 1, allow_negative_numbers = true)]
    pub delta: i64,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `append KEY ELEMENT`.
#[derive(Debug, Clone, clap::Args)]
pub struct AppendArgs {
    pub key: String,
    /// The element, as UTF-8 bytes.
    #[arg(allow_hyphen_values = true)]
    pub element: String,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `cas KEY NEW (--expected VALUE | --absent) [--int]`.
#[derive(Debug, Clone, clap::Args)]
pub struct CasArgs {
    pub key: String,
    /// The value to store if the current one is as expected.
    #[arg(allow_hyphen_values = true)]
    pub new: String,
    /// Swap only if the current value equals this one.
    #[arg(
        long,
        value_name = "VALUE",
        allow_hyphen_values = true,
        required_unless_present = "absent",
        conflicts_with = "absent"
    )]
    pub expected: Option<String>,
    /// Swap only if the key is absent.
    #[arg(long)]
    pub absent: bool,
    /// NEW and --expected are i64s (otherwise UTF-8 bytes).
    #[arg(long)]
    pub int: bool,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `sessions`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionsArgs {}

/// One key-value call, its arguments parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Put {
        key: String,
        value: Value,
    },
    Get {
        key: String,
    },
    Del {
        key: String,
    },
    Incr {
        key: String,
        delta: i64,
    },
    Append {
        key: String,
        element: String,
    },
    Cas {
        key: String,
        expected: Option<Value>,
        new: Value,
    },
}

/// What a command prints when it succeeds: plain lines, or the fields of
/// the JSON object (besides `"ok":true`).
#[derive(Debug, Default)]
pub(super) struct Success {
    pub(super) lines: Vec<String>,
    pub(super) fields: Map<String, Json>,
    /// Plain mode only: lines for people on stderr (a keyed command's
    /// replay), keeping stdout the same as the first answer's.
    pub(super) notes: Vec<String>,
}

/// Whether a failed command may have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// It certainly had no effect.
    None,
    /// It may or may not have had an effect.
    Unknown,
}

/// Why a command failed, and how to report it.
#[derive(Debug)]
pub(super) struct Failure {
    exit: i32,
    kind: &'static str,
    /// What happened, on one line.
    message: String,
    /// What to do about it, on one line (printed as a second line).
    hint: Option<String>,
    outcome: Outcome,
    /// Extra JSON fields (the key, the seq of an unknown outcome, …).
    fields: Map<String, Json>,
}

impl Failure {
    pub(super) fn new(kind: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            exit: EXIT_FAILED,
            kind,
            message: message.into(),
            hint: None,
            outcome: Outcome::None,
            fields: Map::new(),
        }
    }

    /// What happened, on one line.
    pub(super) fn message(&self) -> &str {
        &self.message
    }

    /// The same failure, with what to do about it.
    pub(super) fn hint(self, hint: impl Into<String>) -> Failure {
        Failure {
            hint: Some(hint.into()),
            ..self
        }
    }

    /// A failure to get through to the cluster, explained by `diagnosis`
    /// (what the endpoints said when asked): kind `unavailable`, nothing
    /// executed (exit 1).
    pub(super) fn unreachable(diagnosis: reach::Diagnosis) -> Failure {
        Failure::new("unavailable", diagnosis.message)
            .hint(diagnosis.hint)
            .with("nodes", Json::Array(diagnosis.nodes))
    }

    /// This failure (a call that did not get through to `endpoints`),
    /// explained by asking them once why not, its own text kept as the
    /// detail; its other JSON fields are kept.
    pub(super) async fn explained(self, endpoints: &[String], timeout: Duration) -> Failure {
        tracing::debug!(error = %self.message, ?endpoints, "the call did not get through");
        let probes = reach::probe(endpoints, timeout).await;
        let mut explained = Failure::unreachable(reach::diagnose(&probes, Some(&self.message)));
        for (name, value) in self.fields {
            explained.fields.entry(name).or_insert(value);
        }
        explained
    }

    /// Prints the failure on stderr (no JSON) and returns its exit code.
    pub(super) fn print_to_stderr(self) -> i32 {
        let stderr = std::io::stderr();
        print_report(&mut std::io::sink(), &mut stderr.lock(), false, Err(self))
    }

    pub(super) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            exit: EXIT_USAGE,
            ..Failure::new("usage", message)
        }
    }

    /// The same failure, but one that may have taken effect (exit 3).
    pub(super) fn unknown(self) -> Failure {
        Failure {
            exit: EXIT_UNKNOWN,
            outcome: Outcome::Unknown,
            ..self
        }
    }

    pub(super) fn with(mut self, field: &str, value: Json) -> Failure {
        self.fields.insert(field.to_owned(), value);
        self
    }

    /// The failure of a client call on `key`: the library's error by its
    /// own name ([`Error::kind`]) and words, with what to do and the exit
    /// code. An `unavailable` one is then [`Failure::explained`] by the
    /// caller.
    fn from_client(error: &Error, key: &str) -> Failure {
        tracing::debug!(error = ?error, key, "the client call failed");
        let failure =
            Failure::new(error.kind(), plain_reason(&error.to_string())).with("key", json!(key));
        match error {
            Error::LimitExceeded {
                limit,
                max,
                requested,
            } => failure
                .with("limit", json!(limit.to_string()))
                .with("limit_max", json!(max))
                .with("limit_requested", json!(requested)),
            Error::OutcomeUnknown {
                seq,
                fenced,
                reason,
            } => {
                let fence = if *fenced {
                    "its seq is fenced, so no late copy of it can execute"
                } else {
                    "the fence was not confirmed; the session is closed (best effort), which \
                     also stops late copies"
                };
                Failure {
                    exit: EXIT_UNKNOWN,
                    outcome: Outcome::Unknown,
                    message: format!(
                        "outcome unknown for seq {seq} ({}): the command may or may not have \
                         taken effect",
                        plain_reason(reason)
                    ),
                    ..failure
                }
                .hint(format!(
                    "{fence}; read the key (`oncekv get {key}`) before running the command again"
                ))
                .with("seq", json!(seq))
                .with("fenced", json!(fenced))
            }
            Error::SessionExpired => failure
                .hint("nothing was executed; run the command again (it registers a new session)"),
            Error::KeyOutcomeUnknown { .. } => Failure {
                exit: EXIT_UNKNOWN,
                outcome: Outcome::Unknown,
                ..failure
            }
            .hint("run the same command with the same idempotency key again to learn its outcome"),
            Error::KeyConflict { .. } => Failure {
                exit: EXIT_KEY_CONFLICT,
                ..failure
            }
            .hint(
                "the key keeps answering the command it first ran (until its TTL): use a new \
                 idempotency key for new work",
            ),
            _ => failure,
        }
    }
}

impl KvCommand {
    /// Runs the command, prints its result (stdout) or error (stderr), and
    /// returns the process exit code.
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let report = self.execute(common).await;
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        print_report(&mut stdout.lock(), &mut stderr.lock(), common.json, report)
    }

    /// `--idempotency-key`, on the commands that take it.
    fn idempotency_key(&self) -> Option<&str> {
        let keyed = match self {
            KvCommand::Put(args) => &args.keyed,
            KvCommand::Del(args) => &args.keyed,
            KvCommand::Incr(args) => &args.keyed,
            KvCommand::Append(args) => &args.keyed,
            KvCommand::Cas(args) => &args.keyed,
            KvCommand::Get(_) | KvCommand::Sessions(_) => return None,
        };
        keyed.idempotency_key.as_deref()
    }

    async fn execute(&self, common: &CommonArgs) -> Result<Success, Failure> {
        let endpoints = common.endpoints()?;
        let op = match self {
            KvCommand::Sessions(_) => return sessions(&endpoints, common.timeout()).await,
            KvCommand::Put(args) => Op::Put {
                key: args.key.clone(),
                value: parse_put_value(&args.value, args.int, args.list)?,
            },
            KvCommand::Get(args) => Op::Get {
                key: args.key.clone(),
            },
            KvCommand::Del(args) => Op::Del {
                key: args.key.clone(),
            },
            KvCommand::Incr(args) => Op::Incr {
                key: args.key.clone(),
                delta: args.delta,
            },
            KvCommand::Append(args) => Op::Append {
                key: args.key.clone(),
                element: args.element.clone(),
            },
            KvCommand::Cas(args) => Op::Cas {
                key: args.key.clone(),
                expected: args
                    .expected
                    .as_deref()
                    .map(|text| parse_scalar(text, args.int, "--expected"))
                    .transpose()?,
                new: parse_scalar(&args.new, args.int, "NEW")?,
            },
        };
        let credentials = common
            .credentials()
            .map_err(|error| Failure::usage(error.to_string()))?;
        let client = Client::with_config(
            endpoints.clone(),
            ClientConfig {
                call_timeout: common.timeout(),
                credentials,
                ..ClientConfig::default()
            },
        );
        let result = call(&client, op, self.idempotency_key()).await;
        // Unregister, so the CLI leaves no session behind (a no-op when no
        // session was registered, as for `get`).
        client.close().await;
        match result {
            Err(failure) if failure.kind == "unavailable" => {
                Err(failure.explained(&endpoints, common.timeout()).await)
            }
            other => other,
        }
    }
}

/// Runs `op` through `client`: with a session (exactly once, the
/// library's retries), or with `idempotency_key` through
/// [`Client::execute_with_key`] (no session; a replay is marked).
async fn call(client: &Client, op: Op, idempotency_key: Option<&str>) -> Result<Success, Failure> {
    let (key, command) = match op {
        Op::Get { key } => return get(client, key).await,
        Op::Put { key, value } => {
            let command = Command::Put {
                key: key.as_bytes().to_vec(),
                value,
            };
            (key, command)
        }
        Op::Del { key } => {
            let command = Command::Delete {
                key: key.as_bytes().to_vec(),
            };
            (key, command)
        }
        Op::Incr { key, delta } => {
            let command = Command::Increment {
                key: key.as_bytes().to_vec(),
                delta,
            };
            (key, command)
        }
        Op::Append { key, element } => {
            let command = Command::Append {
                key: key.as_bytes().to_vec(),
                element: element.into_bytes(),
            };
            (key, command)
        }
        Op::Cas { key, expected, new } => {
            let command = Command::CompareAndSwap {
                key: key.as_bytes().to_vec(),
                expected,
                new,
            };
            (key, command)
        }
    };
    let Some(idempotency_key) = idempotency_key else {
        let result = client
            .execute(command.clone())
            .await
            .map_err(|error| Failure::from_client(&error, &key))?;
        return command_success(&key, &command, result);
    };
    let reply = client
        .execute_with_key(idempotency_key.as_bytes(), command.clone())
        .await
        .map_err(|error| {
            Failure::from_client(&error, &key).with("idempotency_key", json!(idempotency_key))
        })?;
    let answer = reply_fields(&reply);
    let mut success = command_success(&key, &command, reply.result)
        .map_err(|failure| keyed_fields(failure, idempotency_key, &answer))?;
    success.fields.extend(answer);
    success
        .fields
        .insert("idempotency_key".to_owned(), json!(idempotency_key));
    if reply.duplicate {
        success.notes.push(format!(
            "replay: idempotency key {idempotency_key:?} had already executed this command (log \
             index {}); this is its original answer, nothing executed now",
            reply.log_index
        ));
    }
    Ok(success)
}

/// The JSON fields of a keyed answer: `duplicate` (a replay: nothing
/// executed now) and the answering entry's `log_index`.
fn reply_fields(reply: &KeyedReply) -> Map<String, Json> {
    let mut fields = Map::new();
    fields.insert("duplicate".to_owned(), json!(reply.duplicate));
    fields.insert("log_index".to_owned(), json!(reply.log_index));
    fields
}

/// A keyed command's application refusal, with the key's fields.
fn keyed_fields(
    mut failure: Failure,
    idempotency_key: &str,
    fields: &Map<String, Json>,
) -> Failure {
    failure.fields.extend(fields.clone());
    failure.with("idempotency_key", json!(idempotency_key))
}

/// `get KEY`: a linearizable read.
async fn get(client: &Client, key: String) -> Result<Success, Failure> {
    let value = client
        .get(key.as_bytes())
        .await
        .map_err(|error| Failure::from_client(&error, &key))?;
    match value {
        Some(value) => Ok(success(
            value_lines(&value),
            [("key", json!(key)), ("value", value_json(&value))],
        )),
        None => Err(Failure::new("not_found", "key not found")
            .with("key", json!(key))
            .with("value", Json::Null)),
    }
}

/// What an executed `command` on `key` prints, from its `result`; an
/// application refusal (an overflow, a wrong type) is a failure.
fn command_success(
    key: &str,
    command: &Command,
    result: CommandResult,
) -> Result<Success, Failure> {
    match (command, result) {
        (Command::Put { value, .. }, CommandResult::Stored) => Ok(success(
            vec!["OK".to_owned()],
            [("key", json!(key)), ("value", value_json(value))],
        )),
        (Command::Delete { .. }, CommandResult::Deleted { existed }) => {
            let line = if existed { "deleted" } else { "absent" };
            Ok(success(
                vec![line.to_owned()],
                [("key", json!(key)), ("existed", json!(existed))],
            ))
        }
        (Command::Increment { .. }, CommandResult::Incremented { value }) => Ok(success(
            vec![value.to_string()],
            [("key", json!(key)), ("value", json!(value))],
        )),
        (Command::Append { .. }, CommandResult::Appended { length }) => Ok(success(
            vec![length.to_string()],
            [("key", json!(key)), ("length", json!(length))],
        )),
        (Command::CompareAndSwap { .. }, CommandResult::CompareAndSwap { swapped, current }) => {
            let verdict = if swapped { "swapped" } else { "not swapped" };
            Ok(success(
                vec![format!("{verdict} {}", value_inline(current.as_ref()))],
                [
                    ("key", json!(key)),
                    ("swapped", json!(swapped)),
                    ("current", current.as_ref().map_or(Json::Null, value_json)),
                ],
            ))
        }
        (_, other) => Err(application_failure(key, other)),
    }
}

pub(super) fn success<const N: usize>(lines: Vec<String>, fields: [(&str, Json); N]) -> Success {
    Success {
        lines,
        fields: fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        notes: Vec::new(),
    }
}

/// An executed command whose application result is a refusal (nothing
/// changed): an overflow or a wrong type.
fn application_failure(key: &str, result: CommandResult) -> Failure {
    let failure = match result {
        CommandResult::Overflow { current } => Failure::new(
            "overflow",
            format!("the increment would overflow the value {current}; nothing changed"),
        )
        .with("current", json!(current)),
        CommandResult::WrongType { actual } => Failure::new(
            "wrong_type",
            format!(
                "the value at {key:?} is {}; nothing changed",
                kind_name(actual)
            ),
        )
        .with("actual", json!(kind_name(actual))),
        other => Failure::new(
            "invalid_argument",
            format!("unexpected result from the cluster: {other:?}"),
        ),
    };
    failure.with("key", json!(key))
}

pub(super) fn kind_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Bytes => "bytes",
        ValueKind::Int => "an int",
        ValueKind::List => "a list",
    }
}

/// `oncekv sessions`: every endpoint's `Status`, asked concurrently.
async fn sessions(endpoints: &[String], timeout: Duration) -> Result<Success, Failure> {
    let answers =
        futures::future::join_all(endpoints.iter().map(|endpoint| query(endpoint, timeout))).await;
    let lines = endpoints
        .iter()
        .zip(&answers)
        .map(|(endpoint, answer)| sessions_line(endpoint, answer))
        .collect::<Vec<_>>();
    let nodes: Vec<Json> = endpoints
        .iter()
        .zip(&answers)
        .map(|(endpoint, answer)| sessions_json(endpoint, answer))
        .collect();
    if answers.iter().any(Result::is_ok) {
        Ok(success(lines, [("nodes", Json::Array(nodes))]))
    } else {
        let probes: Vec<reach::Probe> = endpoints.iter().cloned().zip(answers).collect();
        Err(Failure::unreachable(reach::diagnose(&probes, None)))
    }
}

/// `node 1  127.0.0.1:7101  leader     applied 42  sessions 3  cluster_time 12.345s`
/// or `127.0.0.1:7103  unreachable (<reason>)`.
fn sessions_line(endpoint: &str, answer: &Result<StatusReply, QueryError>) -> String {
    match answer {
        Ok(reply) => format!(
            "node {}  {}  {:<9}  applied {}  sessions {}  cluster_time {}.{:03}s",
            reply.node_id,
            endpoint,
            reply.role,
            reply.applied_index,
            reply.sessions,
            reply.cluster_time_ms / 1000,
            reply.cluster_time_ms % 1000,
        ),
        Err(error) => format!("{endpoint}  unreachable ({error})"),
    }
}

fn sessions_json(endpoint: &str, answer: &Result<StatusReply, QueryError>) -> Json {
    match answer {
        Ok(reply) => json!({
            "endpoint": endpoint,
            "reachable": true,
            "node_id": reply.node_id,
            "role": reply.role,
            "applied_index": reply.applied_index,
            "sessions": reply.sessions,
            "cluster_time_ms": reply.cluster_time_ms,
        }),
        Err(error) => json!({
            "endpoint": endpoint,
            "reachable": false,
            "error": error.to_string(),
        }),
    }
}

/// Prints a command's result and returns its exit code. A success goes to
/// `out` (plain lines, or one JSON object); a failure goes to `err`, and with
/// `json` (unless it is a usage error) also as one JSON object to `out`.
pub(super) fn print_report(
    out: &mut impl Write,
    err: &mut impl Write,
    json: bool,
    report: Result<Success, Failure>,
) -> i32 {
    // A broken stdout (say, a closed pipe) cannot be reported anywhere
    // better than stderr; the exit code still tells the command's fate.
    let printed = match &report {
        Ok(success) => {
            if json {
                let mut object = Map::new();
                object.insert("ok".to_owned(), Json::Bool(true));
                object.extend(success.fields.clone());
                writeln!(out, "{}", Json::Object(object))
            } else {
                for note in &success.notes {
                    let _ = writeln!(err, "{note}");
                }
                success
                    .lines
                    .iter()
                    .try_for_each(|line| writeln!(out, "{line}"))
            }
        }
        Err(failure) => {
            let _ = writeln!(err, "error: {}", failure.message);
            if let Some(hint) = &failure.hint {
                let _ = writeln!(err, "hint: {hint}");
            }
            if json && failure.exit != EXIT_USAGE {
                writeln!(out, "{}", failure_json(failure))
            } else {
                Ok(())
            }
        }
    };
    if let Err(error) = printed.and_then(|()| out.flush()) {
        let _ = writeln!(err, "error: cannot write the result: {error}");
    }
    let _ = err.flush();
    match report {
        Ok(_) => EXIT_OK,
        Err(failure) => failure.exit,
    }
}

fn failure_json(failure: &Failure) -> Json {
    let mut object = Map::new();
    object.insert("ok".to_owned(), Json::Bool(false));
    object.insert("error".to_owned(), json!(failure.message));
    if let Some(hint) = &failure.hint {
        object.insert("hint".to_owned(), json!(hint));
    }
    object.insert("kind".to_owned(), json!(failure.kind));
    let outcome = match failure.outcome {
        Outcome::None => "none",
        Outcome::Unknown => "unknown",
    };
    object.insert("outcome".to_owned(), json!(outcome));
    object.extend(failure.fields.clone());
    Json::Object(object)
}

/// `host:port` endpoints without blanks; a leading `http://` is dropped (the
/// client library adds it). Empty entries are ignored; none left, or another
/// scheme, is a usage error.
fn normalize_endpoints(given: &[String]) -> Result<Vec<String>, Failure> {
    let mut endpoints = Vec::new();
    for endpoint in given.iter().map(|endpoint| endpoint.trim()) {
        if endpoint.is_empty() {
            continue;
        }
        let endpoint = endpoint.strip_prefix("http://").unwrap_or(endpoint);
        if endpoint.contains("://") {
            return Err(Failure::usage(format!(
                "endpoint {endpoint:?}: give host:port (plain http only)"
            )));
        }
        endpoints.push(endpoint.trim_end_matches('/').to_owned());
    }
    if endpoints.is_empty() {
        return Err(Failure::usage("--endpoints names no endpoint"));
    }
    Ok(endpoints)
}

/// `put`'s VALUE: bytes, an i64 (`int`) or comma-separated items (`list`).
fn parse_put_value(text: &str, int: bool, list: bool) -> Result<Value, Failure> {
    if list {
        let items = if text.is_empty() {
            Vec::new()
        } else {
            text.split(',')
                .map(|item| item.as_bytes().to_vec())
                .collect()
        };
        Ok(Value::List(items))
    } else {
        parse_scalar(text, int, "VALUE")
    }
}

/// Bytes, or with `int` an i64.
fn parse_scalar(text: &str, int: bool, what: &str) -> Result<Value, Failure> {
    if int {
        text.trim()
            .parse::<i64>()
            .map(Value::Int)
            .map_err(|error| Failure::usage(format!("invalid {what} {text:?} with --int: {error}")))
    } else {
        Ok(Value::Bytes(text.as_bytes().to_vec()))
    }
}

/// Bytes as text when valid UTF-8, else `0x` and hex.
pub(super) fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("0x{}", hex(bytes)),
    }
}

/// The plain lines of a `get`: one, or one per list item (none for an
/// empty list).
pub(super) fn value_lines(value: &Value) -> Vec<String> {
    match value {
        Value::Bytes(bytes) => vec![bytes_text(bytes)],
        Value::Int(number) => vec![number.to_string()],
        Value::List(items) => items.iter().map(|item| bytes_text(item)).collect(),
    }
}

/// A value on one line (a `cas` result): list items comma-separated.
pub(super) fn value_inline(value: Option<&Value>) -> String {
    match value {
        None => "(absent)".to_owned(),
        Some(Value::List(items)) => items
            .iter()
            .map(|item| bytes_text(item))
            .collect::<Vec<_>>()
            .join(","),
        Some(value) => value_lines(value).concat(),
    }
}

/// `{"bytes":…}` / `{"bytes_hex":…}`, `{"int":…}`, `{"list":[…]}` /
/// `{"list_hex":[…]}` (hex when any item is not UTF-8).
pub(super) fn value_json(value: &Value) -> Json {
    match value {
        Value::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => json!({ "bytes": text }),
            Err(_) => json!({ "bytes_hex": hex(bytes) }),
        },
        Value::Int(number) => json!({ "int": number }),
        Value::List(items) => {
            let texts: Option<Vec<&str>> = items
                .iter()
                .map(|item| std::str::from_utf8(item).ok())
                .collect();
            match texts {
                Some(texts) => json!({ "list": texts }),
                None => {
                    json!({ "list_hex": items.iter().map(|item| hex(item)).collect::<Vec<_>>() })
                }
            }
        }
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};

    /// The key-value command `args` name, as the binary parses it.
    fn parse(args: &[&str]) -> Result<KvCommand, clap::Error> {
        parse_with_common(args).map(|(command, _)| command)
    }

    fn parse_with_common(args: &[&str]) -> Result<(KvCommand, CommonArgs), clap::Error> {
        let cli = Cli::try_parse_checked(std::iter::once("oncekv").chain(args.iter().copied()))?;
        match cli.command {
            Command::Kv(command) => Ok((command, cli.common)),
            other => panic!("{args:?} is not a key-value command: {other:?}"),
        }
    }

    /// Bytes print as text when UTF-8, else as 0x-hex; lists one item per
    /// line; the JSON form says which.
    #[test]
    fn values_print_as_text_or_hex() {
        assert_eq!(value_lines(&Value::Bytes(b"hello".to_vec())), ["hello"]);
        assert_eq!(value_lines(&Value::Bytes(vec![0xff, 0x00])), ["0xff00"]);
        assert_eq!(value_lines(&Value::Int(-7)), ["-7"]);
        let list = Value::List(vec![b"a".to_vec(), vec![0xfe]]);
        assert_eq!(value_lines(&list), ["a", "0xfe"]);
        assert_eq!(value_inline(Some(&list)), "a,0xfe");
        assert_eq!(value_inline(None), "(absent)");
        assert!(value_lines(&Value::List(Vec::new())).is_empty());

        assert_eq!(
            value_json(&Value::Bytes(b"hi".to_vec())),
            json!({"bytes": "hi"})
        );
        assert_eq!(
            value_json(&Value::Bytes(vec![0xff])),
            json!({"bytes_hex": "ff"})
        );
        assert_eq!(value_json(&Value::Int(5)), json!({"int": 5}));
        assert_eq!(
            value_json(&Value::List(vec![b"a".to_vec(), b"b".to_vec()])),
            json!({"list": ["a", "b"]})
        );
        assert_eq!(value_json(&list), json!({"list_hex": ["61", "fe"]}));
    }

    /// `--int` parses an i64, `--list` splits on commas, anything else is bytes.
    #[test]
    fn put_values_parse_by_flag() {
        assert_eq!(
            parse_put_value("a,b", false, false).unwrap(),
            Value::Bytes(b"a,b".to_vec())
        );
        assert_eq!(
            parse_put_value("-42", true, false).unwrap(),
            Value::Int(-42)
        );
        assert_eq!(
            parse_put_value("a,,b", false, true).unwrap(),
            Value::List(vec![b"a".to_vec(), Vec::new(), b"b".to_vec()])
        );
        assert_eq!(
            parse_put_value("", false, true).unwrap(),
            Value::List(Vec::new())
        );
        let failure = parse_put_value("12x", true, false).unwrap_err();
        assert_eq!(failure.exit, EXIT_USAGE);
        assert!(failure.message.contains("\"12x\""), "{}", failure.message);
    }

    /// Negative numbers and dash-leading values are values, not flags.
    #[test]
    fn negative_numbers_are_values() {
        let (KvCommand::Incr(args), common) =
            parse_with_common(&["incr", "k", "-3", "--json"]).unwrap()
        else {
            panic!("not incr");
        };
        assert_eq!(args.delta, -3);
        assert!(common.json);
        let KvCommand::Put(args) = parse(&["put", "k", "-5", "--int"]).unwrap() else {
            panic!("not put");
        };
        assert_eq!((args.value.as_str(), args.int), ("-5", true));
        let KvCommand::Cas(args) = parse(&["cas", "k", "-1", "--int", "--expected", "-2"]).unwrap()
        else {
            panic!("not cas");
        };
        assert_eq!(args.expected.as_deref(), Some("-2"));
        assert_eq!(args.new, "-1");
    }

    /// The defaults, and the argument rules clap enforces (exit 2).
    #[test]
    fn argument_rules() {
        let (KvCommand::Incr(args), common) = parse_with_common(&["incr", "k"]).unwrap() else {
            panic!("not incr");
        };
        assert_eq!(args.delta, 1);
        assert_eq!(common.timeout(), Duration::from_millis(10_000));
        assert!(common.endpoints.is_empty());
        let (KvCommand::Get(_), common) =
            parse_with_common(&["get", "k", "--endpoints", "a:1,b:2"]).unwrap()
        else {
            panic!("not get");
        };
        assert_eq!(common.endpoints, ["a:1", "b:2"]);
        for bad in [
            &["cas", "k", "v"][..],
            &["cas", "k", "v", "--absent", "--expected", "x"],
            &["put", "k", "v", "--int", "--list"],
            &["put", "k"],
            &["incr", "k", "x"],
            &["get", "k", "--timeout-ms", "0"],
            &["--timeout-ms", "0", "get", "k"],
        ] {
            let error = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), EXIT_USAGE, "{bad:?}");
        }
    }

    /// The common flags mean the same before the subcommand, after it, or
    /// between its arguments, for every key-value command.
    #[test]
    fn common_flags_go_anywhere() {
        let expected = CommonArgs {
            endpoints: vec!["a:1".into(), "b:2".into()],
            json: true,
            timeout_ms: Some(300),
            ..CommonArgs::default()
        };
        let flags = ["--json", "--endpoints", "a:1,b:2", "--timeout-ms", "300"];
        for command in [
            &["put", "k", "v"][..],
            &["get", "k"],
            &["del", "k"],
            &["incr", "k", "2"],
            &["append", "k", "x"],
            &["cas", "k", "v", "--absent"],
            &["sessions"],
        ] {
            let before: Vec<&str> = flags.iter().chain(command).copied().collect();
            let after: Vec<&str> = command.iter().chain(&flags).copied().collect();
            let mut between: Vec<&str> = vec![command[0], flags[0]];
            between.extend(&command[1..]);
            between.extend(&flags[1..]);
            for args in [before, after, between] {
                let (_, common) =
                    parse_with_common(&args).unwrap_or_else(|error| panic!("{args:?}: {error}"));
                assert_eq!(common, expected, "{args:?}");
            }
        }
    }

    /// Endpoints are trimmed, `http://` is dropped, other schemes and an
    /// empty list are usage errors.
    #[test]
    fn endpoints_are_normalized() {
        let given = [" 127.0.0.1:1 ", "", "http://h:2/"].map(String::from);
        assert_eq!(normalize_endpoints(&given).unwrap(), ["127.0.0.1:1", "h:2"]);
        assert_eq!(
            normalize_endpoints(&["https://h:1".to_owned()])
                .unwrap_err()
                .exit,
            EXIT_USAGE
        );
        assert_eq!(
            normalize_endpoints(&[String::new()]).unwrap_err().exit,
            EXIT_USAGE
        );
    }

    /// Each client error maps to its exit code; only an unknown outcome is 3.
    #[test]
    fn client_errors_map_to_exit_codes() {
        let definite = [
            Error::Unavailable("x".into()),
            Error::SessionExpired,
            Error::WrongCluster {
                expected: "ab".into(),
            },
            Error::SeqConflict { seq: 1 },
            Error::ResponseDiscarded { seq: 1, floor: 2 },
            Error::InvalidArgument("x".into()),
            Error::Unauthenticated("x".into()),
            Error::PermissionDenied("x".into()),
            Error::ResourceExhausted("x".into()),
            Error::LimitExceeded {
                limit: oncekv_core::Limit::ValueBytes,
                max: 65_536,
                requested: 65_537,
            },
        ];
        for error in definite {
            let failure = Failure::from_client(&error, "k");
            assert_eq!(failure.exit, EXIT_FAILED, "{error:?}");
            assert_eq!(failure_json(&failure)["outcome"], "none");
        }
        let unknown = Failure::from_client(
            &Error::OutcomeUnknown {
                seq: 4,
                reason: "deadline".into(),
                fenced: true,
            },
            "k",
        );
        assert_eq!(unknown.exit, EXIT_UNKNOWN);
        let object = failure_json(&unknown);
        assert_eq!(object["ok"], false);
        assert_eq!(object["outcome"], "unknown");
        assert_eq!(object["kind"], "outcome_unknown");
        assert_eq!(object["seq"], 4);
        assert_eq!(object["fenced"], true);
        assert_eq!(object["key"], "k");

        let conflict = Failure::from_client(&Error::KeyConflict { key: "ik".into() }, "k");
        assert_eq!(conflict.exit, EXIT_KEY_CONFLICT);
        let object = failure_json(&conflict);
        assert_eq!(object["kind"], "key_conflict");
        assert_eq!(object["outcome"], "none");
        let lost = Failure::from_client(
            &Error::KeyOutcomeUnknown {
                key: "ik".into(),
                reason: "deadline".into(),
            },
            "k",
        );
        assert_eq!(lost.exit, EXIT_UNKNOWN);
        assert_eq!(failure_json(&lost)["outcome"], "unknown");
    }

    /// `--idempotency-key` parses on the commands that change something,
    /// and not on `get`.
    #[test]
    fn idempotency_key_flag() {
        for args in [
            &["put", "k", "v", "--idempotency-key", "ik"][..],
            &["del", "k", "--idempotency-key", "ik"],
            &["incr", "k", "--idempotency-key", "ik"],
            &["incr", "k", "-2", "--idempotency-key", "ik"],
            &["append", "k", "e", "--idempotency-key", "ik"],
            &["cas", "k", "v", "--absent", "--idempotency-key", "ik"],
        ] {
            let command = parse(args).unwrap_or_else(|error| panic!("{args:?}: {error}"));
            assert_eq!(command.idempotency_key(), Some("ik"), "{args:?}");
        }
        assert_eq!(parse(&["incr", "k"]).unwrap().idempotency_key(), None);
        let error = parse(&["get", "k", "--idempotency-key", "ik"]).unwrap_err();
        assert_eq!(error.exit_code(), EXIT_USAGE);
    }

    /// A keyed command's answer shows whether it was a replay: in JSON as
    /// `duplicate`, in plain mode as a note on stderr (stdout unchanged).
    #[test]
    fn replays_are_marked() {
        let command = oncekv_core::Command::Increment {
            key: b"c".to_vec(),
            delta: 1,
        };
        let reply = KeyedReply {
            result: CommandResult::Incremented { value: 5 },
            duplicate: true,
            log_index: 9,
        };
        let mut replay = command_success("c", &command, reply.result.clone()).unwrap();
        replay.fields.extend(reply_fields(&reply));
        replay.notes.push("replay: …".into());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(print_report(&mut out, &mut err, false, Ok(replay)), 0);
        assert_eq!(String::from_utf8(out).unwrap(), "5\n");
        assert_eq!(String::from_utf8(err).unwrap(), "replay: …\n");
        let mut replay = command_success("c", &command, reply.result.clone()).unwrap();
        replay.fields.extend(reply_fields(&reply));
        replay.notes.push("replay: …".into());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_report(&mut out, &mut err, true, Ok(replay));
        let object: Json = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            object,
            json!({"ok": true, "key": "c", "value": 5, "duplicate": true, "log_index": 9})
        );
        assert!(err.is_empty(), "no note with --json");
        // An application refusal is still a failure, whatever the key.
        let refused = command_success("c", &command, CommandResult::Overflow { current: 1 });
        assert_eq!(refused.unwrap_err().kind, "overflow");
    }

    /// A success prints plain lines or one JSON object; a failure goes to
    /// stderr, and with --json also to stdout, except usage errors.
    #[test]
    fn reports_print_to_the_right_stream() {
        let print = |json: bool, report: Result<Success, Failure>| {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = print_report(&mut out, &mut err, json, report);
            (
                code,
                String::from_utf8(out).unwrap(),
                String::from_utf8(err).unwrap(),
            )
        };
        let ok = || success(vec!["a".into(), "b".into()], [("key", json!("k"))]);
        assert_eq!(print(false, Ok(ok())), (0, "a\nb\n".into(), String::new()));
        assert_eq!(
            print(true, Ok(ok())),
            (0, "{\"key\":\"k\",\"ok\":true}\n".into(), String::new())
        );
        let absent = || Failure::new("not_found", "key not found").with("value", Json::Null);
        assert_eq!(
            print(false, Err(absent())),
            (1, String::new(), "error: key not found\n".into())
        );
        let (code, out, err) = print(true, Err(absent()));
        assert_eq!((code, err.as_str()), (1, "error: key not found\n"));
        let object: Json = serde_json::from_str(&out).unwrap();
        assert_eq!(object["ok"], false);
        assert_eq!(object["value"], Json::Null);
        let (code, out, _) = print(true, Err(Failure::usage("bad")));
        assert_eq!((code, out.as_str()), (EXIT_USAGE, ""));
    }
}
