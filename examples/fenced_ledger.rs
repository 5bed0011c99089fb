//! Why claims carry fencing tokens (rule 20), against the local cluster
//! that `scripts/cluster.sh start` runs (honours `ONCEKV_PORT_BASE`):
//!
//! ```sh
//! scripts/cluster.sh start
//! cargo run --release --example fenced_ledger
//! ```
//!
//! A lease alone cannot make an outside effect happen once: a holder that
//! stalls past its lease (a GC pause, a stopped VM, a slow disk) does not
//! know it stalled, and wakes up to finish an effect that another holder
//! has already taken over. oncekv gives every holder of a key a fence that
//! only grows; a downstream that remembers the highest fence it accepted
//! per key — here an in-process "ledger" — refuses the stale holder's
//! write, and oncekv refuses its complete (`FENCED`). The steps:
//!
//! 1. holder A claims the key with a short lease and stalls;
//! 2. holder B finds A's claim in progress, waits out the lease and takes
//!    over (`Client::once`: attempt 2, a larger fence), writes to the
//!    ledger (accepted) and completes;
//! 3. A wakes and writes with its old fence: the ledger refuses it, and
//!    A's complete is `FENCED`;
//! 4. anyone asking later gets B's recorded result, without running
//!    anything.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use oncekv_client::{ClaimAnswer, Client, Error, OnceOptions, OnceOutcome};

/// A downstream system that performs the effect (it charges invoices) and
/// keeps, per key, the highest fence it has accepted: a write with a lower
/// fence comes from a holder whose lease was taken over, and is refused.
#[derive(Default)]
struct Ledger {
    books: Mutex<BTreeMap<Vec<u8>, Book>>,
}

/// One key's page of the ledger.
#[derive(Default)]
struct Book {
    /// The highest fence accepted.
    highest: u64,
    entries: Vec<String>,
}

impl Ledger {
    /// Writes `entry` for `key` under `fence`; refused (with the fence it
    /// has seen) when a larger fence wrote to the key before.
    fn write(&self, key: &[u8], fence: u64, entry: &str) -> Result<(), u64> {
        let mut books = self.books.lock().expect("ledger lock");
        let book = books.entry(key.to_vec()).or_default();
        if fence < book.highest {
            return Err(book.highest);
        }
        book.highest = fence;
        book.entries.push(entry.to_owned());
        Ok(())
    }

    fn entries(&self, key: &[u8]) -> Vec<String> {
        let books = self.books.lock().expect("ledger lock");
        books
            .get(key)
            .map(|book| book.entries.clone())
            .unwrap_or_default()
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoints = oncekv::cli::default_endpoints();
    // Two holders: two processes on two machines, say.
    let holder_a = Client::connect(endpoints.clone());
    let holder_b = Client::connect(endpoints);
    let ledger = Ledger::default();
    #[allow(clippy::disallowed_methods)] // a fresh key for every run of the example
    let key = format!("example:invoice-{:08x}", rand::random::<u32>()).into_bytes();
    let description = b"charge invoice 10 EUR";
    let lease = Duration::from_millis(1_000);
    let name = String::from_utf8_lossy(&key).into_owned();

    // 1. A claims the key and stalls past its lease.
    let ClaimAnswer::Won {
        fence: a_fence,
        attempt,
        ..
    } = holder_a.claim(&key, description, lease).await?
    else {
        unreachable!("a fresh key is won by its first claim");
    };
    println!("1. A claims {name}: won, fence {a_fence}, attempt {attempt}, lease {lease:?}");
    println!("   A stalls (a GC pause, a stopped VM) and stops renewing its lease");

    // 2. B finds the key in progress, waits out A's lease, takes over.
    if let ClaimAnswer::InProgress { retry_after_ms, .. } =
        holder_b.claim(&key, description, lease).await?
    {
        println!("2. B claims {name}: in progress (A's lease runs out in {retry_after_ms} ms)");
    }
    let options = OnceOptions {
        lease,
        wait: Duration::from_secs(30),
        heartbeat: None,
    };
    let outcome = holder_b
        .once(&key, description, &options, |token| {
            let ledger = &ledger;
            async move {
                println!(
                    "   B takes over: fence {}, attempt {} (an earlier holder may have half-done \
                     it: B would reconcile here)",
                    token.fence, token.attempt
                );
                match ledger.write(&token.key, token.fence, "charged 10 EUR (by B)") {
                    Ok(()) => println!("   ledger: B's charge with fence {} accepted", token.fence),
                    Err(seen) => return Err(format!("the ledger saw fence {seen} already")),
                }
                Ok::<_, String>(format!("receipt of B, fence {}", token.fence).into_bytes())
            }
        })
        .await
        .map_err(|error| Error::InvalidArgument(error.to_string()))?;
    let b_fence = match &outcome {
        OnceOutcome::Ran { fence, .. } => *fence,
        OnceOutcome::Replayed { .. } => unreachable!("B is the first to complete"),
    };
    println!(
        "   B completes: recorded {:?}",
        String::from_utf8_lossy(outcome.result())
    );

    // 3. A wakes up and carries on as if it still held the key.
    println!("3. A wakes up and charges with its fence {a_fence}");
    match ledger.write(&key, a_fence, "charged 10 EUR (by A)") {
        Ok(()) => println!("   ledger: A's charge accepted (a second charge!)"),
        Err(seen) => println!(
            "   ledger: A's charge refused: fence {a_fence} < {seen}, the highest it accepted"
        ),
    }
    match holder_a
        .complete_claim(&key, a_fence, b"receipt of A")
        .await
    {
        Err(Error::Fenced { current_fence }) => println!(
            "   oncekv: A's complete is FENCED (the key's fence is {current_fence}); nothing of \
             A's was recorded"
        ),
        other => println!("   oncekv: A's complete answered {other:?} (unexpected)"),
    }

    // 4. Later callers get B's result; nothing runs again.
    let again = holder_a
        .once(&key, description, &options, |_| async {
            Err::<Vec<u8>, _>("must not run: the invoice was charged")
        })
        .await
        .map_err(|error| Error::InvalidArgument(error.to_string()))?;
    println!(
        "4. anyone asking later: replayed {}, {:?}",
        again.replayed(),
        String::from_utf8_lossy(again.result())
    );
    println!("ledger for {name}: {:?}", ledger.entries(&key));
    assert!(b_fence > a_fence, "fences only grow");
    assert_eq!(ledger.entries(&key), ["charged 10 EUR (by B)"]);
    Ok(())
}
