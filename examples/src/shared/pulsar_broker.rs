//! Where an example's partitioned topic lives: the embedded emulator, or a real broker reached
//! through its admin REST API (to create the topic and raise its partition count).
//!
//! Included with `#[path]` by `pulsar_priority` here and by `pulsar_priority_growth` in
//! `bench-tools` (one copy for both crates).

use broker_tools::pulsar_admin::PulsarAdmin;
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

/// The broker of a run.
pub(crate) enum Broker {
    /// The embedded emulator.
    Emulator(Emulator),
    /// A real broker.
    Real {
        /// Its admin API.
        admin: PulsarAdmin,
    },
}

impl Broker {
    /// The real broker at `service_url` with its admin API at `admin_url` when both are
    /// given, else a freshly started embedded emulator; with the service URL to connect to.
    pub(crate) async fn choose(
        service_url: Option<&str>,
        admin_url: Option<&str>,
    ) -> Result<(Broker, String), String> {
        match (service_url, admin_url) {
            (Some(url), Some(admin)) => Ok((
                Broker::Real {
                    admin: PulsarAdmin::new(admin).map_err(|e| e.to_string())?,
                },
                url.to_owned(),
            )),
            _ => {
                let emulator = Emulator::start(EmulatorConfig::default())
                    .await
                    .map_err(|e| format!("starting the emulator: {e}"))?;
                let url = emulator.endpoint().to_owned();
                Ok((Broker::Emulator(emulator), url))
            }
        }
    }

    /// Creates `topic` with `partitions` partitions.
    pub(crate) async fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), String> {
        match self {
            Broker::Emulator(e) => e.create_topic(topic, partitions).map_err(|e| e.to_string()),
            Broker::Real { admin } => admin
                .create_partitioned_topic(topic, partitions)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Raises `topic` to `partitions` partitions.
    pub(crate) async fn grow(&self, topic: &str, partitions: u32) -> Result<(), String> {
        match self {
            Broker::Emulator(e) => e
                .update_partitions(topic, partitions)
                .map_err(|e| e.to_string()),
            Broker::Real { admin } => admin
                .update_partitions(topic, partitions)
                .await
                .map_err(|e| e.to_string()),
        }
    }
}
