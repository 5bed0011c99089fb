//! One measured run: `clients` closed-loop clients, each sending one
//! operation at a time until the duration has passed, over channels shared
//! round-robin. Every operation's latency is kept (microseconds) and the run
//! is summed up in one [`Report`].
//!
//! An operation is one request, except in the claim modes, where it is the
//! whole reserve → record cycle of two requests on a key no earlier cycle
//! used: on etcd a Txn that puts "in progress" only if the key was never
//! created (create_revision == 0) and then a Put of the result; on oncekv a
//! `Claim` that must win the key (a first attempt, not a replay) and then a
//! `CompleteClaim` of its fence with the result. A cycle whose first step
//! does not win counts as an error, so a run measures only full cycles.
//!
//! Sessions (oncekv Execute) are registered before the clock starts and
//! unregistered after it stops, so neither is measured.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// What the claim cycles put on etcd before the result ("in progress").
const ETCD_IN_PROGRESS: &[u8] = b"in-progress";
/// What every oncekv claim cycle describes its effect as (the node keeps its
/// fingerprint; the keys differ, so the description may be the same).
const CLAIM_DESCRIPTION: &[u8] = b"loadgen claim cycle";
/// The lease every oncekv claim asks for: far beyond a cycle's deadline, so
/// no lease runs out during a run.
const CLAIM_LEASE_MS: u64 = 60_000;

