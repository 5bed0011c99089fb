//! The generated gRPC types and services of `proto/oncekv.proto` (by
//! `build.rs`); nothing written by hand belongs here. `ListValue` is the
//! one message written by hand (`crate::list_value`), named here too.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("oncekv.v1");
pub use crate::list_value::ListValue;
include!(concat!(env!("OUT_DIR"), "/request_messages.rs"));

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/oncekv_descriptor.bin"));
