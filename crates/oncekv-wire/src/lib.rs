//! oncekv's wire, one copy of it for every side that speaks it (the server,
//! the client library, the CLI, the harness): the gRPC types and services
//! generated from `proto/oncekv.proto` (`proto`), their codec (`codec`),
//! the only protobuf ↔ core conversion (`convert`), the one message whose
//! decoder is written by hand to bound it (`list_value`), the only mapping of a
//! failure reason to a gRPC status and back (`status`), the HTTP
//! `Idempotency-Key` header's one parser (`idempotency_header`), the name a
//! client certificate gives its holder (`certificate`, feature
//! `certificate`: the node's principals and the proxy's callers), and the
//! wire's size limits. It must not decide anything a node or a client decides, and must
//! not depend on Raft or storage: no openraft, no sled, no server
//! transport.

#[cfg(feature = "certificate")]
pub mod certificate;
pub mod codec;
pub mod convert;
pub mod idempotency_header;
pub mod list_value;
pub mod proto;
pub mod status;

/// Metadata key of the bearer token (`authorization: Bearer TOKEN`).
pub const AUTHORIZATION_KEY: &str = "authorization";

/// Largest client message either side accepts: a value at the hard bound
/// (`oncekv_core::bounds`) plus room. The client server and the client
/// library set it as their decoding and encoding limit. A larger request is
/// refused by tonic before it is buffered, and the server answers it with
/// `INVALID_ARGUMENT` (reason `INVALID_ARGUMENT`, final; the server's
/// `client_wire` layer); the client library refuses to send one in the
/// first place. Peer messages are sized from it (the server's `peer`).
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 8 << 20;
