//! [`TypedProducer`] and [`TypedConsumer`]: a producer and a consumer of values, encoded and
//! decoded by a [`SchemaCodec`] whose schema they send in `PRODUCER` and `SUBSCRIBE`.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;

use crate::consumer::{Consumer, Message};
use crate::error::Error;
use crate::id::MessageId;
use crate::producer::{OutgoingMessage, Producer};
use crate::schema::SchemaCodec;

/// A producer of values: each is encoded by the codec and sent with the producer's schema
/// version. Created by [`TypedProducer::builder`]. Cheap to clone.
pub struct TypedProducer<S> {
    producer: Producer,
    codec: Arc<S>,
}

impl<S> Clone for TypedProducer<S> {
    fn clone(&self) -> Self {
        Self {
            producer: self.producer.clone(),
            codec: Arc::clone(&self.codec),
        }
    }
}

impl<S: SchemaCodec> fmt::Debug for TypedProducer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedProducer")
            .field("producer", &self.producer)
            .field("schema", self.codec.schema())
            .finish()
    }
}

impl<S: SchemaCodec> TypedProducer<S> {
    pub(crate) fn new(producer: Producer, codec: Arc<S>) -> Self {
        Self { producer, codec }
    }

    /// Encodes `value` and sends it (as [`Producer::send`]).
    ///
    /// # Errors
    /// [`Error::SchemaEncode`] when the codec cannot write the value (nothing is sent); the
    /// errors of [`Producer::send`].
    pub async fn send(&self, value: &S::Value) -> Result<MessageId, Error> {
        let message = self.message(value)?;
        self.producer.send(message).await
    }

    /// The message of `value`, to add a key, properties or a delay before
    /// [`TypedProducer::send_message`].
    ///
    /// # Errors
    /// [`Error::SchemaEncode`] when the codec cannot write the value.
    pub fn message(&self, value: &S::Value) -> Result<OutgoingMessage, Error> {
        Ok(OutgoingMessage::new(self.encode(value)?))
    }

    /// Sends a message made by [`TypedProducer::message`] (as [`Producer::send`]).
    ///
    /// # Errors
    /// The errors of [`Producer::send`].
    pub async fn send_message(&self, message: OutgoingMessage) -> Result<MessageId, Error> {
        self.producer.send(message).await
    }

    /// The payload of `value`.
    ///
    /// # Errors
    /// [`Error::SchemaEncode`] when the codec cannot write the value.
    pub fn encode(&self, value: &S::Value) -> Result<Bytes, Error> {
        self.codec
            .encode(value)
            .map_err(|error| Error::SchemaEncode {
                format: self.codec.schema().kind().as_str(),
                reason: error.to_string(),
            })
    }

    /// The codec.
    pub fn codec(&self) -> &S {
        &self.codec
    }

    /// The producer underneath (its state, its partitions, sends of raw payloads).
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// The version of the schema in the topic's registry ([`Producer::schema_version`]).
    pub fn schema_version(&self) -> Option<Bytes> {
        self.producer.schema_version()
    }

    /// Closes the producer within `deadline` ([`Producer::close`]).
    ///
    /// # Errors
    /// As [`Producer::close`].
    pub async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ProducerCloseReport, Error> {
        self.producer.close(deadline).await
    }
}

/// A message received by a [`TypedConsumer`]: its decoded value and the message itself (to
/// acknowledge it, and for its id, key, properties and schema version).
#[derive(Debug, Clone)]
pub struct TypedMessage<T> {
    value: T,
    message: Message,
}

impl<T> TypedMessage<T> {
    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, taken out.
    pub fn into_value(self) -> T {
        self.value
    }

    /// The message (payload as received, id, key, properties, schema version).
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// The message's id.
    pub fn id(&self) -> MessageId {
        self.message.id()
    }
}

/// A consumer of values: each message is decoded by the codec. Created by
/// [`TypedConsumer::builder`]; acknowledge through it or through
/// [`TypedConsumer::consumer`].
///
/// A payload the codec cannot read is [`Error::SchemaDecode`] from
/// [`TypedConsumer::receive`], with the message's id; the message is not acknowledged
/// ([`Consumer::ack_id`] or [`Consumer::nack_id`] settle it), and the next `receive` goes
/// on with the next message.
pub struct TypedConsumer<S> {
    consumer: Consumer,
    codec: Arc<S>,
}

