//! A runnable tour of the client library against the local cluster that
//! `scripts/cluster.sh start` runs (honours `ONCEKV_PORT_BASE`):
//!
//! ```sh
//! scripts/cluster.sh start
//! cargo run --release --example exactly_once
//! ```

use oncekv_client::{Client, Error};
use oncekv_core::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Any members will do: the library finds the leader and follows it.
    let client = Client::connect(oncekv::cli::default_endpoints());

    // Each call is numbered within this client's session and retried with
    // the same number across timeouts and leader changes: it takes effect
    // exactly once, or the call says its outcome is unknown.
    let balance = client.increment(b"example:balance", 100).await?;
    println!("balance after deposit: {balance}");

    client
        .put(b"example:owner", Value::Bytes(b"ada".to_vec()))
        .await?;
    let (swapped, now) = client
        .compare_and_swap(
            b"example:owner",
            Some(Value::Bytes(b"ada".to_vec())),
            Value::Bytes(b"grace".to_vec()),
        )
        .await?;
    println!("owner swapped: {swapped}, now {now:?}");

    // Many calls may be in flight on one session; the handle is cheap to clone.
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .append(b"example:log", format!("entry {i}").as_bytes())
                    .await
            })
        })
        .collect();
    for call in calls {
        match call.await.expect("task") {
            Ok(result) => println!("appended: {result:?}"),
            // Only this error leaves the effect in doubt; the library has
            // already fenced the request so a late copy cannot execute.
            Err(Error::OutcomeUnknown { seq, reason, .. }) => {
                println!("seq {seq}: outcome unknown ({reason})")
            }
            Err(other) => return Err(other),
        }
    }
    println!("read back: {:?}", client.get(b"example:balance").await?);
    client.close().await;
    Ok(())
}
