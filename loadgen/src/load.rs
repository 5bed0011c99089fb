//! One measured run: `clients` closed-loop clients, each sending one request
//! at a time until the duration has passed, over channels shared
//! round-robin. Every request's latency is kept (microseconds) and the run
//! is summed up in one [`Report`].
//!
//! Sessions (oncekv Execute) are registered before the clock starts and
//! unregistered after it stops, so neither is measured.

use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use crate::proto::{etcd, oncekv};
use oncekv_client::credentials::AuthChannel as Channel;
use oncekv_testkit::percentile;

/// Keys per client: each client cycles over its own keys.
const KEYS_PER_CLIENT: u64 = 1_000;
/// Deadline of the unregistering after the run (not measured).
const UNREGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// What every request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    EtcdPut,
    OncekvExec,
    OncekvPlain,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::EtcdPut => "etcd-put",
            Target::OncekvExec => "oncekv-exec",
            Target::OncekvPlain => "oncekv-plain",
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub target: Target,
    pub clients: usize,
    pub duration: Duration,
    pub value_bytes: usize,
    pub request_timeout: Duration,
}

/// The figures of one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub target: Target,
    pub clients: usize,
    /// Requests answered with success.
    pub ok: u64,
    /// Requests answered with an error or not answered in time.
    pub errors: u64,
    /// From the start to the last client's last answer.
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

impl Report {
    pub fn ops_per_second(&self) -> f64 {
        self.ok as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
}

/// One line, `key=value` pairs (scripts grep them).
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mode={} clients={} ok={} errors={} seconds={:.2} ops/s={:.0} p50_ms={:.2} p99_ms={:.2} p999_ms={:.2}",
            self.target.name(),
            self.clients,
            self.ok,
            self.errors,
            self.seconds,
            self.ops_per_second(),
            self.p50_ms,
            self.p99_ms,
            self.p999_ms
        )
    }
}

/// One client's way of sending a put.
enum Caller {
    Etcd(etcd::kv_client::KvClient<Channel>),
    Exec {
        client: oncekv::client_client::ClientClient<Channel>,
        cluster_id: Vec<u8>,
        client_id: u64,
        /// The last seq sent.
        seq: u64,
    },
    Plain {
        client: oncekv::client_client::ClientClient<Channel>,
        cluster_id: Vec<u8>,
    },
}

