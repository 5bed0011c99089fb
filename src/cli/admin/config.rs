//! `oncekv admin config [set …]`: the replicated registry config — shown
//! as the leader has applied it, or changed through a config log entry
//! that carries only the given fields (a patch: a concurrent change of the
//! other fields is kept, and a retry sets the same values again). It owns
//! the arguments and the presentation; which values are valid is the
//! cluster's to decide.

use serde_json::{Value as Json, json};

use oncekv_wire::proto;

use super::cluster::Admin;
use crate::cli::output::{Failure, Success, success};

/// `config [set …]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub action: Option<ConfigAction>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigAction {
    /// Change the given fields through a config log entry (the others stay).
    Set(ConfigSetArgs),
}

/// `config set`: any subset of the fields.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigSetArgs {
    #[arg(long)]
    pub session_ttl_ms: Option<u64>,
    #[arg(long)]
    pub sessions_max: Option<u64>,
    #[arg(long)]
    pub window: Option<u64>,
    #[arg(long)]
    pub cached_bytes_per_session_max: Option<u64>,
    #[arg(long)]
    pub key_bytes_max: Option<u64>,
    #[arg(long)]
    pub value_bytes_max: Option<u64>,
    #[arg(long)]
    pub list_elements_max: Option<u64>,
    #[arg(long)]
    pub keys_max: Option<u64>,
    /// How long an idempotency key's record lives after its first execution.
    #[arg(long)]
    pub idempotency_key_ttl_ms: Option<u64>,
    /// Live idempotency keys, all principals together.
    #[arg(long)]
    pub idempotency_keys_max: Option<u64>,
    /// Longest idempotency key.
    #[arg(long)]
    pub idempotency_key_bytes_max: Option<u64>,
    /// Bytes of all idempotency keys' records together.
    #[arg(long)]
    pub idempotency_cached_bytes_max: Option<u64>,
    /// How long a completed or released claim's record lives.
    #[arg(long)]
    pub claim_ttl_ms: Option<u64>,
    /// Live claim records, all principals together.
    #[arg(long)]
    pub claims_max: Option<u64>,
    /// Longest claim key.
    #[arg(long)]
    pub claim_key_bytes_max: Option<u64>,
    /// Largest result a claim may record.
    #[arg(long)]
    pub claim_result_bytes_max: Option<u64>,
    /// Bytes of all claim records together.
    #[arg(long)]
    pub claim_cached_bytes_max: Option<u64>,
    /// Longest lease a claim or an extend may ask for.
    #[arg(long)]
    pub lease_ms_max: Option<u64>,
    /// The bytes the applied state may account for (data, sessions and
    /// held claims — finished ones too below rules version 3 —;
    /// idempotency keys too at rules version 1).
    #[arg(long)]
    pub memory_budget_bytes: Option<u64>,
    /// The percent of each capacity limit one authenticated principal may
    /// hold.
    #[arg(long)]
    pub principal_quota_percent: Option<u64>,
    /// Raises the rules version (alone, never down; only once every node
    /// runs a build that knows it).
    #[arg(long)]
    pub rules_version: Option<u32>,
}

/// The config's fields, in a fixed order, as (name, value).
fn config_fields(config: &proto::RegistryConfig) -> [(&'static str, u64); 21] {
    [
        ("session_ttl_ms", config.session_ttl_ms),
        ("sessions_max", config.sessions_max),
        ("window", config.window),
        (
            "cached_bytes_per_session_max",
            config.cached_bytes_per_session_max,
        ),
        ("key_bytes_max", config.key_bytes_max),
        ("value_bytes_max", config.value_bytes_max),
        ("list_elements_max", config.list_elements_max),
        ("keys_max", config.keys_max),
        ("idempotency_key_ttl_ms", config.idempotency_key_ttl_ms),
        ("idempotency_keys_max", config.idempotency_keys_max),
        (
            "idempotency_key_bytes_max",
            config.idempotency_key_bytes_max,
        ),
        (
            "idempotency_cached_bytes_max",
            config.idempotency_cached_bytes_max,
        ),
        ("claim_ttl_ms", config.claim_ttl_ms),
        ("claims_max", config.claims_max),
        ("claim_key_bytes_max", config.claim_key_bytes_max),
        ("claim_result_bytes_max", config.claim_result_bytes_max),
        ("claim_cached_bytes_max", config.claim_cached_bytes_max),
        ("lease_ms_max", config.lease_ms_max),
        ("memory_budget_bytes", config.memory_budget_bytes),
        ("principal_quota_percent", config.principal_quota_percent),
        ("rules_version", u64::from(config.rules_version)),
    ]
}

fn config_report(config: &proto::RegistryConfig, index_name: &str, index: u64) -> Success {
    let fields = config_fields(config);
    let mut lines: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("{name} {value}"))
        .collect();
    lines.push(format!("({index_name} {index})"));
    let object: serde_json::Map<String, Json> = fields
        .iter()
        .map(|(name, value)| ((*name).to_owned(), json!(value)))
        .collect();
    success(
        lines,
        [(index_name, json!(index)), ("config", Json::Object(object))],
    )
}

