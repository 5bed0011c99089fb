//! Compiles the project's own `proto/oncekv.proto` (the wire API being
//! measured, never a copy of it) and the etcd subset beside this file with the
//! pure-Rust `protox` compiler (no system `protoc`); client stubs only.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        ("../proto", "../proto/oncekv.proto"),
        ("proto", "proto/etcd_subset.proto"),
    ];
    for (include, proto) in protos {
        println!("cargo:rerun-if-changed={proto}");
        let descriptors = protox::compile([proto], [include])?;
        tonic_prost_build::configure()
            .build_server(false)
            .build_client(true)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
