//! The network adapter: tonic services and clients. Peer RPCs for Raft,
//! the client-facing API, conversion between protobuf and core types, and
//! the mapping of failures to gRPC statuses — each in one place.

pub mod client_api;
pub mod convert;
pub mod peer;
pub mod status;
