//! The network adapter: tonic services and clients. Peer RPCs for Raft,
//! the client-facing API, conversion between protobuf and core types, and
//! the mapping of failures to gRPC statuses — each in one place.

#[cfg(feature = "server")]
pub mod admin_api;
#[cfg(feature = "server")]
pub mod client_api;
pub mod convert;
#[cfg(feature = "server")]
pub mod faults;
#[cfg(feature = "server")]
pub mod peer;
pub mod status;

/// Largest client message either side accepts: a value at the hard bound
/// (`registry::bounds`) plus room.
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 8 << 20;
