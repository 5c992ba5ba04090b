//! Generates the `MessagingService` server from the proto subset (with protox: no system
//! `protoc` needed). The messages are `rocketmq-grpc`'s own (`rocketmq_grpc::pb`), so that the
//! emulator and the client share one set of types; only the server side is generated here.
//! So the message body's type (`bytes::Bytes`, chosen by `rocketmq-grpc`'s build script with
//! `.bytes(".")`) is decided there; a `.bytes` option here would have no message to apply to.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["apache/rocketmq/v2/service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(".apache.rocketmq.v2", "::rocketmq_grpc::pb")
        .compile_fds(files)?;
    Ok(())
}