/// The leader's applied config.
async fn leader_config(admin: &Admin) -> Result<(proto::RegistryConfig, u64), Failure> {
    let leader = admin.leader_status().await?.leader_client_addr;
    let reply = admin
        .at(&leader, |mut client| async move {
            client.get_config(proto::GetConfigRequest {}).await
        })
        .await?;
    let config = reply
        .config
        .ok_or_else(|| Failure::new("unavailable", "the cluster is not initialised yet"))?;
    Ok((config, reply.applied_index))
}

/// `config`: the leader's applied config.
pub(super) async fn show(admin: &Admin) -> Result<Success, Failure> {
    let (config, applied_index) = leader_config(admin).await?;
    Ok(config_report(&config, "applied_index", applied_index))
}

/// `config set`: the given fields, through a config log entry.
pub(super) async fn set(admin: &Admin, set: &ConfigSetArgs) -> Result<Success, Failure> {
    let changes = [
        set.session_ttl_ms,
        set.sessions_max,
        set.window,
        set.cached_bytes_per_session_max,
        set.key_bytes_max,
        set.value_bytes_max,
        set.list_elements_max,
        set.keys_max,
        set.idempotency_key_ttl_ms,
        set.idempotency_keys_max,
        set.idempotency_key_bytes_max,
        set.idempotency_cached_bytes_max,
        set.claim_ttl_ms,
        set.claims_max,
        set.claim_key_bytes_max,
        set.claim_result_bytes_max,
        set.claim_cached_bytes_max,
        set.lease_ms_max,
        set.memory_budget_bytes,
        set.principal_quota_percent,
        set.rules_version.map(u64::from),
    ];
    if changes.iter().all(Option::is_none) {
        return Err(Failure::usage(
            "config set needs at least one field to change (see --help)",
        ));
    }
    let cluster_id = admin.cluster_id().await?;
    // Only the given fields travel: the registry applies them to the config
    // in force when the entry applies, so a concurrent change of other
    // fields is kept, and a retry sets the same values again.
    let patch = proto::RegistryConfigPatch {
        session_ttl_ms: set.session_ttl_ms,
        sessions_max: set.sessions_max,
        window: set.window,
        cached_bytes_per_session_max: set.cached_bytes_per_session_max,
        key_bytes_max: set.key_bytes_max,
        value_bytes_max: set.value_bytes_max,
        list_elements_max: set.list_elements_max,
        keys_max: set.keys_max,
        idempotency_key_ttl_ms: set.idempotency_key_ttl_ms,
        idempotency_keys_max: set.idempotency_keys_max,
        idempotency_key_bytes_max: set.idempotency_key_bytes_max,
        idempotency_cached_bytes_max: set.idempotency_cached_bytes_max,
        claim_ttl_ms: set.claim_ttl_ms,
        claims_max: set.claims_max,
        claim_key_bytes_max: set.claim_key_bytes_max,
        claim_result_bytes_max: set.claim_result_bytes_max,
        claim_cached_bytes_max: set.claim_cached_bytes_max,
        lease_ms_max: set.lease_ms_max,
        memory_budget_bytes: set.memory_budget_bytes,
        principal_quota_percent: set.principal_quota_percent,
        rules_version: set.rules_version,
    };
    let request = proto::SetConfigRequest {
        cluster_id,
        patch: Some(patch),
    };
    let reply = admin
        .on_leader(true, |mut client| {
            let request = request.clone();
            async move { client.set_config(request).await }
        })
        .await?;
    let applied = reply.config.unwrap_or_default();
    Ok(config_report(&applied, "log_index", reply.log_index))
}
