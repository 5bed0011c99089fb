//! An inbox consumer made exactly-once with idempotency keys: the use case
//! of `Client::execute_with_key` (rule 18). A simulated at-least-once stream
//! delivers messages "credit account X by N", each with a message id, one to
//! three times, duplicated and reordered (a seeded RNG: the same stream every
//! run). The consumer applies every delivery with
//! `execute_with_key(message id, Increment)` — no session, no bookkeeping of
//! its own — while the cluster's leader is killed midway and restarted. At the
//! end each account's balance must equal the sum of its *distinct* messages:
//! every redelivery, and every retry of a call whose reply was lost, was
//! answered from the registry's record of its key instead of crediting again.
//!
//! It runs its own throwaway 3-node cluster of the `oncekv` binary (local
//! processes on free loopback ports, removed at the end), so build that
//! first:
//!
//! ```sh
//! cargo build --release --bin oncekv
//! cargo run --release --example inbox_consumer
//! ```
//!
//! The binary is looked for next to the example's directory
//! (`target/release/oncekv` for `target/release/examples/inbox_consumer`);
//! `ONCEKV_BIN=path` names another. `INBOX_SEED` changes the stream (default
//! 1), `INBOX_MESSAGES` its length (default 400). Exit status 0 when every
//! balance is right, 1 otherwise.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use oncekv_client::{Client, Error};
use oncekv_core::{Command, CommandResult, Value};
use oncekv_testkit::{LocalCluster, Options};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const ACCOUNTS: [&str; 5] = ["alice", "bob", "carol", "dave", "erin"];
/// Deliveries the consumer works on at once (a consumer with a few workers).
const IN_FLIGHT: usize = 4;

/// One message of the stream.
#[derive(Clone, Debug)]
struct Message {
    id: String,
    account: &'static str,
    amount: i64,
}

/// What the consumer saw.
#[derive(Default)]
struct Counts {
    delivered: AtomicU64,
    /// Answered by executing the credit.
    applied: AtomicU64,
    /// Answered from the registry's record of the key: nothing credited.
    duplicates: AtomicU64,
    /// Calls whose outcome was unknown (deadline passed) or that reached
    /// no node, sent again.
    unknown_retried: AtomicU64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seed: u64 = env_number("INBOX_SEED", 1)?;
    let count: usize = env_number("INBOX_MESSAGES", 400)?;
    let messages = messages(seed, count);
    let deliveries = at_least_once(seed, &messages);
    println!(
        "stream (seed {seed}): {} messages, {} deliveries (each message 1-3 times, reordered)",
        messages.len(),
        deliveries.len()
    );

    let mut options = Options::new("inbox", server_bin()?);
    options.worker_threads = Some(oncekv_testkit::worker_threads_per_node(3));
    let cluster = LocalCluster::start(&options)
        .await
        .context("start the local cluster")?;
    println!("cluster at {}", cluster.client_addrs().join(","));
    let client = Client::connect(cluster.client_addrs());
    let counts = Arc::new(Counts::default());