impl<S: SchemaCodec> fmt::Debug for TypedConsumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedConsumer")
            .field("consumer", &self.consumer)
            .field("schema", self.codec.schema())
            .finish()
    }
}

impl<S: SchemaCodec> TypedConsumer<S> {
    pub(crate) fn new(consumer: Consumer, codec: Arc<S>) -> Self {
        Self { consumer, codec }
    }

    /// The next message, decoded (as [`Consumer::receive`]).
    ///
    /// # Errors
    /// [`Error::SchemaDecode`] for a payload the codec cannot read (the message is not
    /// acknowledged); the errors of [`Consumer::receive`].
    pub async fn receive(&self) -> Result<TypedMessage<S::Value>, Error> {
        let message = self.consumer.receive().await?;
        let value = self.decode(&message)?;
        Ok(TypedMessage { value, message })
    }

    /// The decoded messages as a [`futures_util::Stream`] ([`TypedMessages`]): each item is
    /// what [`TypedConsumer::receive`] returns, in order; the stream ends once the consumer is
    /// closed, as [`Consumer::stream`] does.
    pub fn stream(&self) -> TypedMessages<'_, S> {
        TypedMessages {
            messages: self.consumer.stream(),
            consumer: self,
        }
    }

    /// The value of a message received otherwise (e.g. from [`TypedConsumer::consumer`]'s
    /// stream or batch receive).
    ///
    /// # Errors
    /// [`Error::SchemaDecode`] for a payload the codec cannot read.
    pub fn decode(&self, message: &Message) -> Result<S::Value, Error> {
        self.codec
            .decode(message.payload())
            .map_err(|error| Error::SchemaDecode {
                id: message.id(),
                topic: message.topic().to_owned(),
                format: self.codec.schema().kind().as_str(),
                reason: error.to_string(),
            })
    }

    /// Acknowledges a message ([`Consumer::ack`]).
    ///
    /// # Errors
    /// As [`Consumer::ack`].
    pub async fn ack(&self, message: &TypedMessage<S::Value>) -> Result<(), Error> {
        self.consumer.ack(&message.message).await
    }

    /// Negatively acknowledges a message ([`Consumer::nack`]).
    ///
    /// # Errors
    /// As [`Consumer::nack`].
    pub fn nack(&self, message: &TypedMessage<S::Value>) -> Result<(), Error> {
        self.consumer.nack(&message.message)
    }

    /// The codec.
    pub fn codec(&self) -> &S {
        &self.codec
    }

    /// The consumer underneath (acks by id, transactions, stats, state, streams).
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// Closes the consumer within `deadline` ([`Consumer::close`]).
    ///
    /// # Errors
    /// As [`Consumer::close`].
    pub async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        self.consumer.close(deadline).await
    }
}

/// The decoded messages of a [`TypedConsumer`] as a [`Stream`]
/// ([`TypedConsumer::stream`]): each item is what [`TypedConsumer::receive`] returns, in
/// order. A payload the codec cannot read is an [`Error::SchemaDecode`] item and the stream
/// goes on; it ends as [`crate::Messages`] ends, once the consumer is closed. The consumer
/// stays usable meanwhile, to acknowledge what the stream yields:
///
/// ```no_run
/// use futures_util::StreamExt;
/// use pulsar_wire::schema::SchemaCodec;
/// use pulsar_wire::{Error, TypedConsumer};
///
/// async fn work<S: SchemaCodec>(consumer: &TypedConsumer<S>) -> Result<(), Error> {
///     let mut messages = consumer.stream();
///     while let Some(message) = messages.next().await {
///         let message = message?;
///         // ... use message.value() ...
///         consumer.ack(&message).await?;
///     }
///     Ok(())
/// }
/// ```
pub struct TypedMessages<'a, S: SchemaCodec> {
    messages: crate::Messages<'a>,
    consumer: &'a TypedConsumer<S>,
}

impl<S: SchemaCodec> fmt::Debug for TypedMessages<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedMessages")
            .field("messages", &self.messages)
            .field("schema", self.consumer.codec.schema())
            .finish()
    }
}

impl<S: SchemaCodec> Stream for TypedMessages<'_, S> {
    type Item = Result<TypedMessage<S::Value>, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Poll::Ready(next) = Pin::new(&mut this.messages).poll_next(cx) else {
            return Poll::Pending;
        };
        Poll::Ready(next.map(|received| {
            let message = received?;
            let value = this.consumer.decode(&message)?;
            Ok(TypedMessage { value, message })
        }))
    }
}
