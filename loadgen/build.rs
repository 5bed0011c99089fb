//! Compiles the etcd subset beside this file with the pure-Rust `protox`
//! compiler (no system `protoc`); client stubs only. oncekv's own wire types
//! come from the `oncekv-wire` crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/etcd_subset.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
