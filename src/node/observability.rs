//! How a node shows itself to operators: the Prometheus endpoint (a small
//! HTTP server answering `GET /metrics`, HTTPS when the node has TLS), the
//! gRPC health status and the
//! watcher that counts elections and keeps health current. The metrics
//! themselves live in `crate::metrics`; this module only serves and feeds
//! them, and changes nothing in Raft or the registry.
//!
//! Health (`grpc.health.v1.Health` on the client port): the overall service
//! `""` and `oncekv.v1.Client` are `SERVING` once this node has applied the
//! cluster id and knows a leader (itself or another: a follower answers
//! `NOT_LEADER` with the leader's address, which is service), and
//! `NOT_SERVING` otherwise — before bootstrap, during an election, or when
//! it has lost touch with the leader.

use crate::metrics::{CONTENT_TYPE, NodeMetrics};
use crate::network::leader_contact::LeaderContact;
use crate::network::tls::NodeTls;
use crate::raft_types::{NodeId, Raft};
use crate::shared::SharedState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use openraft::async_runtime::WatchReceiver;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The health service name of the client API.
pub const CLIENT_SERVICE_NAME: &str = "oncekv.v1.Client";

#[derive(Clone)]
struct Scrape {
    raft: Raft,
    state: SharedState,
    metrics: Arc<NodeMetrics>,
    contact: LeaderContact,
}

async fn scrape(State(scrape): State<Scrape>) -> impl IntoResponse {
    let mut raft_metrics = scrape.raft.metrics().borrow_watched().clone();
    // The leader gauge names the leader this node hears from, as `Status`.
    raft_metrics.current_leader = scrape.contact.leader_of(&raft_metrics);
    // The newest hash, never one computed for this scrape (see
    // SharedState::latest_hash).
    let hash = scrape.state.latest_hash();
    let registry = scrape.state.registry();
    let hashes = scrape.state.hash_computations();
    scrape
        .metrics
        .refresh(&raft_metrics, &registry, hash.as_ref(), hashes);
    if let Some(records) = scrape.state.records() {
        scrape
            .metrics
            .set_record_store_disk_bytes(records.disk_bytes());
    }
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        scrape.metrics.encode(),
    )
}

/// Binds `addr` now (so a taken port fails the start) and returns the
/// server, which serves `GET /metrics` until `shutdown` completes: over
/// HTTPS with the node's certificate when the node has TLS (no client
/// certificate asked: a scraper needs only the cluster CA), plain HTTP
/// otherwise.
pub async fn metrics_server(
    addr: SocketAddr,
    raft: Raft,
    state: SharedState,
    metrics: Arc<NodeMetrics>,
    contact: LeaderContact,
    tls: Option<NodeTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<impl Future<Output = std::io::Result<()>>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(Scrape {
            raft,
            state,
            metrics,
            contact,
        });
    Ok(async move {
        match tls {
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
            Some(tls) => {
                crate::network::http_api::serve(
                    listener,
                    Some(tls),
                    app,
                    crate::network::http_api::HttpLimits::default(),
                    shutdown,
                )
                .await;
                Ok(())
            }
        }
    })
}

/// Whether the node can serve clients: it has the cluster id and hears
/// from a leader (itself, or one it heard from lately).
fn serving(raft: &Raft, state: &SharedState, contact: &LeaderContact) -> bool {
    let has_leader = contact
        .leader_of(&raft.metrics().borrow_watched())
        .is_some();
    has_leader && state.read().registry.cluster_id().is_some()
}

/// Watches Raft's metrics until the node stops: counts term changes and
/// the times this node became leader, and keeps the health status current.
/// Also wakes once a second, since the cluster id arrives by apply.
pub async fn watch(
    node_id: NodeId,
    raft: Raft,
    state: SharedState,
    metrics: Arc<NodeMetrics>,
    health: HealthReporter,
    contact: LeaderContact,
) {
    // Role, vote and leader changes only: openraft's full metrics change on
    // nearly every step of its core, and this needs none of those.
    let mut changes = raft.server_metrics();
    let (mut term, mut leading) = {
        let now = changes.borrow_watched();
        (
            now.vote.leader_id().term,
            now.state == openraft::ServerState::Leader,
        )
    };
    let mut last_health = None;
    loop {
        let (now_term, now_leading) = {
            let now = changes.borrow_and_update();
            (
                now.vote.leader_id().term,
                now.state == openraft::ServerState::Leader,
            )
        };
        if now_term != term {
            metrics.term_changes.inc();
            term = now_term;
        }
        if now_leading && !leading {
            metrics.became_leader.inc();
            tracing::info!(node_id, term, "became leader");
        }
        leading = now_leading;
        let status = if serving(&raft, &state, &contact) {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last_health != Some(status) {
            health.set_service_status("", status).await;
            health.set_service_status(CLIENT_SERVICE_NAME, status).await;
            tracing::info!(node_id, health = %status, "health status");
            last_health = Some(status);
        }
        match tokio::time::timeout(Duration::from_secs(1), changes.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            // Raft has shut down.
            Ok(Err(_)) => return,
        }
    }
}
