//! `GET_TOPICS_OF_NAMESPACE`: the topics of a namespace, as the broker lists them for pattern
//! consumers (`NamespaceService.getListOfUserTopics`).
//!
//! Every topic the emulator holds in the namespace, with the partitions of its partitioned
//! topics by their own names (those not written to yet included), for the mode asked
//! (persistent, non-persistent or both). The emulator does not filter by the pattern the
//! client sends (a broker without `enableBrokerSideSubscriptionPatternEvaluation` does not
//! either): the answer says `filtered: false` and the client filters.

use std::collections::BTreeSet;

use super::Broker;
use crate::outgoing::command;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_get_topics_of_namespace::Mode;
use pulsar_wire::pb::{CommandGetTopicsOfNamespace, CommandGetTopicsOfNamespaceResponse};

impl Broker {
    pub(super) fn on_get_topics_of_namespace(
        &mut self,
        conn: u64,
        body: &CommandGetTopicsOfNamespace,
    ) {
        let mode = body
            .mode
            .and_then(|mode| Mode::try_from(mode).ok())
            .unwrap_or(Mode::Persistent);
        let prefixes: &[&str] = match mode {
            Mode::Persistent => &["persistent://"],
            Mode::NonPersistent => &["non-persistent://"],
            Mode::All => &["persistent://", "non-persistent://"],
        };
        let in_namespace = |name: &str| {
            prefixes.iter().any(|prefix| {
                name.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix(body.namespace.as_str()))
                    .is_some_and(|rest| rest.starts_with('/') && !rest[1..].contains('/'))
            })
        };
        let mut topics: BTreeSet<String> = self
            .topics
            .keys()
            .filter(|name| in_namespace(name))
            .cloned()
            .collect();
        for (base, &partitions) in &self.partitioned {
            if in_namespace(base) {
                topics.extend((0..partitions).map(|i| pulsar_wire::partition_topic(base, i)));
            }
        }
        let mut answer = command(Type::GetTopicsOfNamespaceResponse);
        answer.get_topics_of_namespace_response = Some(CommandGetTopicsOfNamespaceResponse {
            request_id: body.request_id,
            topics: topics.into_iter().collect(),
            filtered: Some(false),
            topics_hash: None,
            changed: Some(true),
        });
        self.reply(conn, answer);
    }
}
