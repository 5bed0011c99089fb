//! The key-value commands of the `oncekv` binary (`src/cli/kv.rs`) run as a
//! user would run them — one process per command — against a real 3-node
//! cluster: plain and JSON output, exit codes, a definite failure when no
//! node can be reached, and an unknown outcome (exit 3) when a reply is lost.
//! At most two clusters are started in this file (CI has 2 cores).

mod support;

use serde_json::{Value as Json, json};
use support::admin::oncekv;
use support::cluster::Cluster;

/// Every command against one cluster, in plain text and JSON, and no
/// session left behind afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_against_a_real_cluster() {
    let cluster = Cluster::start("cli").await;
    let e = cluster.client_addrs();

    // put / get of bytes, an int and a list.
    assert_eq!(oncekv(&e, &["put", "greeting", "hello"]).await.ok(), "OK\n");
    assert_eq!(oncekv(&e, &["get", "greeting"]).await.ok(), "hello\n");
    assert_eq!(oncekv(&e, &["put", "n", "-5", "--int"]).await.ok(), "OK\n");
    assert_eq!(oncekv(&e, &["get", "n"]).await.ok(), "-5\n");
    oncekv(&e, &["put", "letters", "x,y,z", "--list"])
        .await
        .ok();
    assert_eq!(oncekv(&e, &["get", "letters"]).await.ok(), "x\ny\nz\n");

    // incr prints the new value; the delta defaults to 1 and may be negative.
    assert_eq!(oncekv(&e, &["incr", "counter"]).await.ok(), "1\n");
    assert_eq!(oncekv(&e, &["incr", "counter", "2"]).await.ok(), "3\n");
    assert_eq!(oncekv(&e, &["incr", "counter", "-4"]).await.ok(), "-1\n");
    assert_eq!(oncekv(&e, &["get", "counter"]).await.ok(), "-1\n");

    // append prints the new length.
    assert_eq!(oncekv(&e, &["append", "list", "a"]).await.ok(), "1\n");
    assert_eq!(oncekv(&e, &["append", "list", "b"]).await.ok(), "2\n");
    assert_eq!(oncekv(&e, &["get", "list"]).await.ok(), "a\nb\n");

    // cas: swapped / not swapped, with the value now stored.
    let cas = |args: &'static [&'static str]| oncekv(&e, args);
    assert_eq!(
        cas(&["cas", "lock", "alice", "--absent"]).await.ok(),
        "swapped alice\n"
    );
    assert_eq!(
        cas(&["cas", "lock", "bob", "--absent"]).await.ok(),
        "not swapped alice\n"
    );
    assert_eq!(
        cas(&["cas", "lock", "bob", "--expected", "carol"])
            .await
            .ok(),
        "not swapped alice\n"
    );
    assert_eq!(
        cas(&["cas", "lock", "bob", "--expected", "alice"])
            .await
            .ok(),
        "swapped bob\n"
    );
    assert_eq!(
        cas(&["cas", "n", "7", "--int", "--expected", "-5"])
            .await
            .ok(),
        "swapped 7\n"
    );
    assert_eq!(
        cas(&["cas", "missing", "x", "--expected", "y"]).await.ok(),
        "not swapped (absent)\n"
    );

    // del, then get of the absent key: nothing on stdout, exit 1.
    assert_eq!(oncekv(&e, &["del", "greeting"]).await.ok(), "deleted\n");
    assert_eq!(oncekv(&e, &["del", "greeting"]).await.ok(), "absent\n");
    let absent = oncekv(&e, &["get", "greeting"]).await;
    assert_eq!(absent.code, 1, "{absent:?}");
    assert_eq!(absent.stdout, "", "{absent:?}");
    assert!(absent.stderr.contains("key not found"), "{absent:?}");

    // An application refusal is a definite failure: nothing changed.
    let wrong_type = oncekv(&e, &["incr", "list"]).await;
    assert_eq!(wrong_type.code, 1, "{wrong_type:?}");
    assert!(wrong_type.stderr.contains("a list"), "{wrong_type:?}");

    // --json: one object on stdout.
    assert_eq!(
        oncekv(&e, &["get", "n", "--json"]).await.json(),
        json!({"ok": true, "key": "n", "value": {"int": 7}})
    );
    assert_eq!(
        oncekv(&e, &["get", "list", "--json"]).await.json(),
        json!({"ok": true, "key": "list", "value": {"list": ["a", "b"]}})
    );
    assert_eq!(
        oncekv(&e, &["get", "lock", "--json"]).await.json(),
        json!({"ok": true, "key": "lock", "value": {"bytes": "bob"}})
    );
    assert_eq!(
        oncekv(&e, &["incr", "counter", "10", "--json"])
            .await
            .json(),
        json!({"ok": true, "key": "counter", "value": 9})
    );
    assert_eq!(
        oncekv(&e, &["append", "list", "c", "--json"]).await.json(),
        json!({"ok": true, "key": "list", "length": 3})
    );
    assert_eq!(
        oncekv(&e, &["cas", "lock", "dan", "--absent", "--json"])
            .await
            .json(),
        json!({"ok": true, "key": "lock", "swapped": false, "current": {"bytes": "bob"}})
    );
    assert_eq!(
        oncekv(&e, &["del", "lock", "--json"]).await.json(),
        json!({"ok": true, "key": "lock", "existed": true})
    );
    assert_eq!(
        oncekv(&e, &["put", "p", "q", "--json"]).await.json(),
        json!({"ok": true, "key": "p", "value": {"bytes": "q"}})
    );
    let absent = oncekv(&e, &["get", "lock", "--json"]).await;
    assert_eq!(absent.code, 1, "{absent:?}");
    let object = absent.json();
    assert_eq!(object["ok"], false, "{object}");
    assert_eq!(object["kind"], "not_found", "{object}");
    assert_eq!(object["outcome"], "none", "{object}");
    assert_eq!(object["value"], Json::Null, "{object}");

    // Usage errors are clap's exit code 2, before anything is sent.
    for usage in [
        &["put", "k", "twelve", "--int"][..],
        &["cas", "k", "v"],
        &["incr", "k", "x"],
    ] {
        let run = oncekv(&e, usage).await;
        assert_eq!(run.code, 2, "{usage:?}: {run:?}");
        assert_eq!(run.stdout, "", "{usage:?}: {run:?}");
    }

    // sessions: one line per node, and every CLI call closed its session.
    let plain = oncekv(&e, &["sessions"]).await;
    assert_eq!(plain.ok().lines().count(), 3, "{plain:?}");
    assert!(
        plain.stdout.lines().all(|line| line.starts_with("node ")),
        "{plain:?}"
    );
    let object = oncekv(&e, &["sessions", "--json"]).await.json();
    assert_eq!(object["ok"], true, "{object}");
    let nodes = object["nodes"].as_array().expect("a nodes array");
    assert_eq!(nodes.len(), 3, "{object}");
    assert!(
        nodes.iter().all(|node| node["reachable"] == true),
        "{object}"
    );
    let leader = nodes
        .iter()
        .find(|node| node["role"] == "leader")
        .unwrap_or_else(|| panic!("no leader in {object}"));
    // Unregister is applied on the leader before close() returns.
    assert_eq!(leader["sessions"], 0, "sessions left behind: {object}");
    assert!(leader["applied_index"].as_u64().unwrap() > 0, "{object}");
}

