//! The generated `MessagingService` server (see `build.rs`); its messages are
//! `rocketmq_grpc::pb`'s.

#![allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]

tonic::include_proto!("apache.rocketmq.v2");