/// What every request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    EtcdPut,
    OncekvExec,
    OncekvPlain,
    /// oncekv ExecuteKeyed of a put, a new idempotency key each time.
    OncekvKeyed,
    /// etcd Txn put-if-absent of the value under a new key: the
    /// deduplication record of a consumer built on etcd (the etcd side of
    /// `OncekvKeyed`).
    EtcdOnce,
    /// etcd Txn put-if-absent of "in progress", then Put of the result.
    EtcdClaim,
    /// oncekv Claim (won), then CompleteClaim of its fence.
    OncekvClaim,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::EtcdPut => "etcd-put",
            Target::OncekvExec => "oncekv-exec",
            Target::OncekvPlain => "oncekv-plain",
            Target::OncekvKeyed => "oncekv-keyed",
            Target::EtcdOnce => "etcd-once",
            Target::EtcdClaim => "etcd-claim",
            Target::OncekvClaim => "oncekv-claim",
        }
    }

    /// The key of client `number`'s `n`th operation of the run whose salt is
    /// `salt`: the claim modes take a key no run has used (a claim cycle on
    /// a used key would replay or be refused, not reserve); the others cycle
    /// over [`KEYS_PER_CLIENT`] keys per client.
    fn key(self, salt: u64, number: usize, n: u64) -> Vec<u8> {
        match self {
            Target::EtcdClaim | Target::OncekvClaim => {
                format!("claim/{salt:016x}-{number}-{n}").into_bytes()
            }
            Target::EtcdOnce => format!("once/{salt:016x}-{number}-{n}").into_bytes(),
            Target::EtcdPut | Target::OncekvExec | Target::OncekvPlain | Target::OncekvKeyed => {
                format!("loadgen-{number}-{}", n % KEYS_PER_CLIENT).into_bytes()
            }
        }
    }

    /// The idempotency key of client `number`'s `n`th operation (keyed
    /// mode): one no run has used, so every request makes a new record.
    fn idempotency_key(salt: u64, number: usize, n: u64) -> Vec<u8> {
        format!("keyed/{salt:016x}-{number}-{n}").into_bytes()
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub target: Target,
    pub clients: usize,
    pub duration: Duration,
    pub value_bytes: usize,
    pub request_timeout: Duration,
    /// Stop once this many operations were started, all clients together
    /// (`None`: at the duration only).
    pub total_ops: Option<u64>,
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

/// One client's way of doing one operation.
enum Caller {
    Etcd(etcd::kv_client::KvClient<Channel>),
    EtcdOnce(etcd::kv_client::KvClient<Channel>),
    EtcdClaim(etcd::kv_client::KvClient<Channel>),
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
    Keyed {
        client: oncekv::client_client::ClientClient<Channel>,
        cluster_id: Vec<u8>,
        /// The run's salt and the client's number: its idempotency keys.
        salt: u64,
        number: usize,
        /// Requests sent so far.
        sent: u64,
    },
    Claim {
        client: oncekv::client_client::ClientClient<Channel>,
        cluster_id: Vec<u8>,
        /// Makes every claim's `claim_id` (one per cycle, never reused).
        claim_ids: ClaimIds,
    },
}

/// 16-byte claim ids, distinct for every cycle of every client of every run:
/// the run's salt, the client's number and the client's cycle count.
struct ClaimIds {
    salt: u64,
    client: u32,
    cycles: u32,
}

impl ClaimIds {
    fn next(&mut self) -> Vec<u8> {
        self.cycles = self.cycles.wrapping_add(1);
        let mut id = self.salt.to_le_bytes().to_vec();
        id.extend_from_slice(&self.client.to_le_bytes());
        id.extend_from_slice(&self.cycles.to_le_bytes());
        id
    }
}

/// The etcd Txn that reserves `key`: put `value` only if `key` was never
/// created (its create_revision is 0), nothing otherwise.
fn put_if_absent(key: Vec<u8>, value: Vec<u8>) -> etcd::TxnRequest {
    etcd::TxnRequest {
        compare: vec![etcd::Compare {
            result: etcd::compare::CompareResult::Equal as i32,
            target: etcd::compare::CompareTarget::Create as i32,
            key: key.clone(),
            target_union: Some(etcd::compare::TargetUnion::CreateRevision(0)),
        }],
        success: vec![etcd::RequestOp {
            request: Some(etcd::request_op::Request::RequestPut(etcd::PutRequest {
                key,
                value,
                ..etcd::PutRequest::default()
            })),
        }],
        failure: Vec::new(),
    }
}

/// A status as the run's error text.
fn failed(status: tonic::Status) -> String {
    format!("{}: {}", status.code(), status.message())
}

impl Caller {
    /// One operation on `key` (a put, or a claim cycle with `value` as its
    /// result); the error says what failed.
    async fn operate(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), String> {
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
                    .await
                    .map_err(failed)?;
            }
            Caller::EtcdOnce(client) => {
                let recorded = client
                    .txn(put_if_absent(key, value))
                    .await
                    .map_err(failed)?
                    .into_inner();
                if !recorded.succeeded {
                    return Err("etcd Txn: the new key was already created".to_owned());
                }
            }
            Caller::EtcdClaim(client) => {
                let reserved = client
                    .txn(put_if_absent(key.clone(), ETCD_IN_PROGRESS.to_vec()))
                    .await
                    .map_err(failed)?
                    .into_inner();
                if !reserved.succeeded {
                    return Err("etcd Txn: the new key was already created".to_owned());
                }
                client
                    .put(etcd::PutRequest {
                        key,
                        value,
                        ..etcd::PutRequest::default()
                    })
                    .await
                    .map_err(failed)?;
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
                    .await
                    .map_err(failed)?;
            }
            Caller::Plain { client, cluster_id } => {
                client
                    .execute_plain(oncekv::ExecutePlainRequest {
                        cluster_id: cluster_id.clone(),
                        command: Some(command()),
                    })
                    .await
                    .map_err(failed)?;
            }
            Caller::Keyed {
                client,
                cluster_id,
                salt,
                number,
                sent,
            } => {
                let idempotency_key = Target::idempotency_key(*salt, *number, *sent);
                *sent += 1;
                let reply = client
                    .execute_keyed(oncekv::ExecuteKeyedRequest {
                        cluster_id: cluster_id.clone(),
                        idempotency_key,
                        command: Some(command()),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                if reply.duplicate {
                    return Err("ExecuteKeyed of a new key answered duplicate".to_owned());
                }
            }
            Caller::Claim {
                client,
                cluster_id,
                claim_ids,
            } => {
                let answer = client
                    .claim(oncekv::ClaimRequest {
                        cluster_id: cluster_id.clone(),
                        key: key.clone(),
                        fingerprint: CLAIM_DESCRIPTION.to_vec(),
                        lease_ms: CLAIM_LEASE_MS,
                        claim_id: claim_ids.next(),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner()
                    .answer;
                let fence = match answer {
                    Some(oncekv::claim_reply::Answer::Won(won))
                        if won.attempt == 1 && !won.duplicate =>
                    {
                        won.fence
                    }
                    other => return Err(format!("Claim of a new key answered {other:?}")),
                };
                let completed = client
                    .complete_claim(oncekv::CompleteClaimRequest {
                        cluster_id: cluster_id.clone(),
                        key,
                        fence,
                        result: value,
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                if completed.duplicate {
                    return Err("CompleteClaim of a new key answered duplicate".to_owned());
                }
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
    let salt = nonce_salt();
    let callers = callers(options, channels, salt).await?;
    let value = vec![b'v'; options.value_bytes];
    let target = options.target;
    let started = Instant::now();
    let until = started + options.duration;
    let mut clients = JoinSet::new();
    let budget = options
        .total_ops
        .map(|total| (total, Arc::new(AtomicU64::new(0))));
    for (number, mut caller) in callers.into_iter().enumerate() {
        let value = value.clone();
        let request_timeout = options.request_timeout;
        let budget = budget.clone();
        clients.spawn(async move {
            let mut log = ClientLog {
                latencies_us: Vec::new(),
                errors: 0,
                first_error: None,
            };
            let mut n = 0u64;
            while Instant::now() < until {
                if let Some((total, started_ops)) = &budget
                    && started_ops.fetch_add(1, Ordering::Relaxed) >= *total
                {
                    break;
                }
                let key = target.key(salt, number, n);
                n += 1;
                let sent = Instant::now();
                let error = match timeout(request_timeout, caller.operate(key, value.clone())).await
                {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some(error),
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
/// learnt (ExecutePlain, claims) before the clock starts; `salt` makes the
/// run's session nonces and claim ids its own.
async fn callers(
    options: &LoadOptions,
    channels: &[Channel],
    salt: u64,
) -> anyhow::Result<Vec<Caller>> {
    let channel = |number: usize| channels[number % channels.len()].clone();
    match options.target {
        Target::EtcdPut | Target::EtcdOnce | Target::EtcdClaim => {
            let target = options.target;
            return Ok((0..options.clients)
                .map(|number| {
                    let client = etcd::kv_client::KvClient::new(channel(number));
                    match target {
                        Target::EtcdClaim => Caller::EtcdClaim(client),
                        Target::EtcdOnce => Caller::EtcdOnce(client),
                        _ => Caller::Etcd(client),
                    }
                })
                .collect());
        }
        Target::OncekvExec | Target::OncekvPlain | Target::OncekvKeyed | Target::OncekvClaim => {}
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
    if options.target == Target::OncekvKeyed {
        return Ok((0..options.clients)
            .map(|number| Caller::Keyed {
                client: oncekv::client_client::ClientClient::new(channel(number)),
                cluster_id: cluster_id.clone(),
                salt,
                number,
                sent: 0,
            })
            .collect());
    }
    if options.target == Target::OncekvPlain {
        return Ok((0..options.clients)
            .map(|number| Caller::Plain {
                client: oncekv::client_client::ClientClient::new(channel(number)),
                cluster_id: cluster_id.clone(),
            })
            .collect());
    }
    if options.target == Target::OncekvClaim {
        return Ok((0..options.clients)
            .map(|number| Caller::Claim {
                client: oncekv::client_client::ClientClient::new(channel(number)),
                cluster_id: cluster_id.clone(),
                claim_ids: ClaimIds {
                    salt,
                    client: number as u32,
                    cycles: 0,
                },
            })
            .collect());
    }
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

/// The first half of every session's nonce and claim id, and part of every
/// claim key: distinct per process and run (the rest is the client's
/// number, and its cycle for claims).
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

    /// Claim cycles and etcd put-if-absent records never reuse a key
    /// (within a client, across clients or across runs), while puts cycle
    /// over each client's own keys.
    #[test]
    fn claim_keys_are_new_put_keys_cycle() {
        for target in [Target::EtcdOnce, Target::EtcdClaim, Target::OncekvClaim] {
            let mut seen = std::collections::BTreeSet::new();
            for salt in [1, 2] {
                for number in [0, 1, 10] {
                    for n in [0, 1, KEYS_PER_CLIENT, 10 * KEYS_PER_CLIENT + 1] {
                        assert!(seen.insert(target.key(salt, number, n)), "{target:?}");
                    }
                }
            }
        }
        assert_eq!(
            Target::OncekvExec.key(1, 3, 5),
            Target::OncekvExec.key(2, 3, 5 + KEYS_PER_CLIENT)
        );
        assert_ne!(Target::EtcdPut.key(1, 3, 5), Target::EtcdPut.key(1, 4, 5));
    }

    /// Keyed requests never reuse an idempotency key (within a client,
    /// across clients or across runs): each one is a new record.
    #[test]
    fn idempotency_keys_are_new() {
        let mut seen = std::collections::BTreeSet::new();
        for salt in [1, 2] {
            for number in [0, 1, 10] {
                for n in [0, 1, KEYS_PER_CLIENT, 10 * KEYS_PER_CLIENT + 1] {
                    assert!(seen.insert(Target::idempotency_key(salt, number, n)));
                }
            }
        }
    }

    /// Every cycle's claim id is 16 bytes and its own: a repeated id would
    /// make a claim look like the retry of an earlier one.
    #[test]
    fn claim_ids_are_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for salt in [7, 8] {
            for client in [0, 1, 256] {
                let mut ids = ClaimIds {
                    salt,
                    client,
                    cycles: 0,
                };
                for _ in 0..100 {
                    let id = ids.next();
                    assert_eq!(id.len(), 16);
                    assert!(seen.insert(id));
                }
            }
        }
    }

    /// The etcd reservation compares the key's create revision with 0 and
    /// puts "in progress" on that same key only when the compare holds.
    #[test]
    fn etcd_reservation_is_put_if_never_created() {
        let txn = put_if_absent(b"k".to_vec(), ETCD_IN_PROGRESS.to_vec());
        assert_eq!(txn.compare.len(), 1);
        let compare = &txn.compare[0];
        assert_eq!(compare.key, b"k");
        assert_eq!(compare.result, etcd::compare::CompareResult::Equal as i32);
        assert_eq!(compare.target, etcd::compare::CompareTarget::Create as i32);
        assert_eq!(
            compare.target_union,
            Some(etcd::compare::TargetUnion::CreateRevision(0))
        );
        assert!(txn.failure.is_empty());
        let [
            etcd::RequestOp {
                request: Some(etcd::request_op::Request::RequestPut(put)),
            },
        ] = txn.success.as_slice()
        else {
            panic!("one put on success: {:?}", txn.success);
        };
        assert_eq!(
            (put.key.as_slice(), put.value.as_slice()),
            (&b"k"[..], ETCD_IN_PROGRESS)
        );
    }

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