impl Caller {
    async fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), tonic::Status> {
        let command = || oncekv::Command {
            op: Some(oncekv::command::Op::Put(oncekv::Put {
                key: key.clone(),
                value: Some(oncekv::Value {
                    kind: Some(oncekv::value::Kind::Bytes(value.clone())),
                }),
            })),
        };
        match self {
            Caller::Etcd(client) => {
                client
                    .put(etcd::PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        ..etcd::PutRequest::default()
                    })
                    .await?;
            }
            Caller::Exec {
                client,
                cluster_id,
                client_id,
                seq,
            } => {
                // One request at a time: every earlier seq is answered (or
                // failed: then this floor fences it), so the first
                // outstanding seq is this one.
                *seq += 1;
                client
                    .execute(oncekv::ExecuteRequest {
                        cluster_id: cluster_id.clone(),
                        client_id: *client_id,
                        seq: *seq,
                        first_outstanding_seq: *seq,
                        command: Some(command()),
                    })
                    .await?;
            }
            Caller::Plain { client, cluster_id } => {
                client
                    .execute_plain(oncekv::ExecutePlainRequest {
                        cluster_id: cluster_id.clone(),
                        command: Some(command()),
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

/// What one client did.
struct ClientLog {
    latencies_us: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

/// Runs the load on `channels` (client `i` uses channel `i mod len`).
pub async fn run(options: &LoadOptions, channels: &[Channel]) -> anyhow::Result<Report> {
    if channels.is_empty() {
        bail!("no connection");
    }
    let callers = callers(options, channels).await?;
    let value = vec![b'v'; options.value_bytes];
    let started = Instant::now();
    let until = started + options.duration;
    let mut clients = JoinSet::new();
    for (number, mut caller) in callers.into_iter().enumerate() {
        let value = value.clone();
        let request_timeout = options.request_timeout;
        clients.spawn(async move {
            let mut log = ClientLog {
                latencies_us: Vec::new(),
                errors: 0,
                first_error: None,
            };
            let mut n = 0u64;
            while Instant::now() < until {
                let key = format!("loadgen-{number}-{}", n % KEYS_PER_CLIENT).into_bytes();
                n += 1;
                let sent = Instant::now();
                let error = match timeout(request_timeout, caller.put(key, value.clone())).await {
                    Ok(Ok(())) => None,
                    Ok(Err(status)) => Some(format!("{}: {}", status.code(), status.message())),
                    Err(_) => Some(format!("no answer within {request_timeout:?}")),
                };
                match error {
                    None => log
                        .latencies_us
                        .push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32),
                    Some(error) => {
                        log.errors += 1;
                        log.first_error.get_or_insert(error);
                    }
                }
            }
            (caller, log)
        });
    }
    let mut latencies = Vec::new();
    let (mut errors, mut first_error) = (0, None);
    let mut callers = Vec::new();
    while let Some(joined) = clients.join_next().await {
        let (caller, log) = joined.context("a client task failed")?;
        latencies.extend(log.latencies_us);
        errors += log.errors;
        if first_error.is_none() {
            first_error = log.first_error;
        }
        callers.push(caller);
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(error) = first_error {
        eprintln!("loadgen: {errors} failed requests; first: {error}");
    }
    unregister(callers).await;
    latencies.sort_unstable();
    Ok(Report {
        target: options.target,
        clients: options.clients,
        ok: latencies.len() as u64,
        errors,
        seconds,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        p999_ms: percentile(&latencies, 0.999),
    })
}

/// Every client's caller, sessions registered (Execute) or the cluster id
/// learnt (ExecutePlain) before the clock starts.
async fn callers(options: &LoadOptions, channels: &[Channel]) -> anyhow::Result<Vec<Caller>> {
    let channel = |number: usize| channels[number % channels.len()].clone();
    if options.target == Target::EtcdPut {
        return Ok((0..options.clients)
            .map(|number| Caller::Etcd(etcd::kv_client::KvClient::new(channel(number))))
            .collect());
    }
    let cluster_id = timeout(
        options.request_timeout,
        oncekv::client_client::ClientClient::new(channel(0)).status(oncekv::StatusRequest {}),
    )
    .await
    .context("oncekv Status timed out")?
    .context("oncekv Status")?
    .into_inner()
    .cluster_id;
    if options.target == Target::OncekvPlain {
        return Ok((0..options.clients)
            .map(|number| Caller::Plain {
                client: oncekv::client_client::ClientClient::new(channel(number)),
                cluster_id: cluster_id.clone(),
            })
            .collect());
    }
    let salt = nonce_salt();
    let mut registering = JoinSet::new();
    for number in 0..options.clients {
        let mut client = oncekv::client_client::ClientClient::new(channel(number));
        let cluster_id = cluster_id.clone();
        let request_timeout = options.request_timeout;
        registering.spawn(async move {
            let mut nonce = salt.to_le_bytes().to_vec();
            nonce.extend_from_slice(&(number as u64).to_le_bytes());
            let reply = timeout(
                request_timeout,
                client.register(oncekv::RegisterRequest {
                    cluster_id: cluster_id.clone(),
                    nonce,
                }),
            )
            .await
            .with_context(|| format!("client {number}: Register timed out"))?
            .with_context(|| format!("client {number}: Register"))?
            .into_inner();
            anyhow::Ok((
                number,
                Caller::Exec {
                    client,
                    cluster_id,
                    client_id: reply.client_id,
                    seq: 0,
                },
            ))
        });
    }
    let mut callers = Vec::new();
    while let Some(joined) = registering.join_next().await {
        callers.push(joined.context("a registering task failed")??);
    }
    callers.sort_by_key(|(number, _)| *number);
    Ok(callers.into_iter().map(|(_, caller)| caller).collect())
}

/// The first half of every session's nonce: distinct per process and run
/// (the second half is the client's number).
fn nonce_salt() -> u64 {
    // Not the registry: a nonce wants a value no other run has used, and
    // the wall clock with the process id gives one.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    now ^ (u64::from(std::process::id()) << 48)
}

/// Ends the run's sessions, best effort and bounded, so that repeated runs
/// do not pile sessions up on the cluster.
async fn unregister(callers: Vec<Caller>) {
    let mut ending = JoinSet::new();
    for caller in callers {
        if let Caller::Exec {
            mut client,
            cluster_id,
            client_id,
            ..
        } = caller
        {
            ending.spawn(async move {
                let request = oncekv::UnregisterRequest {
                    cluster_id,
                    client_id,
                };
                timeout(UNREGISTER_TIMEOUT, client.unregister(request))
                    .await
                    .is_ok_and(|reply| reply.is_ok())
            });
        }
    }
    let (mut ended, mut total) = (0, 0);
    while let Some(joined) = ending.join_next().await {
        total += 1;
        ended += usize::from(joined.unwrap_or(false));
    }
    if ended < total {
        eprintln!(
            "loadgen: {} of {total} sessions not unregistered",
            total - ended
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_one_greppable_line() {
        let report = Report {
            target: Target::OncekvExec,
            clients: 16,
            ok: 8_000,
            errors: 1,
            seconds: 8.0,
            p50_ms: 1.5,
            p99_ms: 9.25,
            p999_ms: 20.0,
        };
        assert_eq!(
            report.to_string(),
            "mode=oncekv-exec clients=16 ok=8000 errors=1 seconds=8.00 ops/s=1000 \
             p50_ms=1.50 p99_ms=9.25 p999_ms=20.00"
        );
    }
}
