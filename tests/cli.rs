//! The key-value commands of the `oncekv` binary (`src/cli/kv/`) run as a
//! user would run them — one process per command — against a real 3-node
//! cluster: plain and JSON output, exit codes, a definite failure when no
//! node can be reached or no leader is elected, and an unknown outcome
//! (exit 3) when a reply is lost; `--idempotency-key` (a replay marked,
//! KEY_CONFLICT exit 4) and `admin keys`. Without any cluster: the common flags
//! work before and after the subcommand (admin, status and bench included),
//! `ONCEKV_PORT_BASE` picks the default endpoints of every command, and an
//! unreachable cluster is one line of what happened and one of what to do.
//! At most two clusters are started in this file (CI has 2 cores).

mod support;

use std::time::Duration;

use serde_json::{Value as Json, json};
use support::admin::{Run, oncekv, run_to_exit};
use support::cluster::Cluster;
use tokio::time::Instant;

/// Runs `oncekv ARGS` exactly as given (no endpoints added), with `env`
/// added to the environment and `ONCEKV_PORT_BASE` and `RUST_LOG` removed
/// unless `env` sets them.
async fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncekv"));
    command
        .args(args)
        .env_remove("ONCEKV_PORT_BASE")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied());
    run_to_exit(command, args).await
}

/// A loopback address nothing listens on (bound, then closed).
fn closed_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// A port base whose three client ports (base+1..=base+3) nothing listens on.
fn closed_port_base() -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port > 65_530 {
            continue;
        }
        let others: Result<Vec<_>, _> = [port + 1, port + 2]
            .iter()
            .map(|port| std::net::TcpListener::bind(("127.0.0.1", *port)))
            .collect();
        if others.is_ok() {
            return port - 1;
        }
    }
    panic!("no three consecutive free loopback ports");
}

/// Asserts that `run` failed with exit 1 and exactly two lines on stderr —
/// `error: <error_start>…` naming every endpoint in `endpoints`, and
/// `hint: <hint_part>…` — with nothing of a debug dump in them.
fn assert_two_line_error(run: &Run, error_start: &str, endpoints: &[&str], hint_part: &str) {
    assert_eq!(run.code, 1, "{run:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "two lines on stderr: {run:?}");
    assert!(
        lines[0].starts_with(&format!("error: {error_start}")),
        "{run:?}"
    );
    for endpoint in endpoints {
        assert!(lines[0].contains(endpoint), "{endpoint} not named: {run:?}");
    }
    assert!(lines[1].starts_with("hint: "), "{run:?}");
    assert!(lines[1].contains(hint_part), "{run:?}");
    for dump in ["tonic", "code: '", "source:", "Os {", "transport error"] {
        assert!(!run.stderr.contains(dump), "{dump:?} on stderr: {run:?}");
    }
}

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

    keyed_commands(&e).await;
    health_of_every_node(&e).await;
    learner_that_never_catches_up(&e).await;

    // Two of three nodes down: the survivor answers but cannot be elected.
    // A command says so, naming who answered and who did not, and fails
    // definitely (nothing could be sent).
    let leader_id = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let survivor = (1..=3).find(|node| *node != leader_id).unwrap();
    for node in (1..=3).filter(|node| *node != survivor) {
        cluster.kill(node);
    }
    cluster
        .wait_until(
            Duration::from_secs(60),
            "the survivor knowing no leader",
            |statuses| {
                statuses[&survivor]
                    .as_ref()
                    .is_ok_and(|status| status.leader_id == 0)
            },
        )
        .await;
    let put = oncekv(&e, &["put", "k", "v", "--timeout-ms", "1000"]).await;
    let others: Vec<String> = (1..=3)
        .filter(|node| *node != survivor)
        .map(|node| cluster.client_addr(node))
        .collect();
    let survivor_addr = cluster.client_addr(survivor);
    let mut named = vec![survivor_addr.as_str()];
    named.extend(others.iter().map(String::as_str));
    assert_two_line_error(&put, "the cluster has no leader: ", &named, "majority");
    assert!(
        put.stderr.contains(&format!(
            "node {survivor} (candidate) at {}",
            cluster.client_addr(survivor)
        )) || put.stderr.contains(&format!("node {survivor} (follower)")),
        "{put:?}"
    );
    assert!(put.stderr.contains("connection refused"), "{put:?}");
}

