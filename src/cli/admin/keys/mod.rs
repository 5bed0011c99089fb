//! `oncekv admin keys …`: the operator's view of idempotency keys (rule
//! 18) over the Admin `ListKeys`, `GetKey` and `ForgetKey` RPCs — listing
//! the live keys, showing one key's record, forgetting one through the log.
//! It owns the arguments (a key as UTF-8 text, or hex with `--hex`) and the
//! presentation; finding the leader, retries and errors are
//! `super::cluster`'s, how a record prints `record`'s, and the cluster
//! decides everything else.
//!
//! | command | does |
//! | --- | --- |
//! | `keys list [--after-principal P --after-key K] [--limit N] [--hex]` | live keys of the leader's applied state, ordered by (principal, key), from after (P, K), at most N (default: all) |
//! | `keys show [--principal P] KEY [--hex]` | one key's record: when it first executed, when it expires, its size, the cached answer |
//! | `keys forget [--principal P] KEY [--hex]` | removes the key's record through the log: a later request with it executes anew |
//!
//! Keys print as the CLI prints other byte strings: text when valid UTF-8,
//! else `0x` and hex (in JSON, `"idempotency_key"` or
//! `"idempotency_key_hex"`); `--hex` takes KEY (and `--after-key`) in hex,
//! with or without the `0x`, so a key listed as `0x…` can be named. The
//! principal is the key's namespace (rule 19): `--principal` defaults to
//! the empty, anonymous one (a node without authentication), shown as
//! `(anonymous)`.

use serde_json::{Map, Value as Json, json};

mod record;

use super::cluster::Admin;
use crate::cli::output::{Failure, Success, success};
use crate::cli::values::{bytes_text, hex};
use oncekv_wire::proto;
pub(super) use record::principal_text;
use record::{key_json, key_line};

/// Most keys one `ListKeys` call returns (the node's page limit).
const PAGE_MAX: u32 = 1000;

/// `oncekv admin keys SUBCOMMAND`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub action: KeysAction,
}

/// The `admin keys` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum KeysAction {
    /// List the live idempotency keys of the leader's applied state, ordered
    /// by (principal, key): when each first executed, when it expires, its
    /// size and cached answer.
    List(ListArgs),
    /// Show one idempotency key's record.
    Show(KeyRef),
    /// Remove an idempotency key's record through the log: a later request
    /// with the key executes anew.
    Forget(KeyRef),
}

/// `keys list [--after-principal P --after-key K] [--limit N] [--hex]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// Start after this principal's keys (with --after-key: after that key
    /// of it) [default: from the first].
    #[arg(long, value_name = "P", default_value = "", hide_default_value = true)]
    pub after_principal: String,
    /// Start after this key of --after-principal.
    #[arg(long, value_name = "K")]
    pub after_key: Option<String>,
    /// List at most N keys [default: all].
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub limit: Option<u64>,
    /// --after-key is hex (with or without 0x).
    #[arg(long)]
    pub hex: bool,
}

/// `keys show|forget [--principal P] KEY [--hex]`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyRef {
    /// The idempotency key: UTF-8 text, or hex with --hex.
    #[arg(allow_hyphen_values = true)]
    pub key: String,
    /// The principal whose key it is [default: the anonymous one, a node
    /// without authentication].
    #[arg(long, value_name = "P", default_value = "", hide_default_value = true)]
    pub principal: String,
    /// KEY is hex (with or without 0x), as `keys list` shows a key that is
    /// not UTF-8.
    #[arg(long)]
    pub hex: bool,
}

impl KeysAction {
    pub(super) async fn execute(&self, admin: &Admin) -> Result<Success, Failure> {
        match self {
            KeysAction::List(args) => {
                let after_key = match &args.after_key {
                    Some(key) => key_bytes(key, args.hex)?,
                    None => Vec::new(),
                };
                list(admin, &args.after_principal, after_key, args.limit).await
            }
            KeysAction::Show(args) => {
                show(admin, &args.principal, key_bytes(&args.key, args.hex)?).await
            }
            KeysAction::Forget(args) => {
                forget(admin, &args.principal, key_bytes(&args.key, args.hex)?).await
            }
        }
    }
}

