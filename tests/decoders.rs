//! Decoders under attack: every decoder that bytes from the network or the
//! disk reach — registry snapshots, log entries, peer messages, and the
//! protobuf → core conversions — fed arbitrary and mutated bytes. None may
//! panic; a damaged snapshot is never accepted; decoding never allocates
//! beyond the codec's limit (bincode's `with_limit`, checked before any
//! buffer is sized).
//!
//! CI runs a short pass (proptest's 256 cases per property). The long run
//! (documented in docs/testing.md, "Tests"):
//!
//! ```sh
//! PROPTEST_CASES=1000000 cargo test --release --test decoders
//! ```

mod support;

use oncekv::raft_types::TypeConfig;
use oncekv_core::codec;
use oncekv_core::snapshot;
use oncekv_core::{ClientId, Command, Entry, Execute, IdempotencyKey, Nonce, Op, Value};
use oncekv_wire::convert;
use oncekv_wire::proto;
use proptest::prelude::*;
use prost::Message;
use support::registry::{CLUSTER, Driver, append, incr};

/// One edit of a byte string.
#[derive(Clone, Debug)]
enum Edit {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Insert { at: usize, byte: u8 },
    Remove { at: usize },
    Truncate { at: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Edit::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Set { at, byte }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Insert { at, byte }),
        any::<usize>().prop_map(|at| Edit::Remove { at }),
        any::<usize>().prop_map(|at| Edit::Truncate { at }),
    ]
}

/// Applies `edits` to `bytes` (positions taken modulo the current length).
fn mutate(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for edit in edits {
        let len = out.len();
        match *edit {
            Edit::Flip { at, bit } if len > 0 => out[at % len] ^= 1 << bit,
            Edit::Set { at, byte } if len > 0 => out[at % len] = byte,
            Edit::Insert { at, byte } => out.insert(at % (len + 1), byte),
            Edit::Remove { at } if len > 0 => {
                out.remove(at % len);
            }
            Edit::Truncate { at } => out.truncate(at % (len + 1)),
            _ => {}
        }
    }
    out
}

/// A registry with sessions, cached responses of every kind and data of
/// every type, as snapshot bytes.
fn snapshot_sample() -> Vec<u8> {
    let mut driver = Driver::new();
    let a = driver.register(1);
    let b = driver.register(2);
    driver.execute(a, 1, 1, incr("n", 5));
    driver.execute(a, 2, 1, append("l", "x"));
    driver.execute(
        b,
        1,
        1,
        Command::Put {
            key: b"p".to_vec(),
            value: Value::Bytes(vec![7; 40]),
        },
    );
    driver.execute(
        b,
        2,
        1,
        Command::CompareAndSwap {
            key: b"p".to_vec(),
            expected: None,
            new: Value::Int(3),
        },
    );
    driver.advance(10);
    driver.keep_alive(a, 2);
    for (principal, key, command) in [
        ("", "k1", incr("n", 1)),
        ("alice", "k1", append("l", "y")),
        (
            "alice",
            "k2",
            Command::Put {
                key: b"big".to_vec(),
                value: Value::Bytes(vec![0; 65 << 10]),
            },
        ),
    ] {
        driver.apply(Op::ExecuteKeyed {
            cluster_id: CLUSTER,
            key: IdempotencyKey(key.as_bytes().to_vec()),
            command,
            principal: oncekv_core::Principal(principal.into()),
        });
    }
    assert_eq!(driver.registry.key_count(), 3);
    snapshot::to_bytes(&driver.registry)
}

