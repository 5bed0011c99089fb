//! `oncekv health`: one `grpc.health.v1.Health/Check` call to one node, for
//! a container's or a supervisor's health check. It owns the call's deadline
//! and the one-word answer; it never retries and judges nothing beyond what
//! the node's health service says (see the node's `observability` module
//! for when a node is `SERVING`).

use std::time::Duration;

use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Arguments of `oncekv health`, for the binary's argument parser.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// The node's client endpoint, host:port.
    #[arg(long, env = "ONCEKV_HEALTH_ENDPOINT", default_value = "127.0.0.1:7101")]
    pub endpoint: String,
    /// The service asked about: "oncekv.v1.Client", or "" for the server.
    #[arg(long, default_value = crate::node::observability::CLIENT_SERVICE_NAME)]
    pub service: String,
}

/// Deadline of the call, connecting included, unless `--timeout-ms` says.
const TIMEOUT_MS_DEFAULT: u64 = 2_000;

impl HealthArgs {
    /// Prints the node's answer (`SERVING`, `NOT_SERVING`, ...) or why there
    /// is none, on stdout; true only when the answer is `SERVING`.
    /// `timeout_ms` (the global `--timeout-ms`) bounds the call, connecting
    /// included [default: 2000].
    pub async fn run(&self, timeout_ms: Option<u64>) -> bool {
        let timeout = Duration::from_millis(timeout_ms.unwrap_or(TIMEOUT_MS_DEFAULT));
        match tokio::time::timeout(timeout, check(&self.endpoint, &self.service, timeout)).await {
            Ok(Ok(status)) => {
                println!("{}", status.as_str_name());
                status == ServingStatus::Serving
            }
            Ok(Err(error)) => {
                println!("unreachable ({error:#})");
                false
            }
            Err(_) => {
                println!("unreachable (no answer within {timeout:?})");
                false
            }
        }
    }
}

/// One `Check` of `service` at `endpoint` (`host:port` or a full URI).
pub async fn check(
    endpoint: &str,
    service: &str,
    timeout: Duration,
) -> anyhow::Result<ServingStatus> {
    // Over TLS when --ca or ONCEKV_CA names the cluster CA (health asks
    // for no identity).
    let endpoint = if endpoint.contains("://") {
        Endpoint::from_shared(endpoint.to_owned())?
    } else {
        oncekv_client::credentials::Credentials::process_default().endpoint(endpoint)?
    };
    let channel = endpoint
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))?;
    Ok(reply.into_inner().status())
}
