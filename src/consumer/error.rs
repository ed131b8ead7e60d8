//! Why a consumer could not run.

use rdkafka::error::KafkaError;

/// Why the consumer could not run.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Kafka client setup failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// Schema codec setup failed.
    #[error(transparent)]
    Codec(#[from] crate::codec::CodecError),
    /// The health endpoint could not bind.
    #[error("health endpoint: {0}")]
    Health(#[from] std::io::Error),
    /// A topic the group reads or writes is missing or differs from its
    /// declaration (the consumer only checks; `topics ensure` fixes).
    #[error(transparent)]
    Topics(#[from] crate::topics::TopicsError),
    /// The error tier is misconfigured.
    #[error("{0}")]
    Config(String),
    /// librdkafka's group handler is stuck (see `coordinator_watch`): the
    /// member stopped so that a new client rejoins the group.
    #[error(
        "consumer group member stopped: {0}; a new client rejoins (restart the process: Kubernetes does; the router restarts the group itself)"
    )]
    CoordinatorStuck(String),
}