/// Log entries of every op kind, encoded as the log stores them.
fn entry_samples() -> Vec<Vec<u8>> {
    let execute = Op::Execute(Execute {
        cluster_id: CLUSTER,
        client_id: ClientId(3),
        seq: 9,
        first_outstanding_seq: 8,
        command: incr("k", -4),
        principal: oncekv_core::Principal("alice".into()),
    });
    let ops = vec![
        Op::Register {
            cluster_id: Some(CLUSTER),
            nonce: Nonce(0xfeed),
            principal: oncekv_core::Principal("alice".into()),
        },
        execute.clone(),
        Op::KeepAlive {
            cluster_id: CLUSTER,
            client_id: ClientId(3),
            first_outstanding_seq: 10,
            principal: oncekv_core::Principal("alice".into()),
        },
        Op::ExecutePlain {
            cluster_id: CLUSTER,
            command: append("l", "y"),
        },
        Op::Unregister {
            cluster_id: CLUSTER,
            client_id: ClientId(3),
            principal: Some(oncekv_core::Principal("alice".into())),
        },
        Op::ExecuteKeyed {
            cluster_id: CLUSTER,
            key: IdempotencyKey(b"msg-42".to_vec()),
            command: incr("k", 2),
            principal: oncekv_core::Principal("alice".into()),
        },
        Op::ForgetKey {
            cluster_id: CLUSTER,
            principal: oncekv_core::Principal("alice".into()),
            key: IdempotencyKey(b"msg-42".to_vec()),
        },
        Op::PatchConfigs {
            cluster_id: CLUSTER,
            patch: oncekv_core::ConfigPatch {
                window: Some(4),
                ..Default::default()
            },
            keyed: oncekv_core::KeyedConfigPatch {
                idempotency_key_ttl_ms: Some(1_000),
                ..Default::default()
            },
        },
    ];
    let mut samples: Vec<Vec<u8>> = ops
        .iter()
        .map(|op| codec::encode_entry(&Entry::single(1_234, op.clone())))
        .collect();
    samples.push(codec::encode_entry(&Entry {
        stamp_ms: 99,
        ops: ops.into(),
    }));
    samples
}

fn command_samples() -> Vec<Vec<u8>> {
    let commands = [
        incr("counter", 1),
        append("list", "element"),
        Command::Put {
            key: b"k".to_vec(),
            value: Value::List(vec![b"a".to_vec(), b"bc".to_vec()]),
        },
        Command::Delete { key: b"d".to_vec() },
        Command::CompareAndSwap {
            key: b"c".to_vec(),
            expected: Some(Value::Int(1)),
            new: Value::Bytes(b"v".to_vec()),
        },
    ];
    let mut samples: Vec<Vec<u8>> = commands
        .iter()
        .map(|command| {
            proto::ExecuteRequest {
                cluster_id: vec![1; 16],
                client_id: 4,
                seq: 5,
                first_outstanding_seq: 5,
                command: Some(convert::command_to_proto(command)),
            }
            .encode_to_vec()
        })
        .collect();
    samples.extend(commands.iter().map(|command| {
        proto::ExecuteKeyedRequest {
            cluster_id: vec![1; 16],
            idempotency_key: b"msg-42".to_vec(),
            command: Some(convert::command_to_proto(command)),
        }
        .encode_to_vec()
    }));
    samples.push(
        proto::ForgetKeyRequest {
            cluster_id: vec![1; 16],
            principal: "alice".into(),
            idempotency_key: b"msg-42".to_vec(),
        }
        .encode_to_vec(),
    );
    samples
}

/// Checks what a decoded request may hold: the conversion enforces the
/// wire's key bound, so anything it returns is within it.
fn convert_request(bytes: &[u8]) {
    if let Ok(request) = proto::ExecuteKeyedRequest::decode(bytes)
        && let Ok(key) = convert::idempotency_key_from_proto(request.idempotency_key)
    {
        assert!(
            !key.0.is_empty()
                && key.0.len() as u64 <= oncekv_core::bounds::IDEMPOTENCY_KEY_BYTES_MAX,
            "a converted idempotency key the wire refuses"
        );
        let _ = convert::command_from_proto(request.command);
    }
    for request in [
        proto::ForgetKeyRequest::decode(bytes).map(|r| (r.principal, r.idempotency_key)),
        proto::GetKeyRequest::decode(bytes).map(|r| (r.principal, r.idempotency_key)),
    ]
    .into_iter()
    .flatten()
    {
        let _ = convert::principal_from_proto(request.0);
        let _ = convert::idempotency_key_from_proto(request.1);
    }
    let Ok(request) = proto::ExecuteRequest::decode(bytes) else {
        return;
    };
    if let Ok(command) = convert::command_from_proto(request.command) {
        let key = match &command {
            Command::Put { key, .. }
            | Command::Delete { key }
            | Command::Increment { key, .. }
            | Command::Append { key, .. }
            | Command::CompareAndSwap { key, .. } => key,
        };
        assert!(
            convert::check_key(key).is_ok(),
            "a converted command holds a key the wire refuses"
        );
    }
}

