//! `oncekv admin claims …`: the operator's view of claims (rule 20) over
//! the Admin `ListClaims`, `GetClaim` and `ForgetClaim` RPCs — listing the
//! live claim records, showing one, forgetting one through the log (a
//! stuck or mistaken key becomes claimable anew, with a larger fence: its
//! old holders stay fenced). It owns the arguments (a key as UTF-8 text,
//! or hex with `--hex`, as `admin keys` takes them) and the presentation —
//! a result `oncekv once` recorded is shown decoded (exit code, stdout);
//! finding the leader, retries and errors are `super::cluster`'s, and the
//! cluster decides everything else.
//!
//! | command | does |
//! | --- | --- |
//! | `claims list [--after-principal P --after-key K] [--limit N] [--hex]` | live claim records of the leader's applied state, ordered by (principal, key) |
//! | `claims show [--principal P] KEY [--hex]` | one record: state (held with its lease, released, completed), fence, attempt, expiry, size, the recorded result |
//! | `claims forget [--principal P] KEY [--hex]` | removes the record through the log |

use serde_json::{Map, Value as Json, json};

use super::cluster::Admin;
use super::keys::{KeyRef, ListArgs, key_bytes, key_field, principal_text};
use crate::cli::once::record::Record;
use crate::cli::output::{Failure, Success, success};
use crate::cli::values::{bytes_text, hex};
use oncekv_wire::proto;

/// Most records one `ListClaims` call returns (the node's page limit).
const PAGE_MAX: u32 = 1000;

/// `oncekv admin claims SUBCOMMAND`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClaimsArgs {
    #[command(subcommand)]
    pub action: ClaimsAction,
}

/// The `admin claims` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClaimsAction {
    /// List the live claim records of the leader's applied state, ordered
    /// by (principal, key): state, fence, attempt, expiry, size, result.
    List(ListArgs),
    /// Show one claim record (the result `oncekv once` recorded decoded).
    Show(KeyRef),
    /// Remove a claim record through the log: the key may be claimed anew,
    /// with a larger fence (its old holders stay fenced).
    Forget(KeyRef),
}

impl ClaimsAction {
    pub(super) async fn execute(&self, admin: &Admin) -> Result<Success, Failure> {
        match self {
            ClaimsAction::List(args) => {
                let after_key = match &args.after_key {
                    Some(key) => key_bytes(key, args.hex)?,
                    None => Vec::new(),
                };
                list(admin, &args.after_principal, after_key, args.limit).await
            }
            ClaimsAction::Show(args) => {
                show(admin, &args.principal, key_bytes(&args.key, args.hex)?).await
            }
            ClaimsAction::Forget(args) => {
                forget(admin, &args.principal, key_bytes(&args.key, args.hex)?).await
            }
        }
    }
}

