//! The generated client stubs (see build.rs).

#![allow(clippy::all, clippy::pedantic)]

/// The project's own wire API (`proto/oncekv.proto` at the workspace root).
pub mod oncekv {
    tonic::include_proto!("oncekv.v1");
}

/// The subset of etcd's `etcdserverpb` in `loadgen/proto/etcd_subset.proto`.
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}
