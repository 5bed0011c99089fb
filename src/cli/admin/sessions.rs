//! `oncekv admin sessions | session ID | expire ID`: the registry's live
//! sessions as the leader's applied state holds them (listed page by page),
//! one session's floor, cache and activity, and ending a session through
//! the log (its client then gets `SESSION_EXPIRED`). It owns the
//! presentation; the leader and retries are `Admin`'s.

use serde_json::{Value as Json, json};

use oncekv_wire::proto;

use super::cluster::Admin;
use crate::cli::output::{Failure, Success, success};

/// `session ID`, `expire ID`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionArgs {
    /// The session's client id.
    pub client_id: u64,
}

fn session_line(session: &proto::SessionInfo) -> String {
    format!(
        "client {}  floor {}  cached {} ({} bytes)  last_activity {}  idle {}.{:03}s",
        session.client_id,
        session.floor,
        session.cached_responses,
        session.cached_bytes,
        session.last_activity_ms,
        session.idle_ms / 1000,
        session.idle_ms % 1000,
    )
}

fn session_json(session: &proto::SessionInfo) -> Json {
    json!({
        "client_id": session.client_id,
        "floor": session.floor,
        "cached_responses": session.cached_responses,
        "cached_bytes": session.cached_bytes,
        "last_activity_ms": session.last_activity_ms,
        "idle_ms": session.idle_ms,
    })
}

/// Every live session of the leader's applied state, page by page.
pub(super) async fn sessions(admin: &Admin) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let mut after_client_id = 0;
    let mut all = Vec::new();
    let applied_index = loop {
        let request = proto::ListSessionsRequest {
            after_client_id,
            limit: 0,
        };
        let page = admin
            .at(&leader, |mut client| async move {
                client.list_sessions(request).await
            })
            .await?;
        all.extend(page.sessions);
        match all.last() {
            Some(last) if page.more => after_client_id = last.client_id,
            _ => break page.applied_index,
        }
    };
    let mut lines: Vec<String> = all.iter().map(session_line).collect();
    lines.push(format!(
        "{} sessions (applied index {applied_index})",
        all.len()
    ));
    Ok(success(
        lines,
        [
            ("applied_index", json!(applied_index)),
            ("sessions", all.iter().map(session_json).collect()),
        ],
    ))
}

pub(super) async fn session(admin: &Admin, client_id: u64) -> Result<Success, Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let session = admin
        .at(&leader, |mut client| async move {
            client
                .get_session(proto::GetSessionRequest { client_id })
                .await
        })
        .await?;
    Ok(success(
        vec![session_line(&session)],
        [("session", session_json(&session))],
    ))
}

pub(super) async fn expire(admin: &Admin, client_id: u64) -> Result<Success, Failure> {
    let cluster_id = admin.cluster_id().await?;
    let request = proto::ExpireSessionRequest {
        cluster_id,
        client_id,
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.expire_session(request).await }
        })
        .await?;
    Ok(success(
        vec![format!(
            "session {client_id} expired at index {}",
            reply.log_index
        )],
        [
            ("client_id", json!(client_id)),
            ("log_index", json!(reply.log_index)),
        ],
    ))
}