    // Midway the leader dies (SIGKILL) with calls in flight; the rest runs
    // against the new leader, and the old one comes back two seconds later.
    let half = deliveries.len() as u64 / 2;
    let killer = async {
        while counts.delivered.load(Ordering::Relaxed) < half {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let leader = cluster.leader().await.context("no leader")?;
        cluster.kill(leader)?;
        println!("killed the leader, node {leader}, after {half} deliveries");
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.restart(leader, Duration::from_secs(30)).await?;
        println!("node {leader} restarted");
        anyhow::Ok(())
    };
    let (consumed, killed) = tokio::join!(consume(&client, &counts, &deliveries), killer);
    consumed?;
    killed?;

    // Check: each balance is the sum of the account's distinct messages.
    let mut expected: BTreeMap<&str, i64> = BTreeMap::new();
    for message in &messages {
        *expected.entry(message.account).or_default() += message.amount;
    }
    let mut wrong = 0;
    for (account, want) in &expected {
        let balance = match client.get(balance_key(account).as_bytes()).await? {
            Some(Value::Int(value)) => value,
            None => 0,
            Some(other) => bail!("{account}: not a balance: {other:?}"),
        };
        let verdict = if balance == *want { "ok" } else { "WRONG" };
        if balance != *want {
            wrong += 1;
        }
        println!(
            "  {account:<6} balance {balance:>6}, sum of its distinct messages {want:>6}  {verdict}"
        );
    }
    println!(
        "delivered {}, answered as applied {}, answered as duplicates from the registry {}, calls sent again after an unknown outcome or no answer {}",
        counts.delivered.load(Ordering::Relaxed),
        counts.applied.load(Ordering::Relaxed),
        counts.duplicates.load(Ordering::Relaxed),
        counts.unknown_retried.load(Ordering::Relaxed),
    );
    client.close().await;
    drop(cluster);
    if wrong > 0 {
        println!("NOT exactly once");
        std::process::exit(1);
    }
    println!("every message credited exactly once");
    Ok(())
}

/// Applies `deliveries`, a few at a time.
async fn consume(client: &Client, counts: &Counts, deliveries: &[Message]) -> anyhow::Result<()> {
    let mut calls = futures::stream::iter(deliveries)
        .map(|message| apply(client, counts, message))
        .buffer_unordered(IN_FLIGHT);
    while let Some(result) = calls.next().await {
        result?;
    }
    Ok(())
}

/// Credits one delivery, exactly once per message id: the message id is
/// the idempotency key, so a redelivery (or a retry) of an applied message
/// is answered with the original result and credits nothing.
async fn apply(client: &Client, counts: &Counts, message: &Message) -> anyhow::Result<()> {
    counts.delivered.fetch_add(1, Ordering::Relaxed);
    let key = format!("inbox:{}", message.id);
    let command = Command::Increment {
        key: balance_key(message.account).into_bytes(),
        delta: message.amount,
    };
    // Bounded: a cluster that stays down this long is an error here.
    for _ in 0..10 {
        match client
            .execute_with_key(key.as_bytes(), command.clone())
            .await
        {
            Ok(reply) => {
                let counter = if reply.duplicate {
                    &counts.duplicates
                } else {
                    &counts.applied
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let CommandResult::Incremented { .. } = reply.result else {
                    bail!("{}: unexpected result {:?}", message.id, reply.result);
                };
                return Ok(());
            }
            // The deadline passed with the call's fate open: the same key
            // and command again learns it (a duplicate if it had executed).
            Err(Error::KeyOutcomeUnknown { .. } | Error::Unavailable(_)) => {
                counts.unknown_retried.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => return Err(error).with_context(|| format!("apply {}", message.id)),
        }
    }
    bail!("{}: no answer after 10 calls", message.id)
}

fn balance_key(account: &str) -> String {
    format!("inbox:balance:{account}")
}

/// `count` messages with ids `msg-00001`…, random accounts and amounts.
fn messages(seed: u64, count: usize) -> Vec<Message> {
    let mut rng = StdRng::seed_from_u64(seed);
    (1..=count)
        .map(|n| Message {
            id: format!("msg-{n:05}"),
            account: ACCOUNTS[rng.gen_range(0..ACCOUNTS.len())],
            amount: rng.gen_range(1..=100),
        })
        .collect()
}

/// The stream an at-least-once broker delivers: every message one to
/// three times, all deliveries shuffled.
fn at_least_once(seed: u64, messages: &[Message]) -> Vec<Message> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED_0000_DE11_7E55);
    let mut deliveries: Vec<Message> = messages
        .iter()
        .flat_map(|message| std::iter::repeat_n(message.clone(), rng.gen_range(1..=3)))
        .collect();
    deliveries.shuffle(&mut rng);
    deliveries
}

/// The `oncekv` binary: `ONCEKV_BIN`, else `oncekv` in the directory above
/// this example's.
fn server_bin() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("ONCEKV_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("find this example's path")?;
    let candidate = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("oncekv"))
        .context("no directory above this example's")?;
    if !candidate.is_file() {
        bail!(
            "{} not found: build it first (cargo build --release --bin oncekv) or set ONCEKV_BIN",
            candidate.display()
        );
    }
    Ok(candidate)
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => text
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={text:?} is not a number")),
    }
}
