//! Compiles the proto subset with protox (no system `protoc` needed): the messages and the
//! `MessagingService` client (the emulator crate generates its server from the same files).
//!
//! Every `bytes` field (the proto subset has one: `Message.body`) is generated as
//! `bytes::Bytes`, so that a received body is a slice of the decoded gRPC message and an
//! outgoing body is shared, not copied, on its way to the encoder.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["apache/rocketmq/v2/service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .bytes(".")
        .compile_fds(files)?;
    Ok(())
}