/// KEY's bytes: its UTF-8, or with `hex` the bytes its hex digits spell
/// (a leading `0x` allowed); bad hex is a usage error.
pub(super) fn key_bytes(text: &str, hex: bool) -> Result<Vec<u8>, Failure> {
    if !hex {
        return Ok(text.as_bytes().to_vec());
    }
    let digits = text.strip_prefix("0x").unwrap_or(text);
    let bad = || Failure::usage(format!("{text:?} is not hex (want pairs of 0-9a-f)"));
    if !digits.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..digits.len())
        .step_by(2)
        .map(|at| {
            digits
                .get(at..at + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// `"idempotency_key": text` when UTF-8, else `"idempotency_key_hex"`
/// (`prefix` names the field, e.g. `after_key`).
pub(super) fn key_field(prefix: &str, key: &[u8]) -> (String, Json) {
    match std::str::from_utf8(key) {
        Ok(text) => (prefix.to_owned(), json!(text)),
        Err(_) => (format!("{prefix}_hex"), json!(hex(key))),
    }
}

/// The live keys of the leader's applied state after (`after_principal`,
/// `after_key`), page by page, at most `limit` (default: all).
async fn list(
    admin: &Admin,
    after_principal: &str,
    after_key: Vec<u8>,
    limit: Option<u64>,
) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let (mut principal, mut key) = (after_principal.to_owned(), after_key);
    let mut all: Vec<proto::KeyInfo> = Vec::new();
    let (applied_index, more) = loop {
        let wanted = limit.map_or(u64::from(PAGE_MAX), |limit| limit - all.len() as u64);
        let request = proto::ListKeysRequest {
            after_principal: principal.clone(),
            after_key: key.clone(),
            limit: u32::try_from(wanted.min(u64::from(PAGE_MAX))).unwrap_or(PAGE_MAX),
        };
        let page = admin
            .at(&leader, |mut client| async move {
                client.list_keys(request).await
            })
            .await?;
        all.extend(page.keys);
        let full = limit.is_some_and(|limit| all.len() as u64 >= limit);
        match all.last() {
            Some(last) if page.more && !full => {
                principal = last.principal.clone();
                key = last.idempotency_key.clone();
            }
            _ => break (page.applied_index, page.more),
        }
    };
    let mut lines: Vec<String> = all.iter().map(key_line).collect();
    lines.push(format!(
        "{} keys (applied index {applied_index})",
        all.len()
    ));
    let mut fields = Map::new();
    fields.insert("applied_index".to_owned(), json!(applied_index));
    fields.insert("keys".to_owned(), all.iter().map(key_json).collect());
    fields.insert("more".to_owned(), json!(more));
    if let (true, Some(last)) = (more, all.last()) {
        let (hex_flag, key_arg) = match std::str::from_utf8(&last.idempotency_key) {
            Ok(text) => ("", text.to_owned()),
            Err(_) => (" --hex", hex(&last.idempotency_key)),
        };
        lines.push(format!(
            "more keys follow: --after-principal {:?} --after-key {key_arg:?}{hex_flag}",
            last.principal
        ));
        let (name, value) = key_field("after_key", &last.idempotency_key);
        fields.insert(
            "next".to_owned(),
            json!({ "after_principal": last.principal, name: value }),
        );
    }
    Ok(Success {
        lines,
        fields,
        notes: Vec::new(),
    })
}

/// One key's record in the leader's applied state.
async fn show(admin: &Admin, principal: &str, key: Vec<u8>) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let request = proto::GetKeyRequest {
        principal: principal.to_owned(),
        idempotency_key: key.clone(),
    };
    let reply = admin
        .at(&leader, |mut client| async move {
            client.get_key(request).await
        })
        .await?;
    match reply.key {
        Some(info) => Ok(success(
            vec![key_line(&info)],
            [
                ("applied_index", json!(reply.applied_index)),
                ("cluster_time_ms", json!(reply.cluster_time_ms)),
                ("key", key_json(&info)),
            ],
        )),
        None => {
            let (name, value) = key_field("idempotency_key", &key);
            Err(Failure::new(
                "not_found",
                format!(
                    "no live record of idempotency key {} of principal {} (applied index {})",
                    bytes_text(&key),
                    principal_text(principal),
                    reply.applied_index
                ),
            )
            .with("principal", json!(principal))
            .with(&name, value)
            .with("applied_index", json!(reply.applied_index))
            .with("key", Json::Null))
        }
    }
}

/// Forgets one key through the log (on the leader).
async fn forget(admin: &Admin, principal: &str, key: Vec<u8>) -> Result<Success, Failure> {
    let cluster_id = admin.cluster_id().await?;
    let request = proto::ForgetKeyRequest {
        cluster_id,
        principal: principal.to_owned(),
        idempotency_key: key.clone(),
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.forget_key(request).await }
        })
        .await?;
    let verdict = if reply.existed {
        "forgotten"
    } else {
        "had no record"
    };
    let (name, value) = key_field("idempotency_key", &key);
    let mut fields = Map::new();
    fields.insert("principal".to_owned(), json!(principal));
    fields.insert(name, value);
    fields.insert("existed".to_owned(), json!(reply.existed));
    fields.insert("log_index".to_owned(), json!(reply.log_index));
    Ok(Success {
        lines: vec![format!(
            "idempotency key {} of principal {} {verdict} (index {})",
            bytes_text(&key),
            principal_text(principal),
            reply.log_index
        )],
        fields,
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, admin::AdminCommand};

    fn parse(args: &[&str]) -> Result<KeysAction, clap::Error> {
        let args = ["oncekv", "admin", "keys"]
            .into_iter()
            .chain(args.iter().copied());
        match Cli::try_parse_checked(args)?.command {
            Command::Admin(admin) => match admin.command {
                AdminCommand::Keys(keys) => Ok(keys.action),
                other => panic!("not admin keys: {other:?}"),
            },
            other => panic!("not an admin command: {other:?}"),
        }
    }

    /// The subcommands parse as documented; the principal defaults to the
    /// anonymous one; a limit is at least 1; KEY is required.
    #[test]
    fn subcommands_parse() {
        let Ok(KeysAction::List(list)) = parse(&["list"]) else {
            panic!("list parses");
        };
        assert_eq!(
            (list.after_principal.as_str(), list.after_key, list.limit),
            ("", None, None)
        );
        let Ok(KeysAction::List(list)) = parse(&[
            "list",
            "--after-principal",
            "alice",
            "--after-key",
            "k1",
            "--limit",
            "5",
        ]) else {
            panic!("list with a cursor parses");
        };
        assert_eq!(list.after_principal, "alice");
        assert_eq!(list.after_key.as_deref(), Some("k1"));
        assert_eq!(list.limit, Some(5));
        let Ok(KeysAction::Show(show)) = parse(&["show", "--principal", "bob", "order-1"]) else {
            panic!("show parses");
        };
        assert_eq!(
            (show.principal.as_str(), show.key.as_str()),
            ("bob", "order-1")
        );
        let Ok(KeysAction::Forget(forget)) = parse(&["forget", "--hex", "0xff00"]) else {
            panic!("forget parses");
        };
        assert_eq!((forget.principal.as_str(), forget.hex), ("", true));
        for bad in [
            &["list", "--limit", "0"][..],
            &["show"],
            &["forget"],
            &["drop", "k"],
        ] {
            let error = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
    }

    /// KEY is its UTF-8 bytes, or with --hex the bytes its digits spell;
    /// a key shown as 0x-hex names the same bytes back.
    #[test]
    fn keys_are_text_or_hex() {
        assert_eq!(key_bytes("ab", false).unwrap(), b"ab");
        assert_eq!(key_bytes("0xff00", true).unwrap(), [0xff, 0x00]);
        assert_eq!(key_bytes("FF00", true).unwrap(), [0xff, 0x00]);
        let shown = bytes_text(&[0xfe, 0x01]);
        assert_eq!(key_bytes(&shown, true).unwrap(), [0xfe, 0x01]);
        for bad in ["abc", "0xzz", "é1"] {
            assert_eq!(
                key_bytes(bad, true).unwrap_err().message(),
                format!("{bad:?} is not hex (want pairs of 0-9a-f)")
            );
        }
        assert_eq!(
            key_field("idempotency_key", b"k"),
            ("idempotency_key".into(), json!("k"))
        );
        assert_eq!(
            key_field("idempotency_key", &[0xff]),
            ("idempotency_key_hex".into(), json!("ff"))
        );
    }
}
