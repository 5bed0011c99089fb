//! The network adapter: tonic services and clients. Peer RPCs for Raft,
//! the client-facing API, conversion between protobuf and core types, and
//! the mapping of failures to gRPC statuses — each in one place.

#[cfg(feature = "server")]
pub mod admin_api;
#[cfg(feature = "server")]
pub mod auth;
#[cfg(feature = "server")]
pub mod client_api;
#[cfg(feature = "server")]
pub mod client_wire;
pub mod convert;
pub mod credentials;
#[cfg(feature = "server")]
pub mod faults;
#[cfg(feature = "server")]
pub mod http_api;
#[cfg(feature = "server")]
pub mod peer;
#[cfg(feature = "server")]
pub mod proposer;
pub mod status;
#[cfg(feature = "server")]
pub mod tls;
pub mod wire_codec;

/// Largest client message either side accepts: a value at the hard bound
/// (`registry::bounds`) plus room. The client server and the client library
/// set it as their decoding and encoding limit. A larger request is refused
/// by tonic before it is buffered, and the server answers it with
/// `INVALID_ARGUMENT` (reason `INVALID_ARGUMENT`, final; see
/// `client_wire`); the client library refuses to send one in the first
/// place. Peer messages are sized from it (see `peer`).
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 8 << 20;