/// A client decodes results a server sent; a hostile server must not crash it.
fn convert_reply(bytes: &[u8]) {
    if let Ok(reply) = proto::CommandResult::decode(bytes) {
        let _ = convert::result_from_proto(Some(reply));
    }
    if let Ok(config) = proto::RegistryConfig::decode(bytes) {
        let _ = convert::keyed_config_from_proto(&config);
        let _ = convert::registry_config_from_proto(Some(config));
    }
    if let Ok(patch) = proto::RegistryConfigPatch::decode(bytes) {
        let _ = convert::keyed_config_patch_from_proto(&patch);
        let _ = convert::config_patch_from_proto(Some(patch));
    }
    if let Ok(info) = proto::KeyInfo::decode(bytes) {
        let _ = convert::key_from_proto(info);
    }
}

fn result_samples() -> Vec<Vec<u8>> {
    use oncekv_core::CommandResult;
    [
        CommandResult::Stored,
        CommandResult::Incremented { value: 7 },
        CommandResult::CompareAndSwap {
            swapped: false,
            current: Some(Value::List(vec![b"x".to_vec()])),
        },
        CommandResult::WrongType {
            actual: oncekv_core::ValueKind::List,
        },
    ]
    .iter()
    .map(|result| convert::result_to_proto(result).encode_to_vec())
    .chain(key_samples())
    .collect()
}

/// Key records as `ListKeys` and `GetKey` replies carry them.
fn key_samples() -> Vec<Vec<u8>> {
    let mut registry = support::registry::Driver::new();
    registry.apply(Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(b"k".to_vec()),
        command: incr("n", 1),
        principal: oncekv_core::Principal("alice".into()),
    });
    registry.apply(Op::ExecuteKeyed {
        cluster_id: CLUSTER,
        key: IdempotencyKey(b"big".to_vec()),
        command: append("n", "x"),
        principal: oncekv_core::Principal::anonymous(),
    });
    let (keys, _) = registry.registry.keys_after(
        &oncekv_core::Principal::anonymous(),
        &IdempotencyKey(Vec::new()),
        10,
    );
    assert_eq!(keys.len(), 2);
    keys.iter()
        .map(|view| convert::key_to_proto(view).encode_to_vec())
        .collect()
}

/// A peer's AppendEntries payload as the peer service decodes it.
fn decode_append_entries(bytes: &[u8]) {
    let _ = codec::decode_versioned::<openraft::raft::AppendEntriesRequest<TypeConfig>>(
        oncekv::network::peer::PEER_FORMAT_VERSION,
        bytes,
    );
}

proptest! {
    /// Any edit of a valid snapshot that changes its bytes is refused: the
    /// checksum (or an earlier check) catches it, and nothing panics.
    #[test]
    fn a_damaged_snapshot_is_refused(edits in prop::collection::vec(edit(), 1..6)) {
        let original = snapshot_sample();
        let damaged = mutate(&original, &edits);
        prop_assume!(damaged != original);
        prop_assert!(snapshot::from_bytes(&damaged).is_err());
    }

    /// Arbitrary bytes are never a snapshot.
    #[test]
    fn arbitrary_bytes_are_not_a_snapshot(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        prop_assert!(snapshot::from_bytes(&bytes).is_err());
    }

    /// Mutated log entries decode or are refused; an entry that decodes
    /// encodes again without panicking (the apply path re-encodes nothing,
    /// but a decoded value must be a value like any other).
    #[test]
    fn mutated_entries_never_panic(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let samples = entry_samples();
        let bytes = mutate(which.get::<Vec<u8>>(&samples), &edits);
        if let Ok(entry) = codec::decode_entry(&bytes) {
            let _ = codec::encode_entry(&entry);
        }
    }

    /// Arbitrary bytes as a log entry or a peer message never panic.
    #[test]
    fn arbitrary_entries_and_peer_messages_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let _ = codec::decode_entry(&bytes);
        decode_append_entries(&bytes);
    }

    /// Mutated peer AppendEntries payloads (carrying real entries) never
    /// panic the peer service's decoder.
    #[test]
    fn mutated_peer_messages_never_panic(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let samples = entry_samples();
        // A payload shaped like the real one: the version byte, then an
        // entry's encoding where the request's entries would be.
        let mut payload = vec![oncekv::network::peer::PEER_FORMAT_VERSION];
        payload.extend_from_slice(&which.get::<Vec<u8>>(&samples)[1..]);
        decode_append_entries(&mutate(&payload, &edits));
    }

    /// Mutated and arbitrary protobuf requests and replies convert or are
    /// refused; a converted command respects the wire's bounds.
    #[test]
    fn mutated_protobuf_never_panics(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..6),
        arbitrary in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let requests = command_samples();
        convert_request(&mutate(which.get::<Vec<u8>>(&requests), &edits));
        convert_request(&arbitrary);
        let replies = result_samples();
        convert_reply(&mutate(which.get::<Vec<u8>>(&replies), &edits));
        convert_reply(&arbitrary);
    }
}

