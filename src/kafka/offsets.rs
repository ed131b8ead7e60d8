//! Offsets by time: where the records of a partition at or after a moment
//! start, for a reader that moves by offset (the console's explorer starts
//! a page there, reconciliation a window, rewind a group's commit).
//!
//! * [`partition_count`]: how many partitions a topic has, if it exists.
//! * [`PartitionRange`]: the offsets a partition holds (its watermarks);
//!   [`partition_ranges`] those of every partition of a topic.
//! * [`first_offsets_at`]: per partition, the first offset whose timestamp
//!   is at or after a time (Kafka's `ListOffsets` by timestamp, librdkafka's
//!   `offsets_for_times`), placed within the partition's range.
//! * [`offsets_at`]: many partitions' ends (or starts) in one request.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

/// One partition's offsets: records `low..high` can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PartitionRange {
    /// Partition.
    pub partition: i32,
    /// Log start offset.
    pub low: i64,
    /// Last stable offset (the end as `read_committed` readers see it).
    pub high: i64,
}

impl PartitionRange {
    /// The range of `topic`'s `partition` as `consumer` sees it: with
    /// `isolation.level = read_committed` the end is the last stable offset.
    pub fn fetch(
        consumer: &BaseConsumer,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> KafkaResult<Self> {
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        Ok(Self {
            partition,
            low,
            high,
        })
    }

    /// Where `offsets_for_times`' answer for this partition falls: the
    /// offset found, kept within `low..=high`; no record at or after the
    /// time (librdkafka answers `Offset::End`, or nothing) is the end,
    /// `high`. Every caller wants that: a reader starting there reads
    /// nothing, a window ending there runs to the end, a group rewound
    /// there goes on with the next record written.
    fn place(&self, found: Option<Offset>) -> i64 {
        match found {
            Some(Offset::Offset(o)) => o.clamp(self.low, self.high),
            _ => self.high,
        }
    }
}

/// The partition count of `topic`; None if the broker does not know the
/// topic (or reports an error for it, or no partition).
pub fn partition_count(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Option<i32>> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len() as i32)
        .filter(|n| *n > 0))
}

/// The range of every partition of `topic`, in partition order; None if
/// the topic does not exist ([`partition_count`]). Two requests whatever
/// the partition count ([`offsets_at`]: the starts, then the ends).
pub fn partition_ranges(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Option<Vec<PartitionRange>>> {
    let Some(count) = partition_count(consumer, topic, timeout)? else {
        return Ok(None);
    };
    let partitions = || (0..count).map(|p| (topic, p));
    let lows = offsets_at(consumer, partitions(), Offset::Beginning, timeout)?;
    let highs = offsets_at(consumer, partitions(), Offset::End, timeout)?;
    (0..count)
        .map(|partition| {
            let key = (topic.to_string(), partition);
            match (lows.get(&key), highs.get(&key)) {
                (Some(&low), Some(&high)) => Ok(PartitionRange {
                    partition,
                    low,
                    high,
                }),
                // As a per-partition watermark query that got no answer.
                _ => Err(KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition)),
            }
        })
        .collect::<KafkaResult<Vec<_>>>()
        .map(Some)
}

/// For each of `ranges` (partitions of `topic`), the first offset whose
/// timestamp is at or after `ms` (ms since the epoch), in the order of
/// `ranges`, placed within the partition's range: a partition with no
/// record that late gives its end, `high` (see [`PartitionRange`]). One
/// broker request for all the partitions.
pub fn first_offsets_at(
    consumer: &BaseConsumer,
    topic: &str,
    ranges: &[PartitionRange],
    ms: i64,
    timeout: Duration,
) -> KafkaResult<Vec<i64>> {
    let mut wanted = TopicPartitionList::new();
    for range in ranges {
        wanted.add_partition_offset(topic, range.partition, Offset::Offset(ms))?;
    }
    let found: BTreeMap<i32, Offset> = consumer
        .offsets_for_times(wanted, timeout)?
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset()))
        .collect();
    Ok(ranges
        .iter()
        .map(|range| range.place(found.get(&range.partition).copied()))
        .collect())
}

/// Each of `partitions`' end (`Offset::End`: the high watermark, or under
/// `read_committed` the last stable offset) or start (`Offset::Beginning`),
/// all in one ListOffsets request per broker, not one per partition: a
/// consumer's requests queue on its connection behind the fetch the broker
/// holds for new data (`fetch.wait.max.ms`), so one request waits once.
/// A partition the broker had no offset for is missing from the answer.
pub fn offsets_at<'a, C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    partitions: impl IntoIterator<Item = (&'a str, i32)>,
    at: Offset,
    timeout: Duration,
) -> KafkaResult<HashMap<(String, i32), i64>> {
    let mut wanted = TopicPartitionList::new();
    for (topic, partition) in partitions {
        wanted.add_partition_offset(topic, partition, at)?;
    }
    if wanted.count() == 0 {
        // librdkafka refuses an empty list.
        return Ok(HashMap::new());
    }
    let mut found = HashMap::new();
    for e in consumer.offsets_for_times(wanted, timeout)?.elements() {
        e.error()?;
        if let Offset::Offset(o) = e.offset() {
            found.insert((e.topic().to_string(), e.partition()), o);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_within_the_range_and_no_answer_is_the_end() {
        let range = PartitionRange {
            partition: 0,
            low: 10,
            high: 20,
        };
        assert_eq!(range.place(Some(Offset::Offset(15))), 15);
        assert_eq!(range.place(Some(Offset::Offset(3))), 10);
        assert_eq!(range.place(Some(Offset::Offset(25))), 20);
        assert_eq!(range.place(Some(Offset::End)), 20);
        assert_eq!(range.place(None), 20);
    }
}
