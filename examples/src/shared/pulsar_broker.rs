//! Where an example's partitioned topic lives: the embedded emulator, or a real broker reached
//! through its admin REST API (to create the topic and raise its partition count).

use broker_tools::pulsar_admin::PulsarAdmin;
use pulsar_wire_emulator::Emulator;

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
