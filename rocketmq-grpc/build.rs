//! Compiles the proto subset with protox (no system `protoc` needed): the messages and the
//! `MessagingService` client (the emulator crate generates its server from the same files).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["apache/rocketmq/v2/service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(files)?;
    Ok(())
}