/// With no node reachable nothing can be sent, so even an increment fails
/// definitely (exit 1), quickly, with the reason on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoint_is_a_definite_failure() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
    };
    let endpoints = [closed];

    let read = oncekv(&endpoints, &["get", "k", "--timeout-ms", "300"]).await;
    assert_eq!(read.code, 1, "{read:?}");
    assert_eq!(read.stdout, "", "{read:?}");
    assert!(read.stderr.contains("unavailable"), "{read:?}");

    // The client library asks for the cluster id and registers a session
    // before it sends any command; neither can happen here, so the increment
    // was certainly not executed: `Unavailable`, exit 1 — not 3, which is
    // reserved for a command that was sent and not answered (below).
    let incr = oncekv(&endpoints, &["incr", "k", "--timeout-ms", "300", "--json"]).await;
    assert_eq!(incr.code, 1, "{incr:?}");
    let object = incr.json();
    assert_eq!(object["ok"], false, "{object}");
    assert_eq!(object["kind"], "unavailable", "{object}");
    assert_eq!(object["outcome"], "none", "{object}");
    assert!(incr.stderr.contains("unavailable"), "{incr:?}");

    let sessions = oncekv(&endpoints, &["sessions", "--timeout-ms", "300"]).await;
    assert_eq!(sessions.code, 1, "{sessions:?}");
    assert!(sessions.stderr.contains("unreachable"), "{sessions:?}");
}

/// The leader applies the increment but its reply is lost (the
/// `drop-first-execute-reply` fault); the deadline passes before a retry
/// could be answered, so the CLI reports an unknown outcome (exit 3) with
/// the seq fenced — and the increment did happen, once.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_is_an_unknown_outcome() {
    let cluster =
        Cluster::start_with("cli-lost-reply", &["--fault", "drop-first-execute-reply"]).await;
    let e = cluster.client_addrs();

    // Below the client's 2 s attempt timeout, so the first attempt is the
    // only one: it ends with the deadline.
    let incr = oncekv(
        &e,
        &["incr", "balance", "5", "--timeout-ms", "1900", "--json"],
    )
    .await;
    assert_eq!(incr.code, 3, "{incr:?}");
    let object = incr.json();
    assert_eq!(object["ok"], false, "{object}");
    assert_eq!(object["kind"], "outcome_unknown", "{object}");
    assert_eq!(object["outcome"], "unknown", "{object}");
    assert_eq!(object["seq"], 1, "{object}");
    assert_eq!(object["fenced"], true, "{object}");
    assert!(
        incr.stderr.contains("may or may not have taken effect"),
        "{incr:?}"
    );

    // It was applied (once); a new call works and sees it.
    assert_eq!(oncekv(&e, &["get", "balance"]).await.ok(), "5\n");
    assert_eq!(oncekv(&e, &["incr", "balance"]).await.ok(), "6\n");
}
