//! Compiles the project's `proto/oncekv.proto` (at the workspace root, where
//! the project's layout keeps it) with the pure-Rust `protox` compiler (no
//! system `protoc` exists on our machines) and generates tonic clients and
//! servers.

use prost::Message;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["../../proto/oncekv.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["../../proto"])?;
    // Kept for gRPC server reflection.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("oncekv_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    // The messages some method takes as its request: only a server decodes
    // them, so an undecodable one is the caller's malformed input
    // (`codec.rs`).
    let mut requests: Vec<String> = descriptors
        .file
        .iter()
        .flat_map(|file| &file.service)
        .flat_map(|service| &service.method)
        .map(|method| method.input_type().trim_start_matches('.').to_string())
        .collect();
    requests.sort();
    requests.dedup();
    std::fs::write(
        out_dir.join("request_messages.rs"),
        format!(
            "/// Full names of the messages some method takes as its request.\n\
             pub const REQUEST_MESSAGES: &[&str] = &{requests:?};\n"
        ),
    )?;
    let mut config = tonic_prost_build::Config::new();
    // `prost::Name` for every message: the codec names what it failed to
    // decode, and tells requests from replies.
    config.enable_type_names();
    tonic_prost_build::configure()
        // Written by hand: its decoder bounds the number of items
        // (src/list_value.rs).
        .extern_path(".oncekv.v1.ListValue", "crate::list_value::ListValue")
        .build_server(true)
        .build_client(true)
        .codec_path("crate::codec::WireCodec")
        .compile_fds_with_config(descriptors, config)?;
    Ok(())
}
