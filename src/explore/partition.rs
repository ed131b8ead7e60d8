//! Which partition a key is in: the partitioner the producers really use.
//!
//! The relay, `produce` and `cdc` all build their producer from
//! [`crate::kafka::client::producer_options`]: `murmur2_random` (Kafka's Java
//! clients' murmur2) unless `producer.options.partitioner` says otherwise.
//! [`Partitioner::of_producer`] reads that effective setting, and
//! [`Partitioner::partition`] calls librdkafka's own partitioner function of
//! that name, so the explorer finds a key where the producer put it, with no
//! second implementation of the hash to drift from the first.

use rdkafka::bindings as rd;
use serde::Serialize;

use crate::kafka::client::{
    KafkaSettings, OptionConflict, PARTITIONER, PARTITIONERS, producer_options,
};
use crate::producer::ProducerSettings;

/// librdkafka's default partitioner, used when no option names one.
const LIBRDKAFKA_DEFAULT: &str = "consistent_random";

/// A producer's partitioner, as librdkafka names it (`murmur2_random`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partitioner {
    /// The librdkafka name.
    pub name: String,
}

/// The hash functions behind librdkafka's partitioner names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hash {
    Murmur2,
    Crc32,
    Fnv1a,
}

impl Partitioner {
    /// The partitioner of the effective producer options (defaults, then
    /// `kafka.options`, then `producer.options`), as the relay builds them.
    pub fn of_producer(
        kafka: &KafkaSettings,
        producer: &ProducerSettings,
    ) -> Result<Self, OptionConflict> {
        let options = producer_options(&kafka.client_options(), &producer.options)?;
        Self::named(
            options
                .get(PARTITIONER)
                .map_or(LIBRDKAFKA_DEFAULT, String::as_str),
        )
    }

    /// A partitioner by its librdkafka name; the error lists the accepted ones.
    pub fn named(name: &str) -> Result<Self, OptionConflict> {
        if PARTITIONERS.contains(&name) {
            Ok(Self {
                name: name.to_string(),
            })
        } else {
            Err(OptionConflict(format!(
                "{PARTITIONER}={name} is not a librdkafka partitioner; accepted: {}",
                PARTITIONERS.join(", ")
            )))
        }
    }

    fn hash(&self) -> Option<Hash> {
        // `<hash>_random` hashes a key and picks at random only for a record
        // without one; a key always has one partition.
        match self.name.trim_end_matches("_random") {
            "murmur2" => Some(Hash::Murmur2),
            "consistent" => Some(Hash::Crc32),
            "fnv1a" => Some(Hash::Fnv1a),
            _ => None,
        }
    }

    /// The partition of `key` among `partitions`, or None when this
    /// partitioner places records at random (`random`), the key is empty
    /// (the `_random` variants then pick at random) or there are no partitions.
    pub fn partition(&self, key: &[u8], partitions: i32) -> Option<i32> {
        if key.is_empty() || partitions <= 0 {
            return None;
        }
        let function = match self.hash()? {
            Hash::Murmur2 => rd::rd_kafka_msg_partitioner_murmur2,
            Hash::Crc32 => rd::rd_kafka_msg_partitioner_consistent,
            Hash::Fnv1a => rd::rd_kafka_msg_partitioner_fnv1a,
        };
        // SAFETY: the non-random partitioners only hash `key[..len]` and
        // reduce it modulo `partitions`; they never read the topic handle
        // or the opaques (librdkafka's rdkafka_msg.c), so null is fine.
        let partition = unsafe {
            function(
                std::ptr::null(),
                key.as_ptr().cast(),
                key.len(),
                partitions,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        Some(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's Java `Utils.murmur2` test vectors, through
    /// `toPositive(murmur2(key)) % n` as the Java DefaultPartitioner does.
    #[test]
    fn murmur2_is_kafkas_java_hash() {
        let java = |hash: i32, n: i32| (hash & 0x7fff_ffff) % n;
        let murmur2 = Partitioner::named("murmur2_random").unwrap();
        for (key, hash) in [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
        ] {
            for n in [1, 3, 12, 1000] {
                assert_eq!(
                    murmur2.partition(key.as_bytes(), n),
                    Some(java(hash, n)),
                    "{key} over {n}"
                );
            }
        }
    }

    #[test]
    fn random_and_empty_keys_have_no_partition_and_unknown_names_are_refused() {
        assert_eq!(
            Partitioner::named("random").unwrap().partition(b"42", 12),
            None
        );
        assert_eq!(
            Partitioner::named("murmur2").unwrap().partition(b"", 12),
            None
        );
        assert_eq!(
            Partitioner::named("murmur2").unwrap().partition(b"42", 0),
            None
        );
        let crc = Partitioner::named("consistent_random")
            .unwrap()
            .partition(b"42", 12)
            .unwrap();
        assert!((0..12).contains(&crc));
        let e = Partitioner::named("crc32").unwrap_err().to_string();
        assert!(
            e.contains("partitioner=crc32") && e.contains("murmur2_random"),
            "{e}"
        );
    }
}