/// The largest single allocation this thread asked for while measuring
/// (thread-local, so tests running beside it do not count).
struct Measuring;

thread_local! {
    static LARGEST_ALLOCATION: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

unsafe impl std::alloc::GlobalAlloc for Measuring {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = LARGEST_ALLOCATION.try_with(|largest| {
            if let Some(seen) = largest.get() {
                largest.set(Some(seen.max(layout.size())));
            }
        });
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Measuring = Measuring;

/// Runs `f` and returns the largest single allocation it made.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST_ALLOCATION.with(|largest| largest.set(Some(0)));
    f();
    LARGEST_ALLOCATION.with(|largest| largest.replace(None).unwrap_or(0))
}

/// Length prefixes claiming far more than the bytes hold (2^60 requests in
/// an entry, a 2^60-byte key, a 4 GiB snapshot record) are refused without
/// sizing a buffer for them: no single allocation above 1 MiB.
#[test]
fn a_huge_length_prefix_is_refused_without_allocating() {
    const ONE_MIB: usize = 1 << 20;
    // bincode's varint: 253 announces a u64. An entry is (stamp, ops).
    let mut ops_prefix = vec![codec::ENTRY_FORMAT_VERSION, 5, 253];
    ops_prefix.extend_from_slice(&(1u64 << 60).to_le_bytes());
    // A real Execute entry whose key's length prefix now claims 2^60 bytes.
    let marker = vec![0xab; 3];
    let entry = codec::encode_entry(&Entry::single(
        5,
        Op::Execute(Execute {
            cluster_id: CLUSTER,
            client_id: ClientId(1),
            seq: 1,
            first_outstanding_seq: 1,
            command: Command::Delete {
                key: marker.clone(),
            },
            principal: oncekv_core::Principal("alice".into()),
        }),
    ));
    let mut key_field = vec![3u8];
    key_field.extend_from_slice(&marker);
    let at = entry
        .windows(key_field.len())
        .position(|window| window == key_field.as_slice())
        .expect("the key's encoding is in the entry");
    let mut key_prefix = entry[..at].to_vec();
    key_prefix.push(253);
    key_prefix.extend_from_slice(&(1u64 << 60).to_le_bytes());
    key_prefix.extend_from_slice(&entry[at + key_field.len()..]);
    assert!(matches!(
        codec::decode_entry(&key_prefix),
        Err(codec::CodecError::Malformed(_))
    ));
    for bytes in [ops_prefix, key_prefix] {
        let largest = largest_allocation(|| assert!(codec::decode_entry(&bytes).is_err()));
        assert!(
            largest <= ONE_MIB,
            "decoding allocated {largest} bytes at once"
        );
    }
    let mut snapshot_bytes = snapshot::MAGIC.to_vec();
    snapshot_bytes.extend_from_slice(&snapshot::SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    snapshot_bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    let largest = largest_allocation(|| assert!(snapshot::from_bytes(&snapshot_bytes).is_err()));
    assert!(
        largest <= ONE_MIB,
        "snapshot read allocated {largest} bytes at once"
    );
}

/// The sample snapshot itself decodes (so the mutation property above tests
/// damage, not an already-broken sample).
#[test]
fn the_samples_are_valid() {
    assert!(snapshot::from_bytes(&snapshot_sample()).is_ok());
    for sample in entry_samples() {
        assert!(codec::decode_entry(&sample).is_ok());
    }
    for sample in command_samples().iter().take(5) {
        let request = proto::ExecuteRequest::decode(sample.as_slice()).expect("valid request");
        assert!(convert::command_from_proto(request.command).is_ok());
    }
    for sample in command_samples().iter().skip(5).take(5) {
        let request = proto::ExecuteKeyedRequest::decode(sample.as_slice()).expect("valid");
        assert!(convert::idempotency_key_from_proto(request.idempotency_key).is_ok());
        assert!(convert::command_from_proto(request.command).is_ok());
    }
    for sample in key_samples() {
        let info = proto::KeyInfo::decode(sample.as_slice()).expect("valid key record");
        assert!(convert::key_from_proto(info).is_ok());
    }
}
