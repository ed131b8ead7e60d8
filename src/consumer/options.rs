//! What one consume run is asked to do ([`ConsumeOptions`]) and the topics
//! that implies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::handler::Handler;
use crate::ordering::OrderingMode;
use crate::retry::retry_topic;
use crate::topics::TopicsSettings;

/// Where a new group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The oldest retained record.
    Earliest,
    /// Only records produced after the group first joins.
    Latest,
}

/// What to run.
#[derive(Clone)]
pub struct ConsumeOptions {
    /// Consumer group id.
    pub group: String,
    /// Effects applied to every record, in this order.
    pub handlers: Vec<Arc<dyn Handler>>,
    /// Topic to read (unless `reads` says otherwise), and the one the
    /// error tier is named after (retry topic `<topic>.retry.<group>`).
    pub topic: String,
    /// Topics to read instead of `topic`: a router binding's (the order
    /// topic and/or `cdc.<db>.<table>` topics), whose failures all go
    /// through the one retry topic named after `topic`. Empty: `topic`.
    pub reads: Vec<String>,
    /// Where a new group starts.
    pub start_from: StartFrom,
    /// Exit after this long without new records (and with nothing pending).
    pub until_idle: Option<Duration>,
    /// Where to serve `/health/*` (port 0 = any free port).
    pub health_addr: Option<SocketAddr>,
    /// Route failures through the retry topic and the DLQ (the default).
    /// Off only to measure the tier's cost: failures then wait in place with
    /// backoff (never skipped) and poison is logged and skipped.
    pub error_tier: bool,
    /// Keep per-key order through the error tier (see [`crate::ordering`]).
    pub ordering: OrderingMode,
    /// Test hook, false in production (only a `harness` build's
    /// `chaos.crash_before_forward_ack` sets it): abort the process once a
    /// batch is committed and its failed records are handed to the producer,
    /// before any acknowledgement, parking or offset store.
    pub crash_before_forward_ack: bool,
    /// Benchmarks only, None in production (only a `harness` build's
    /// `chaos.commit_stamps` sets it): told the event ids a batch applied
    /// right after its commit (`dev/bench-latency.sh`).
    pub commit_stamps: Option<Arc<dyn crate::clock::CommitStamps>>,
}

impl ConsumeOptions {
    /// Every topic the group reads records from (not its retry topic):
    /// `reads`, or `topic` when that is empty.
    pub fn read_topics(&self) -> impl Iterator<Item = &str> {
        let own = self.reads.is_empty().then_some(self.topic.as_str());
        own.into_iter().chain(self.reads.iter().map(String::as_str))
    }

    /// Whether failures park their key (mode `key`; only with the error
    /// tier, since without it failures wait in place and order holds anyway).
    pub fn keeps_key_order(&self) -> bool {
        self.ordering == OrderingMode::Key && self.error_tier
    }
}

/// The topics the group reads and writes, with their declared partition
/// counts: the main topic, and with the error tier its retry topic (declared
/// like the main topic) and the dead-letter topic.
pub fn required_topics(
    topics: &TopicsSettings,
    options: &ConsumeOptions,
) -> Vec<crate::topics::Required> {
    use crate::topics::Required;
    let declared = topics.find(&options.topic).map(|spec| spec.partitions);
    let mut required: Vec<Required> = options
        .read_topics()
        .map(|topic| Required {
            topic: topic.to_string(),
            partitions: topics.find(topic).map(|spec| spec.partitions),
        })
        .collect();
    if options.error_tier {
        required.push(Required {
            topic: retry_topic(&options.topic, &options.group),
            partitions: declared,
        });
        required.push(Required::declared(&topics.dead_letter));
    }
    required
}