/// Milliseconds as seconds with three decimals.
fn seconds(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// The record's state for people: `held (lease until 1234, 0.800s left)`,
/// `released at 1234`, `completed at 1234`.
fn state_text(info: &proto::ClaimInfo, cluster_time_ms: u64) -> String {
    match info.state.as_str() {
        "held" if info.at_ms > cluster_time_ms => format!(
            "held (lease until {}, {} left)",
            info.at_ms,
            seconds(info.at_ms - cluster_time_ms)
        ),
        "held" => format!(
            "held (lease ran out at {}: the next claim takes over)",
            info.at_ms
        ),
        state => format!("{state} at {}", info.at_ms),
    }
}

/// A completed record's result in one line: `once exit 0, stdout "ran\n"`
/// for a result `oncekv once` recorded, else its bytes (text or 0x-hex).
fn result_text(result: &[u8]) -> String {
    match Record::decode(result) {
        Ok(record) => {
            let stdout = match std::str::from_utf8(&record.stdout) {
                Ok(text) => format!("{text:?}"),
                Err(_) => format!("0x{}", hex(&record.stdout)),
            };
            let cut = if record.truncated { " (truncated)" } else { "" };
            format!("once exit {}, stdout {stdout}{cut}", record.exit_code)
        }
        Err(_) => bytes_text(result),
    }
}

/// `claim deploy-7  principal (anonymous)  state completed at 5000  fence
/// 17  attempt 2  expires_after 86405000  size 140 bytes  result …`.
fn claim_line(info: &proto::ClaimInfo, cluster_time_ms: u64) -> String {
    let mut line = format!(
        "claim {}  principal {}  state {}  fence {}  attempt {}  expires_after {}  size {} bytes",
        bytes_text(&info.key),
        principal_text(&info.principal),
        state_text(info, cluster_time_ms),
        info.fence,
        info.attempt,
        info.expires_after_ms,
        info.size_bytes,
    );
    if info.state == "completed" {
        line.push_str("  result ");
        line.push_str(&result_text(&info.result));
    }
    line
}

fn claim_json(info: &proto::ClaimInfo, cluster_time_ms: u64) -> Json {
    let mut object = Map::new();
    object.insert("principal".to_owned(), json!(info.principal));
    let (name, key) = key_field("key", &info.key);
    object.insert(name, key);
    object.insert("state".to_owned(), json!(info.state));
    object.insert("at_ms".to_owned(), json!(info.at_ms));
    if info.state == "held" {
        object.insert(
            "lease_ms_left".to_owned(),
            json!(info.at_ms.saturating_sub(cluster_time_ms)),
        );
    }
    object.insert("fence".to_owned(), json!(info.fence));
    object.insert("attempt".to_owned(), json!(info.attempt));
    object.insert("fingerprint".to_owned(), json!(hex(&info.fingerprint)));
    object.insert("expires_after_ms".to_owned(), json!(info.expires_after_ms));
    object.insert("size_bytes".to_owned(), json!(info.size_bytes));
    if info.state == "completed" {
        let (name, result) = key_field("result", &info.result);
        object.insert(name, result);
        if let Ok(record) = Record::decode(&info.result) {
            let (name, stdout) = key_field("stdout", &record.stdout);
            let mut once = Map::new();
            once.insert("exit_code".to_owned(), json!(record.exit_code));
            once.insert(name, stdout);
            once.insert("stdout_truncated".to_owned(), json!(record.truncated));
            object.insert("once".to_owned(), Json::Object(once));
        }
    }
    Json::Object(object)
}

/// The live claim records of the leader's applied state after
/// (`after_principal`, `after_key`), page by page, at most `limit`
/// (default: all).
async fn list(
    admin: &Admin,
    after_principal: &str,
    after_key: Vec<u8>,
    limit: Option<u64>,
) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let (mut principal, mut key) = (after_principal.to_owned(), after_key);
    let mut all: Vec<proto::ClaimInfo> = Vec::new();
    let (applied_index, cluster_time_ms, more) = loop {
        let wanted = limit.map_or(u64::from(PAGE_MAX), |limit| limit - all.len() as u64);
        let request = proto::ListClaimsRequest {
            after_principal: principal.clone(),
            after_key: key.clone(),
            limit: u32::try_from(wanted.min(u64::from(PAGE_MAX))).unwrap_or(PAGE_MAX),
        };
        let page = admin
            .at(&leader, |mut client| async move {
                client.list_claims(request).await
            })
            .await?;
        all.extend(page.claims);
        let full = limit.is_some_and(|limit| all.len() as u64 >= limit);
        match all.last() {
            Some(last) if page.more && !full => {
                principal = last.principal.clone();
                key = last.key.clone();
            }
            _ => break (page.applied_index, page.cluster_time_ms, page.more),
        }
    };
    let mut lines: Vec<String> = all
        .iter()
        .map(|info| claim_line(info, cluster_time_ms))
        .collect();
    lines.push(format!(
        "{} claims (applied index {applied_index}, cluster time {cluster_time_ms})",
        all.len()
    ));
    let mut fields = Map::new();
    fields.insert("applied_index".to_owned(), json!(applied_index));
    fields.insert("cluster_time_ms".to_owned(), json!(cluster_time_ms));
    fields.insert(
        "claims".to_owned(),
        all.iter()
            .map(|info| claim_json(info, cluster_time_ms))
            .collect(),
    );
    fields.insert("more".to_owned(), json!(more));
    if let (true, Some(last)) = (more, all.last()) {
        let (hex_flag, key_arg) = match std::str::from_utf8(&last.key) {
            Ok(text) => ("", text.to_owned()),
            Err(_) => (" --hex", hex(&last.key)),
        };
        lines.push(format!(
            "more claims follow: --after-principal {:?} --after-key {key_arg:?}{hex_flag}",
            last.principal
        ));
        let (name, value) = key_field("after_key", &last.key);
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

/// One claim record in the leader's applied state.
async fn show(admin: &Admin, principal: &str, key: Vec<u8>) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let request = proto::GetClaimRequest {
        principal: principal.to_owned(),
        key: key.clone(),
    };
    let reply = admin
        .at(&leader, |mut client| async move {
            client.get_claim(request).await
        })
        .await?;
    match reply.claim {
        Some(info) => Ok(success(
            vec![claim_line(&info, reply.cluster_time_ms)],
            [
                ("applied_index", json!(reply.applied_index)),
                ("cluster_time_ms", json!(reply.cluster_time_ms)),
                ("claim", claim_json(&info, reply.cluster_time_ms)),
            ],
        )),
        None => {
            let (name, value) = key_field("key", &key);
            Err(Failure::new(
                "not_found",
                format!(
                    "no live claim record of key {} of principal {} (applied index {})",
                    bytes_text(&key),
                    principal_text(principal),
                    reply.applied_index
                ),
            )
            .with("principal", json!(principal))
            .with(&name, value)
            .with("applied_index", json!(reply.applied_index))
            .with("claim", Json::Null))
        }
    }
}

/// Forgets one claim record through the log (on the leader).
async fn forget(admin: &Admin, principal: &str, key: Vec<u8>) -> Result<Success, Failure> {
    let cluster_id = admin.cluster_id().await?;
    let request = proto::ForgetClaimRequest {
        cluster_id,
        principal: principal.to_owned(),
        key: key.clone(),
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.forget_claim(request).await }
        })
        .await?;
    let verdict = if reply.existed {
        "forgotten: the key may be claimed anew, with a larger fence"
    } else {
        "had no record"
    };
    let (name, value) = key_field("key", &key);
    let mut fields = Map::new();
    fields.insert("principal".to_owned(), json!(principal));
    fields.insert(name, value);
    fields.insert("existed".to_owned(), json!(reply.existed));
    fields.insert("log_index".to_owned(), json!(reply.log_index));
    Ok(Success {
        lines: vec![format!(
            "claim {} of principal {} {verdict} (index {})",
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

    fn parse(args: &[&str]) -> Result<ClaimsAction, clap::Error> {
        let args = ["oncekv", "admin", "claims"]
            .into_iter()
            .chain(args.iter().copied());
        match Cli::try_parse_checked(args)?.command {
            Command::Admin(admin) => match admin.command {
                AdminCommand::Claims(claims) => Ok(claims.action),
                other => panic!("not admin claims: {other:?}"),
            },
            other => panic!("not an admin command: {other:?}"),
        }
    }

    /// The subcommands parse as `admin keys`' do.
    #[test]
    fn subcommands_parse() {
        let Ok(ClaimsAction::List(list)) = parse(&["list", "--limit", "3"]) else {
            panic!("list parses");
        };
        assert_eq!(list.limit, Some(3));
        let Ok(ClaimsAction::Show(show)) = parse(&["show", "--principal", "bob", "job-1"]) else {
            panic!("show parses");
        };
        assert_eq!(
            (show.principal.as_str(), show.key.as_str()),
            ("bob", "job-1")
        );
        let Ok(ClaimsAction::Forget(forget)) = parse(&["forget", "--hex", "ff00"]) else {
            panic!("forget parses");
        };
        assert!(forget.hex);
        for bad in [&["show"][..], &["forget"], &["list", "--limit", "0"]] {
            let error = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
    }

    /// A record prints on one line — a held one with its lease left, a
    /// completed one with its result, decoded when `once` recorded it —
    /// and as JSON.
    #[test]
    fn records_print() {
        let record = Record {
            exit_code: 0,
            stdout: b"ran\n".to_vec(),
            truncated: false,
        };
        let completed = proto::ClaimInfo {
            principal: String::new(),
            key: b"job-1".to_vec(),
            fingerprint: vec![0; 16],
            fence: 17,
            attempt: 2,
            state: "completed".into(),
            at_ms: 5_000,
            result: record.encode(),
            expires_after_ms: 86_405_000,
            size_bytes: 140,
        };
        assert_eq!(
            claim_line(&completed, 6_000),
            "claim job-1  principal (anonymous)  state completed at 5000  fence 17  attempt 2  \
             expires_after 86405000  size 140 bytes  result once exit 0, stdout \"ran\\n\""
        );
        let object = claim_json(&completed, 6_000);
        assert_eq!(object["key"], "job-1");
        assert_eq!(object["state"], "completed");
        assert_eq!(object["once"]["exit_code"], 0);
        assert_eq!(object["once"]["stdout"], "ran\n");
        assert!(object.get("lease_ms_left").is_none());

        let held = proto::ClaimInfo {
            state: "held".into(),
            at_ms: 6_800,
            result: Vec::new(),
            ..completed.clone()
        };
        assert!(
            claim_line(&held, 6_000).contains("state held (lease until 6800, 0.800s left)"),
            "{}",
            claim_line(&held, 6_000)
        );
        assert_eq!(claim_json(&held, 6_000)["lease_ms_left"], 800);
        assert!(claim_line(&held, 7_000).contains("lease ran out"));
        let foreign = proto::ClaimInfo {
            result: b"charged 10 EUR".to_vec(),
            ..completed
        };
        assert!(claim_line(&foreign, 0).ends_with("result charged 10 EUR"));
        assert!(claim_json(&foreign, 0).get("once").is_none());
    }
}
