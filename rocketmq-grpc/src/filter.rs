//! [`FilterExpression`]: which messages of a subscribed topic a consumer receives, by tag or by a
//! SQL92 expression over the message's properties.

use crate::Error;
use crate::pb;

/// The kind of a [`FilterExpression`] (the Java client's `FilterExpressionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FilterKind {
    /// A tag expression: `*` (every message), one tag, or tags joined by `||`.
    Tag,
    /// A SQL92 expression over the user properties and `TAGS` (the Java client's
    /// `FilterExpressionType.SQL92`).
    Sql92,
}

/// Which messages of a subscribed topic a consumer receives: the Java client's
/// `FilterExpression`, given to [`PushConsumerBuilder::subscribe`](crate::PushConsumerBuilder::subscribe)
/// and [`SimpleConsumerBuilder::subscribe`](crate::SimpleConsumerBuilder::subscribe).
///
/// A string is a tag expression (`"*"`, `"a"`, `"a || b"`), so `subscribe("orders", "*")`
/// keeps working; [`FilterExpression::sql92`] filters on the message's properties instead.
///
/// SQL92 is meant to need the broker's `enablePropertyFilter=true` (in `broker.conf`; off by
/// default). The broker evaluates the expression on the user properties ([`OutgoingMessage::property`](crate::OutgoingMessage::property))
/// and on `TAGS` (the tag): comparisons (`=`, `<>`, `<`, `<=`, `>`, `>=`), `AND`, `OR`, `NOT`,
/// `IN (...)`, `BETWEEN ... AND ...`, `IS NULL`, `IS NOT NULL`, string literals in single
/// quotes, numbers, `TRUE` and `FALSE`. A message that lacks a property the expression reads
/// does not match. The 5.3.3 proxy accepts any expression in the consumer's settings and
/// refuses one it cannot parse at each receive, with `INTERNAL_SERVER_ERROR` "parse the
/// consumer's subscription failed": the consumer's error ([`Error::Server`]) then names the
/// topic and the expression, and is not retryable ([`Error::is_retryable`]).
///
/// Seen on a 5.3.3 broker: pop receives (what this crate's consumers use) were filtered by
/// SQL92 even without `enablePropertyFilter`; set it anyway, as remoting consumers need it.
///
/// ```
/// use rocketmq_grpc::{FilterExpression, FilterKind};
///
/// let everything = FilterExpression::all();
/// let paid = FilterExpression::tag("paid || refunded");
/// let big = FilterExpression::sql92("region = 'eu' AND amount > 100");
/// assert_eq!(big.kind(), FilterKind::Sql92);
/// assert_eq!(FilterExpression::from("paid"), FilterExpression::tag("paid"));
/// assert_eq!(everything.expression(), "*");
/// # let _ = paid;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FilterExpression {
    kind: FilterKind,
    expression: String,
}

impl FilterExpression {
    /// Every message of the topic: the tag expression `*` (the Java client's `SUB_ALL`).
    pub fn all() -> Self {
        Self::tag("*")
    }

    /// A tag expression: `*`, one tag, or tags joined by `||` (`"a || b"`).
    pub fn tag(expression: impl Into<String>) -> Self {
        Self {
            kind: FilterKind::Tag,
            expression: expression.into(),
        }
    }

    /// A SQL92 expression over the user properties and `TAGS`, such as
    /// `"region = 'eu' AND amount BETWEEN 10 AND 100"` (see the type's docs for the syntax and
    /// the broker setting it needs).
    pub fn sql92(expression: impl Into<String>) -> Self {
        Self {
            kind: FilterKind::Sql92,
            expression: expression.into(),
        }
    }

    /// The kind: tag or SQL92.
    pub fn kind(&self) -> FilterKind {
        self.kind
    }

    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Refuses what no proxy accepts: a blank expression. `subscribe` names the setting.
    pub(crate) fn validate(&self, topic: &str) -> Result<(), Error> {
        if self.expression.trim().is_empty() {
            let what = match self.kind {
                FilterKind::Tag => "tag expression (use \"*\" for every message)",
                FilterKind::Sql92 => "SQL92 expression",
            };
            return Err(Error::invalid(
                "subscribe",
                format!("the subscription of topic {topic:?} has an empty {what}"),
            ));
        }
        Ok(())
    }