/// `health` asks every node of `--endpoints` (exit 0 when each is SERVING:
/// the nodes of a running cluster become so once they know its leader) or
/// the one of `--endpoint`; a node nothing listens on is UNREACHABLE and a
/// service the nodes lack SERVICE_UNKNOWN, each exit 1.
async fn health_of_every_node(e: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let object = loop {
        let run = oncekv(e, &["health", "--json"]).await;
        let object = run.json();
        if run.code == 0 || Instant::now() > deadline {
            break object;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(object["ok"], true, "{object}");
    let nodes = object["nodes"].as_array().expect("a nodes array");
    let asked: Vec<&str> = nodes
        .iter()
        .map(|node| node["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(asked, e, "{object}");
    assert!(
        nodes.iter().all(|node| node["status"] == "SERVING"),
        "{object}"
    );
    let plain = oncekv(e, &["health"]).await;
    for (line, endpoint) in plain.ok().lines().zip(e) {
        assert_eq!(line, format!("{endpoint} SERVING"), "{plain:?}");
    }

    let one = oncekv(e, &["health", "--endpoint", &e[1]]).await;
    assert_eq!(one.ok(), "SERVING\n", "{one:?}");
    let closed = closed_endpoint();
    let with_closed = run(
        &[
            "health",
            "--json",
            "--endpoints",
            &format!("{},{closed}", e[0]),
        ],
        &[],
    )
    .await;
    assert_eq!(with_closed.code, 1, "{with_closed:?}");
    let object = with_closed.json();
    assert_eq!(object["ok"], false, "{object}");
    assert_eq!(object["nodes"][0]["status"], "SERVING", "{object}");
    assert_eq!(object["nodes"][1]["status"], "UNREACHABLE", "{object}");
    assert_eq!(
        object["nodes"][1]["error"], "connection refused",
        "{object}"
    );
    let unknown = oncekv(
        e,
        &[
            "health",
            "--endpoint",
            &e[0],
            "--service",
            "no.such.Service",
        ],
    )
    .await;
    assert_eq!(unknown.code, 1, "{unknown:?}");
    assert!(unknown.stdout.starts_with("SERVICE_UNKNOWN"), "{unknown:?}");
}

/// A learner whose process never started: `add-learner` adds it, then says
/// at its catch-up timeout (not the command's deadline) that it has not
/// caught up — exit 1, `not_caught_up`, no unknown outcome; `promote` of it
/// refuses within the node's 5 s wait, the voters unchanged; `remove` takes
/// it out.
async fn learner_that_never_catches_up(e: &[String]) {
    let peer = closed_endpoint();
    let client = closed_endpoint();
    let started = Instant::now();
    let add = oncekv(
        e,
        &[
            "admin",
            "add-learner",
            "9",
            &peer,
            &client,
            "--catch-up-timeout-ms",
            "1000",
            "--json",
        ],
    )
    .await;
    assert_eq!(add.code, 1, "{add:?}");
    let object = add.json();
    assert_eq!(object["kind"], "not_caught_up", "{object}");
    assert_eq!(object["outcome"], "none", "{object}");
    assert!(started.elapsed() < Duration::from_secs(8), "{add:?}");
    let members = oncekv(e, &["admin", "members", "--json"]).await.json();
    let learner = members["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|member| member["node_id"] == 9)
        .unwrap_or_else(|| panic!("node 9 stays added: {members}"));
    assert_eq!(learner["voter"], false, "{members}");

    let started = Instant::now();
    let promote = oncekv(e, &["admin", "promote", "9", "--json"]).await;
    assert_eq!(promote.code, 1, "{promote:?}");
    let object = promote.json();
    assert_eq!(object["kind"], "not_caught_up", "{object}");
    assert!(started.elapsed() < Duration::from_secs(9), "{promote:?}");
    let members = oncekv(e, &["admin", "members", "--json"]).await.json();
    let voters = members["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|member| member["voter"] == true)
        .count();
    assert_eq!(voters, 3, "{members}");

    oncekv(e, &["admin", "remove", "9"]).await.ok();
}

/// `--idempotency-key` and `admin keys`, against the running cluster (no
/// authentication: every key is the anonymous principal's). A keyed
/// increment run twice prints the same value, the second marked a replay
/// and executing nothing; the key with another command exits 4
/// (KEY_CONFLICT); `admin keys list/show/forget` see the key, and after
/// `forget` the same command executes anew; the keyed config fields are
/// set and shown by `admin config`.
async fn keyed_commands(e: &[String]) {
    let incr = ["incr", "paid", "5", "--idempotency-key", "order-1"];
    let first = oncekv(e, &incr).await;
    assert_eq!(first.ok(), "5\n");
    assert_eq!(first.stderr, "", "no replay the first time: {first:?}");
    let again = oncekv(e, &incr).await;
    assert_eq!(again.ok(), "5\n", "the same value: {again:?}");
    assert!(
        again
            .stderr
            .starts_with("replay: idempotency key \"order-1\""),
        "marked a replay: {again:?}"
    );
    assert!(again.stderr.contains("nothing executed now"), "{again:?}");
    let object = oncekv(e, &[&incr[..], &["--json"]].concat()).await.json();
    assert_eq!(object["ok"], true, "{object}");
    assert_eq!(object["value"], 5, "{object}");
    assert_eq!(object["duplicate"], true, "{object}");
    assert_eq!(object["idempotency_key"], "order-1", "{object}");
    let executed_at = object["log_index"].as_u64().expect("a log index");
    assert_eq!(
        oncekv(e, &["get", "paid"]).await.ok(),
        "5\n",
        "executed once"
    );

    // The key with another command: KEY_CONFLICT, its own exit code, and
    // nothing executed.
    let conflict = oncekv(
        e,
        &[
            "incr",
            "paid",
            "6",
            "--idempotency-key",
            "order-1",
            "--json",
        ],
    )
    .await;
    assert_eq!(conflict.code, 4, "{conflict:?}");
    let object = conflict.json();
    assert_eq!(object["ok"], false, "{object}");
    assert_eq!(object["kind"], "key_conflict", "{object}");
    assert_eq!(object["outcome"], "none", "{object}");
    assert_eq!(object["idempotency_key"], "order-1", "{object}");
    assert!(conflict.stderr.contains("hint: "), "{conflict:?}");
    assert_eq!(oncekv(e, &["get", "paid"]).await.ok(), "5\n");

    // Other keyed commands, each marked new in JSON.
    for (args, field, value) in [
        (
            &["put", "kp", "v", "--idempotency-key", "order-2"][..],
            "value",
            json!({"bytes": "v"}),
        ),
        (
            &["append", "kl", "a", "--idempotency-key", "order-3"],
            "length",
            json!(1),
        ),
        (
            &["cas", "kc", "x", "--absent", "--idempotency-key", "order-4"],
            "swapped",
            json!(true),
        ),
        (
            &["del", "kp", "--idempotency-key", "order-5"],
            "existed",
            json!(true),
        ),
    ] {
        let object = oncekv(e, &[args, &["--json"]].concat()).await.json();
        assert_eq!(object["ok"], true, "{args:?}: {object}");
        assert_eq!(object[field], value, "{args:?}: {object}");
        assert_eq!(object["duplicate"], false, "{args:?}: {object}");
    }

    // admin keys list: all five, in key order; --limit pages with a cursor.
    let object = oncekv(e, &["admin", "keys", "list", "--json"]).await.json();
    let keys: Vec<&str> = object["keys"]
        .as_array()
        .expect("a keys array")
        .iter()
        .map(|key| key["idempotency_key"].as_str().expect("a UTF-8 key"))
        .collect();
    assert_eq!(
        keys,
        ["order-1", "order-2", "order-3", "order-4", "order-5"],
        "{object}"
    );
    assert_eq!(object["more"], false, "{object}");
    let first_key = &object["keys"][0];
    assert_eq!(first_key["principal"], "", "{object}");
    assert_eq!(
        first_key["answer"],
        json!({"kind": "incremented", "value": 5}),
        "{object}"
    );
    let page = oncekv(e, &["admin", "keys", "list", "--limit", "2", "--json"])
        .await
        .json();
    assert_eq!(page["keys"].as_array().map(Vec::len), Some(2), "{page}");
    assert_eq!(page["more"], true, "{page}");
    assert_eq!(
        page["next"],
        json!({"after_principal": "", "after_key": "order-2"}),
        "{page}"
    );
    let rest = oncekv(
        e,
        &[
            "admin",
            "keys",
            "list",
            "--after-principal",
            "",
            "--after-key",
            "order-2",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(rest["keys"].as_array().map(Vec::len), Some(3), "{rest}");
    assert_eq!(rest["keys"][0]["idempotency_key"], "order-3", "{rest}");
    let plain = oncekv(e, &["admin", "keys", "list"]).await;
    assert!(
        plain
            .ok()
            .lines()
            .next()
            .is_some_and(|line| line.starts_with("key order-1  principal (anonymous)")),
        "{plain:?}"
    );
    assert!(plain.stdout.contains("5 keys (applied index "), "{plain:?}");

    // show, forget, and the same command executes anew.
    let show = oncekv(e, &["admin", "keys", "show", "order-1"]).await;
    assert!(show.ok().contains("answer incremented to 5"), "{show:?}");
    let object = oncekv(e, &["admin", "keys", "show", "order-1", "--json"])
        .await
        .json();
    assert!(
        object["key"]["expires_after_ms"].as_u64() > object["key"]["created_ms"].as_u64(),
        "{object}"
    );
    let forget = oncekv(e, &["admin", "keys", "forget", "order-1", "--json"])
        .await
        .json();
    assert_eq!(forget["existed"], true, "{forget}");
    assert!(forget["log_index"].as_u64() > Some(executed_at), "{forget}");
    let gone = oncekv(e, &["admin", "keys", "show", "order-1", "--json"]).await;
    assert_eq!(gone.code, 1, "{gone:?}");
    assert_eq!(gone.json()["kind"], "not_found", "{gone:?}");
    let anew = oncekv(e, &incr).await;
    assert_eq!(anew.ok(), "10\n", "executed anew after forget: {anew:?}");
    assert_eq!(anew.stderr, "", "not a replay: {anew:?}");
    let again = oncekv(e, &["admin", "keys", "forget", "no-such-key"]).await;
    assert!(again.ok().contains("had no record"), "{again:?}");

    // The keyed config fields: set and shown.
    let set = oncekv(
        e,
        &[
            "admin",
            "config",
            "set",
            "--idempotency-key-ttl-ms",
            "3600000",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(set["config"]["idempotency_key_ttl_ms"], 3_600_000, "{set}");
    let shown = oncekv(e, &["admin", "config"]).await;
    assert!(
        shown
            .ok()
            .lines()
            .any(|line| line == "idempotency_key_ttl_ms 3600000"),
        "{shown:?}"
    );
    let object = oncekv(e, &["admin", "config", "--json"]).await.json();
    assert_eq!(
        object["config"]["idempotency_key_ttl_ms"], 3_600_000,
        "{object}"
    );
    // A new cluster's default (from rules version 2: key records on disk).
    assert_eq!(
        object["config"]["idempotency_keys_max"], 50_000_000,
        "{object}"
    );
    assert_eq!(
        object["config"]["idempotency_key_bytes_max"], 256,
        "{object}"
    );
    assert_eq!(
        object["config"]["idempotency_cached_bytes_max"],
        16u64 << 30,
        "{object}"
    );
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
    assert!(read.stderr.contains("cannot reach the cluster"), "{read:?}");

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
    assert!(incr.stderr.contains("cannot reach the cluster"), "{incr:?}");

    let sessions = oncekv(&endpoints, &["sessions", "--timeout-ms", "300"]).await;
    assert_eq!(sessions.code, 1, "{sessions:?}");
    assert!(
        sessions.stderr.contains("connection refused"),
        "{sessions:?}"
    );
}

/// With nothing listening, every command that talks to the cluster says in
/// one line which endpoints it tried and what happened, and in a second
/// what to do — no debug dump; `--json` carries the same as fields; the
/// details come only with `RUST_LOG=debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cluster_is_one_line_and_a_hint() {
    let closed = closed_endpoint();
    let e = closed.as_str();
    let flags = ["--endpoints", e, "--timeout-ms", "300"];
    let start_hint = "scripts/cluster.sh start";
    for command in [
        &["put", "a", "b"][..],
        &["get", "a"],
        &["del", "a"],
        &["incr", "c"],
        &["append", "l", "x"],
        &["cas", "a", "b", "--absent"],
        &["sessions"],
        &["admin", "members"],
        &["admin", "sessions"],
        &["admin", "session", "1"],
        &["admin", "expire", "1"],
        &["admin", "config"],
        &["admin", "config", "set", "--window", "8"],
        &["admin", "promote", "4"],
        &["admin", "hash"],
        &["bench", "--duration", "1"],
    ] {
        let args: Vec<&str> = command.iter().chain(&flags).copied().collect();
        let result = run(&args, &[]).await;
        assert_two_line_error(
            &result,
            &format!("cannot reach the cluster at {e}: connection refused"),
            &[e],
            start_hint,
        );
        assert_eq!(result.stdout, "", "{args:?}: {result:?}");
    }
    // A command aimed at one node names that node.
    for command in [
        &["admin", "snapshot", "--node", e][..],
        &["admin", "local-get", "k", "--node", e],
    ] {
        let args: Vec<&str> = command.iter().chain(&flags).copied().collect();
        let result = run(&args, &[]).await;
        assert_two_line_error(
            &result,
            &format!("cannot reach {e}: connection refused"),
            &[e],
            "oncekv status",
        );
    }
    // `status` prints its table (each node's cause) and then the two lines.
    let status = run(&["status", "--endpoints", e], &[]).await;
    assert_two_line_error(
        &status,
        &format!("cannot reach the cluster at {e}: connection refused"),
        &[e],
        start_hint,
    );
    assert_eq!(
        status.stdout,
        format!("{e}  unreachable (connection refused)\n")
    );

    // --json: the same, machine-readable, on stdout.
    let put = run(
        &[
            "put",
            "a",
            "b",
            "--json",
            "--endpoints",
            e,
            "--timeout-ms",
            "300",
        ],
        &[],
    )
    .await;
    assert_eq!(put.code, 1, "{put:?}");
    let object = put.json();
    assert_eq!(object["ok"], false, "{object}");
    assert_eq!(object["kind"], "unavailable", "{object}");
    assert_eq!(object["outcome"], "none", "{object}");
    assert_eq!(
        object["error"],
        format!("cannot reach the cluster at {e}: connection refused"),
        "{object}"
    );
    assert!(
        object["hint"].as_str().unwrap().contains(start_hint),
        "{object}"
    );
    assert_eq!(
        object["nodes"],
        json!([{"endpoint": e, "reachable": false, "error": "connection refused"}]),
        "{object}"
    );

    // A port that accepts connections but never answers: the endpoint is
    // silent, not refusing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = silent
        .local_addr()
        .map(|addr| (silent, addr.to_string()))
        .unwrap();
    let hung = run(
        &["incr", "c", "--endpoints", &silent.1, "--timeout-ms", "300"],
        &[],
    )
    .await;
    assert_two_line_error(
        &hung,
        &format!(
            "cannot reach the cluster at {}: no answer within 300ms",
            silent.1
        ),
        &[],
        start_hint,
    );

    // An unknown host is named as such.
    let unknown = run(
        &[
            "get",
            "a",
            "--endpoints",
            "no-such-host.invalid:7101",
            "--timeout-ms",
            "300",
        ],
        &[],
    )
    .await;
    assert_two_line_error(
        &unknown,
        "cannot reach the cluster at no-such-host.invalid:7101: unknown host",
        &[],
        "host names",
    );

    // The details are for RUST_LOG=debug.
    let debug = run(
        &["put", "a", "b", "--endpoints", e, "--timeout-ms", "300"],
        &[("RUST_LOG", "debug")],
    )
    .await;
    assert_eq!(debug.code, 1, "{debug:?}");
    assert!(debug.stderr.contains("tcp connect error"), "{debug:?}");
    assert!(
        debug
            .stderr
            .contains(&format!("error: cannot reach the cluster at {e}")),
        "{debug:?}"
    );
}

/// `--json`, `--endpoints` and `--timeout-ms` mean the same before the
/// subcommand as after it (and, for admin, between `admin` and its
/// subcommand): same exit code, same JSON, the same endpoint tried, and the
/// deadline honoured (an admin command waits for a leader until it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_flags_work_before_and_after_the_subcommand() {
    let closed = closed_endpoint();
    let e = closed.as_str();
    let flags = ["--json", "--endpoints", e, "--timeout-ms", "300"];
    let commands: [&[&str]; 6] = [
        &["incr", "c"],
        &["get", "c"],
        &["sessions"],
        &["admin", "members"],
        &["admin", "config", "set", "--window", "8"],
        &["status"],
    ];
    for command in commands {
        let before: Vec<&str> = flags.iter().chain(command).copied().collect();
        let after: Vec<&str> = command.iter().chain(&flags).copied().collect();
        let mut variants = vec![before, after];
        if command[0] == "admin" {
            let mut middle = vec!["admin"];
            middle.extend(flags);
            middle.extend(&command[1..]);
            variants.push(middle);
        }
        let mut runs = Vec::new();
        for args in &variants {
            let started = Instant::now();
            let result = run(args, &[]).await;
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "{args:?} ignored --timeout-ms 300: {result:?}"
            );
            assert_eq!(result.code, 1, "{args:?}: {result:?}");
            assert!(result.stderr.contains(e), "{args:?}: {result:?}");
            let json: Vec<Json> = result
                .stdout
                .lines()
                .map(|line| {
                    serde_json::from_str(line)
                        .unwrap_or_else(|error| panic!("{args:?}: not JSON ({error}): {result:?}"))
                })
                .collect();
            assert_eq!(json.len(), 1, "{args:?}: {result:?}");
            runs.push(json);
        }
        assert!(
            runs.windows(2).all(|pair| pair[0] == pair[1]),
            "{command:?}: {runs:?}"
        );
    }

    // `oncekv node` takes none of them: a usage error.
    let node = run(&["--json", "node", "--id", "1"], &[]).await;
    assert_eq!(node.code, 2, "{node:?}");
    assert!(node.stderr.contains("takes none of"), "{node:?}");
    // `bench --failover` runs a cluster of its own: no endpoints, wherever given.
    for args in [
        &["--endpoints", e, "bench", "--failover", "--kills", "1"][..],
        &["bench", "--failover", "--kills", "1", "--endpoints", e],
        &["--timeout-ms", "300", "bench", "--failover", "--kills", "1"],
    ] {
        let failover = run(args, &[]).await;
        assert_eq!(failover.code, 2, "{args:?}: {failover:?}");
        assert_eq!(failover.stdout, "", "{args:?}: {failover:?}");
    }
}

/// Without `--endpoints`, every command asks the local cluster at
/// `ONCEKV_PORT_BASE` + 1..=3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_base_picks_every_commands_default_endpoints() {
    let base = closed_port_base();
    let endpoints: Vec<String> = (1..=3).map(|n| format!("127.0.0.1:{}", base + n)).collect();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let base = base.to_string();
    for command in [
        &["put", "a", "b"][..],
        &["get", "a"],
        &["sessions"],
        &["admin", "members"],
        &["admin", "hash"],
        &["status"],
        &["bench", "--duration", "1"],
    ] {
        let args: Vec<&str> = command
            .iter()
            .chain(&["--timeout-ms", "300"])
            .copied()
            .collect();
        let result = run(&args, &[("ONCEKV_PORT_BASE", &base)]).await;
        assert_two_line_error(
            &result,
            "cannot reach the cluster at ",
            &endpoints,
            "scripts/cluster.sh start",
        );
    }
    // health asks the same three nodes (and answers for each on stdout).
    let health = run(
        &["health", "--json", "--timeout-ms", "300"],
        &[("ONCEKV_PORT_BASE", &base)],
    )
    .await;
    assert_eq!(health.code, 1, "{health:?}");
    let object = health.json();
    let asked: Vec<&str> = object["nodes"]
        .as_array()
        .expect("a nodes array")
        .iter()
        .map(|node| node["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(asked, endpoints, "{object}");
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
    assert!(
        incr.stderr
            .contains("hint: its seq is fenced, so no late copy of it can execute"),
        "{incr:?}"
    );
    assert_eq!(incr.stderr.lines().count(), 2, "{incr:?}");

    // It was applied (once); a new call works and sees it.
    assert_eq!(oncekv(&e, &["get", "balance"]).await.ok(), "5\n");
    assert_eq!(oncekv(&e, &["incr", "balance"]).await.ok(), "6\n");
}
