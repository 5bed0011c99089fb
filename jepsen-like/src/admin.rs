//! The harness's use of the nodes' Admin service (on each node's client
//! port): per-node state hashes and local reads for the final check, the
//! registry config for the short-TTL phase, and lost replies
//! (`InjectFault`, fault-injection builds only). On a TLS cluster it
//! connects with the cluster CA and shows an admin principal's token. It
//! only calls; deciding when is the runner's job.

use std::time::Duration;

use anyhow::{Context, bail};
use oncekv_client::credentials::{AuthChannel, Credentials};
use oncekv_wire::proto::{self, admin_client::AdminClient};
use tokio::time::Instant;

/// Deadline of one Admin call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the Admin service of the server under test offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AdminCapabilities {
    /// StateHash, LocalRead, GetConfig / SetConfig.
    pub admin: bool,
    /// InjectFault (a fault-injection build).
    pub inject_fault: bool,
}

/// Admin clients of every node, by client endpoint.
#[derive(Clone)]
pub struct Admin {
    endpoints: Vec<(u64, String)>,
    clients: Vec<AdminClient<AuthChannel>>,
    credentials: Credentials,
}

impl Admin {
    /// Lazily connected clients of `endpoints` (node id, `host:port`),
    /// showing `credentials` (an admin principal's on a TLS cluster).
    pub fn new(endpoints: Vec<(u64, String)>, credentials: &Credentials) -> anyhow::Result<Admin> {
        let clients = endpoints
            .iter()
            .map(|(_, addr)| {
                Ok(AdminClient::new(
                    credentials.wrap(
                        credentials
                            .endpoint(addr)?
                            .connect_timeout(Duration::from_secs(1))
                            .tcp_nodelay(true)
                            .connect_lazy(),
                    ),
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Admin {
            endpoints,
            clients,
            credentials: credentials.clone(),
        })
    }

    fn client(&self, node: u64) -> anyhow::Result<AdminClient<AuthChannel>> {
        let index = self
            .endpoints
            .iter()
            .position(|(id, _)| *id == node)
            .with_context(|| format!("no node {node}"))?;
        Ok(self.clients[index].clone())
    }

    /// Probes what `node` offers: an unimplemented service or RPC is
    /// "not offered", any other failure an error.
    pub async fn probe(&self, node: u64) -> anyhow::Result<AdminCapabilities> {
        let mut client = self.client(node)?;
        let admin = match within(client.get_config(proto::GetConfigRequest {})).await {
            Ok(_) => true,
            Err(status) if status.code() == tonic::Code::Unimplemented => false,
            Err(status) => bail!("Admin.GetConfig on node {node}: {status}"),
        };
        let inject_fault = admin
            && match within(client.inject_fault(proto::InjectFaultRequest {
                drop_execute_replies: 0,
            }))
            .await
            {
                Ok(_) => true,
                Err(status) if status.code() == tonic::Code::Unimplemented => false,
                Err(status) => bail!("Admin.InjectFault on node {node}: {status}"),
            };
        Ok(AdminCapabilities {
            admin,
            inject_fault,
        })
    }

    pub async fn state_hash(&self, node: u64) -> anyhow::Result<proto::StateHashReply> {
        let mut client = self.client(node)?;
        within(client.state_hash(proto::StateHashRequest {}))
            .await
            .with_context(|| format!("Admin.StateHash on node {node}"))
    }

    pub async fn local_read(&self, node: u64, key: &str) -> anyhow::Result<proto::LocalReadReply> {
        let mut client = self.client(node)?;
        within(client.local_read(proto::LocalReadRequest {
            key: key.as_bytes().to_vec(),
        }))
        .await
        .with_context(|| format!("Admin.LocalRead {key} on node {node}"))
    }

    /// `node` writes a snapshot of its applied state now; returns the log
    /// index it covers.
    pub async fn trigger_snapshot(&self, node: u64) -> anyhow::Result<u64> {
        let mut client = self.client(node)?;
        let call = client.trigger_snapshot(proto::TriggerSnapshotRequest {});
        // Building a snapshot may take longer than an ordinary call.
        match tokio::time::timeout(Duration::from_secs(60), call).await {
            Ok(Ok(reply)) => Ok(reply.into_inner().snapshot_index),
            Ok(Err(status)) => bail!("Admin.TriggerSnapshot on node {node}: {status}"),
            Err(_) => bail!("Admin.TriggerSnapshot on node {node}: no answer within 60 s"),
        }
    }

    /// `node` drops the replies of its next `count` new executes.
    pub async fn drop_replies(&self, node: u64, count: u32) -> anyhow::Result<u64> {
        let mut client = self.client(node)?;
        Ok(within(client.inject_fault(proto::InjectFaultRequest {
            drop_execute_replies: count,
        }))
        .await
        .with_context(|| format!("Admin.InjectFault on node {node}"))?
        .drop_execute_replies_pending)
    }

    pub async fn get_config(&self, node: u64) -> anyhow::Result<proto::RegistryConfig> {
        let mut client = self.client(node)?;
        within(client.get_config(proto::GetConfigRequest {}))
            .await
            .with_context(|| format!("Admin.GetConfig on node {node}"))?
            .config
            .with_context(|| format!("node {node} has no registry config yet"))
    }

    /// Changes the registry config fields `patch` sets, through the leader,
    /// starting at `leader` and following NOT_LEADER hints, until applied
    /// or `timeout` passes.
    pub async fn set_config(
        &self,
        leader: u64,
        cluster_id: &[u8],
        patch: proto::RegistryConfigPatch,
        timeout: Duration,
    ) -> anyhow::Result<u64> {
        // The nodes in turn from `leader`, followed by the client
        // library's one leader-following policy.
        let first = self
            .endpoints
            .iter()
            .position(|(id, _)| *id == leader)
            .unwrap_or(0);
        let mut endpoints: Vec<String> = self
            .endpoints
            .iter()
            .map(|(_, addr)| addr.clone())
            .collect();
        endpoints.rotate_left(first);
        let cluster = oncekv_client::admin::Admin::new(endpoints, self.credentials.clone());
        let request = proto::SetConfigRequest {
            cluster_id: cluster_id.to_vec(),
            patch: Some(patch),
        };
        cluster
            .on_leader(Instant::now() + timeout, |mut client| {
                let request = request.clone();
                async move { client.set_config(request).await }
            })
            .await
            .map(|reply| reply.log_index)
            .map_err(|error| anyhow::anyhow!("Admin.SetConfig: {}", error.status()))
    }
}

/// Runs an Admin call within [`CALL_TIMEOUT`].
async fn within<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded("admin call timed out")),
    }
}
