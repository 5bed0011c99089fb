//! `oncekv health`: one `grpc.health.v1.Health/Check` call to each asked
//! node, for a container's or a supervisor's health check, or a person
//! checking a cluster. It owns the call's deadline, which nodes are asked
//! (`--endpoint`, else the common endpoints) and the answer's presentation;
//! it never retries and judges nothing beyond what each node's health
//! service says (see the node's `observability` module for when a node is
//! `SERVING`).

use std::time::Duration;

use serde::Serialize;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::CommonArgs;
use super::output::{EXIT_FAILED, EXIT_OK};

/// Arguments of `oncekv health`, for the binary's argument parser.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// The one node to ask, host:port (a container's own node) [default:
    /// every node of --endpoints, or of the local cluster at
    /// ONCEKV_PORT_BASE]
    #[arg(long, env = "ONCEKV_HEALTH_ENDPOINT")]
    pub endpoint: Option<String>,
    /// The service asked about: "oncekv.v1.Client", or "" for the server.
    #[arg(long, default_value = crate::node::observability::CLIENT_SERVICE_NAME)]
    pub service: String,
}

/// Deadline of each call, connecting included, unless `--timeout-ms` says.
const TIMEOUT_MS_DEFAULT: u64 = 2_000;

/// One node's answer, as `--json` prints it.
#[derive(Debug, Serialize)]
struct NodeHealth {
    endpoint: String,
    /// `SERVING`, `NOT_SERVING`, `SERVICE_UNKNOWN` (the node has no such
    /// service) or `UNREACHABLE`.
    status: &'static str,
    /// Why there is no answer, when `UNREACHABLE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl NodeHealth {
    fn serving(&self) -> bool {
        self.status == ServingStatus::Serving.as_str_name()
    }

    /// The plain-text answer: the status, and why when there is none.
    fn describe(&self) -> String {
        match &self.error {
            Some(error) => format!("{} ({error})", self.status),
            None => self.status.to_owned(),
        }
    }
}

impl HealthArgs {
    /// Asks every node (in the order given, at once), prints each answer on
    /// stdout — alone when one node was asked, after its endpoint when
    /// several were, or one JSON object with `--json` — and returns the exit
    /// code: 0 only when every node answered `SERVING`. `--timeout-ms`
    /// bounds each call, connecting included [default: 2000].
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let endpoints = match &self.endpoint {
            Some(endpoint) => vec![endpoint.clone()],
            None => match common.endpoints() {
                Ok(endpoints) => endpoints,
                Err(failure) => return failure.print_to_stderr(),
            },
        };
        let timeout = common.timeout_or(TIMEOUT_MS_DEFAULT);
        let answers = futures::future::join_all(
            endpoints
                .iter()
                .map(|endpoint| ask(endpoint, &self.service, timeout)),
        )
        .await;
        let healthy = answers.iter().all(NodeHealth::serving);
        if common.json {
            let object = serde_json::json!({ "ok": healthy, "nodes": answers });
            println!("{object}");
        } else if let [only] = &answers[..] {
            println!("{}", only.describe());
        } else {
            for answer in &answers {
                println!("{} {}", answer.endpoint, answer.describe());
            }
        }
        if healthy { EXIT_OK } else { EXIT_FAILED }
    }
}

/// Asks `endpoint` about `service` within `timeout`.
async fn ask(endpoint: &str, service: &str, timeout: Duration) -> NodeHealth {
    let unreachable = |error: String| NodeHealth {
        endpoint: endpoint.to_owned(),
        status: "UNREACHABLE",
        error: Some(error),
    };
    match tokio::time::timeout(timeout, check(endpoint, service, timeout)).await {
        Ok(Ok(status)) => NodeHealth {
            endpoint: endpoint.to_owned(),
            status: status.as_str_name(),
            error: None,
        },
        // The health service answers NOT_FOUND for a service it does not
        // know: the node is reachable, the question is wrong.
        Ok(Err(CheckError::Answered(status))) if status.code() == tonic::Code::NotFound => {
            NodeHealth {
                endpoint: endpoint.to_owned(),
                status: ServingStatus::ServiceUnknown.as_str_name(),
                error: Some(format!("the node has no service {service:?}")),
            }
        }
        Ok(Err(error)) => unreachable(error.to_string()),
        Err(_) => unreachable(format!("no answer within {timeout:?}")),
    }
}

/// Why a `Check` has no status.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The endpoint or the credentials are unusable, or no connection
    /// (said as its cause: "connection refused", "unknown host", ...).
    #[error("{}", super::reach::cause_of(.0.as_ref()))]
    Connect(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The node answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Answered(tonic::Status),
}

/// One `Check` of `service` at `endpoint` (`host:port` or a full URI).
pub async fn check(
    endpoint: &str,
    service: &str,
    timeout: Duration,
) -> Result<ServingStatus, CheckError> {
    // Over TLS when --ca or ONCEKV_CA names the cluster CA (health asks
    // for no identity).
    let endpoint = if endpoint.contains("://") {
        Endpoint::from_shared(endpoint.to_owned())
            .map_err(|error| CheckError::Connect(error.into()))?
    } else {
        oncekv_client::credentials::Credentials::process_default()
            .endpoint(endpoint)
            .map_err(|error| CheckError::Connect(error.into()))?
    };
    let channel = endpoint
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|error| CheckError::Connect(error.into()))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(CheckError::Answered)?;
    Ok(reply.into_inner().status())
}