    /// As the protocol's `FilterExpression`.
    pub(crate) fn to_pb(&self) -> pb::FilterExpression {
        let kind = match self.kind {
            FilterKind::Tag => pb::FilterType::Tag,
            FilterKind::Sql92 => pb::FilterType::Sql,
        };
        pb::FilterExpression {
            r#type: kind as i32,
            expression: self.expression.clone(),
        }
    }
}

impl From<&str> for FilterExpression {
    /// A tag expression.
    fn from(expression: &str) -> Self {
        Self::tag(expression)
    }
}

impl From<String> for FilterExpression {
    /// A tag expression.
    fn from(expression: String) -> Self {
        Self::tag(expression)
    }
}

impl From<&String> for FilterExpression {
    /// A tag expression.
    fn from(expression: &String) -> Self {
        Self::tag(expression.as_str())
    }
}

impl std::fmt::Display for FilterExpression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            FilterKind::Tag => write!(f, "tag expression {:?}", self.expression),
            FilterKind::Sql92 => write!(f, "SQL92 expression {:?}", self.expression),
        }
    }
}

/// Names the subscription's filter in the proxy's refusal of it (`ILLEGAL_FILTER_EXPRESSION`,
/// or the broker's refusal of a SQL92 filter when property filtering is off), which otherwise
/// may not say which expression of which topic it refused.
pub(crate) fn explain_filter_error(error: Error, topic: &str, filter: &FilterExpression) -> Error {
    let illegal = error.code() == Some(crate::Code::IllegalFilterExpression);
    match error {
        Error::Server { rpc, code, message } if illegal || mentions_filter(&message) => {
            let hint = match filter.kind {
                FilterKind::Sql92 => {
                    "; check its syntax, and that the broker has enablePropertyFilter=true"
                }
                FilterKind::Tag => "",
            };
            Error::Server {
                rpc,
                code,
                message: format!(
                    "{message} (the subscription of topic {topic:?} with the {filter}{hint})"
                ),
            }
        }
        other => other,
    }
}

fn mentions_filter(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("filter")
        || lower.contains("sql")
        || lower.contains("expression")
        || lower.contains("subscription")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_tag_expressions_and_blank_ones_are_refused() {
        assert_eq!(FilterExpression::from("a || b").kind(), FilterKind::Tag);
        assert_eq!(
            FilterExpression::from(String::from("*")),
            FilterExpression::all()
        );
        let error = FilterExpression::sql92("  ").validate("t").unwrap_err();
        assert!(matches!(
            error,
            Error::Invalid {
                what: "subscribe",
                ..
            }
        ));
        assert!(error.to_string().contains("SQL92"), "{error}");
        assert!(FilterExpression::tag("").validate("t").is_err());
        assert!(FilterExpression::sql92("a > 1").validate("t").is_ok());
    }

    #[test]
    fn the_wire_form_has_the_protocol_type() {
        let sql = FilterExpression::sql92("a > 1").to_pb();
        assert_eq!(sql.r#type, pb::FilterType::Sql as i32);
        assert_eq!(sql.expression, "a > 1");
        assert_eq!(
            FilterExpression::tag("x").to_pb().r#type,
            pb::FilterType::Tag as i32
        );
    }

    #[test]
    fn refusals_name_the_expression() {
        let refused = Error::Server {
            rpc: "ReceiveMessage",
            code: pb::Code::IllegalFilterExpression as i32,
            message: "bad".into(),
        };
        let explained =
            explain_filter_error(refused, "orders", &FilterExpression::sql92("a >>> 1"));
        let text = explained.to_string();
        assert!(
            text.contains("a >>> 1") && text.contains("orders"),
            "{text}"
        );
        let other = Error::Server {
            rpc: "ReceiveMessage",
            code: pb::Code::TopicNotFound as i32,
            message: "no topic".into(),
        };
        let kept = explain_filter_error(other, "orders", &FilterExpression::all());
        assert!(!kept.to_string().contains("subscription"));
    }
}
