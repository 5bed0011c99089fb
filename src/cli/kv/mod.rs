//! `oncekv put | get | del | incr | append | cas | sessions`: the key-value
//! commands for people and scripts. Each command (but `sessions`) makes one
//! [`Client`], runs one call through it — exactly once, with the library's
//! retries until the `--timeout-ms` deadline — and closes the client, which
//! unregisters its session, so CLI calls leave no sessions behind.
//! `sessions` only asks every node for its `Status` (module `sessions`). The
//! arguments and their parsing are `args`'s, the printing of an answer
//! `answer`'s, and failures, JSON and exit codes the CLI's common
//! [`super::output`]; this module only makes the call.
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
//! With `--json` the result is one JSON object on one line of stdout:
//!
//! - `{"ok":true,"key":"k","value":{"int":5}}` (`get`); a value is
//!   `{"bytes":"text"}` or `{"bytes_hex":"00ff"}`, `{"int":5}`, or
//!   `{"list":["a","b"]}` (`{"list_hex":[…]}` when an item is not UTF-8);
//! - `put` echoes `"value"`, `del` gives `"existed"`, `incr` `"value"` (a
//!   number), `append` `"length"`, `cas` `"swapped"` and `"current"` (a value
//!   or null), `sessions` `"nodes"` (one object per endpoint);
//! - a failure as [`super::output`] describes (`"ok":false`, `"kind"`,
//!   `"outcome"`, …), with `"key"`; an absent key for `get` is kind
//!   `not_found` with `"value":null`.
//!
//! Exit codes: [`super::output`] (0 success, 1 nothing executed, 2 usage,
//! 3 outcome unknown, 4 key conflict).

mod answer;
mod args;
mod sessions;

pub use args::{
    AppendArgs, CasArgs, DelArgs, IncrArgs, KeyArgs, KeyedArg, KvCommand, PutArgs, SessionsArgs,
};

use serde_json::{Value as Json, json};

use oncekv_client::{Client, ClientConfig};

use super::CommonArgs;
use super::output::{Failure, Success, print_report, success};
use super::values::{value_json, value_lines};
use answer::{command_success, keyed_success};
use args::KvRequest;

impl KvCommand {
    /// Runs the command, prints its result (stdout) or error (stderr), and
    /// returns the process exit code.
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let report = self.execute(common).await;
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        print_report(&mut stdout.lock(), &mut stderr.lock(), common.json, report)
    }

    async fn execute(&self, common: &CommonArgs) -> Result<Success, Failure> {
        let endpoints = common.endpoints()?;
        let Some(request) = self.request()? else {
            return sessions::sessions(&endpoints, common.timeout()).await;
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
        let result = call(&client, request, self.idempotency_key()).await;
        // Unregister, so the CLI leaves no session behind (a no-op when no
        // session was registered, as for `get`).
        client.close().await;
        match result {
            Err(failure) if failure.kind() == "unavailable" => {
                Err(failure.explained(&endpoints, common.timeout()).await)
            }
            other => other,
        }
    }
}

/// Runs `request` through `client`: with a session (exactly once, the
/// library's retries), or with `idempotency_key` through
/// [`Client::execute_with_key`] (no session; a replay is marked).
async fn call(
    client: &Client,
    request: KvRequest,
    idempotency_key: Option<&str>,
) -> Result<Success, Failure> {
    let (key, command) = match request {
        KvRequest::Get { key } => return get(client, key).await,
        KvRequest::Execute { key, command } => (key, command),
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
    keyed_success(&key, &command, idempotency_key, reply)
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
