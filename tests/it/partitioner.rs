//! A key lands in the partition Kafka's own Java producer picks for it
//! (murmur2), so an order written by a Java service and by orderpipe stays
//! in one partition and in order.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::Message;

use crate::helpers::{STACK_SCRIPT, TestEnv};

/// Value of the records the Java producer writes (orderpipe's are Avro).
const JAVA_VALUE: &[u8] = b"java";

#[test]
fn each_key_lands_in_the_partition_the_java_producer_picks() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let topic = env.settings.topics.order_events.name.clone();

    // orderpipe's own producer path: `orderpipe produce`, keyed by order id.
    let count = 6_000;
    let out = env
        .cli(&[
            "produce",
            "--count",
            &count.to_string(),
            "--orders",
            "3000",
            "--first-order-id",
            "500000",
        ])
        .success();
    assert!(out.contains(&format!("acknowledged {count}")), "{out}");
    let mut orderpipe_partition: BTreeMap<Vec<u8>, i32> = BTreeMap::new();
    for m in env.read(&topic, count, Duration::from_secs(120)) {
        let key = m.key().expect("keyed record").to_vec();
        let first = *orderpipe_partition.entry(key).or_insert(m.partition());
        assert_eq!(
            first,
            m.partition(),
            "orderpipe split a key over two partitions"
        );
    }
    let keys: Vec<String> = orderpipe_partition
        .keys()
        .map(|k| String::from_utf8(k.clone()).expect("order ids are text"))
        .collect();
    assert!(keys.len() >= 2_000, "a few thousand keys: {}", keys.len());
    let used: BTreeSet<i32> = orderpipe_partition.values().copied().collect();
    assert_eq!(used.len(), 12, "keys spread over all partitions");

    // The same keys through Kafka's Java ConsoleProducer (default partitioner),
    // one JVM for all of them.
    let mut java = Command::new(STACK_SCRIPT)
        .args([
            "kafka-class",
            "org.apache.kafka.tools.ConsoleProducer",
            "--bootstrap-server",
            &env.settings.kafka.bootstrap_servers,
            "--topic",
            &topic,
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "key.separator=:",
            "--command-property",
            "acks=all",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dev/stack.sh kafka-class runs");
    {
        let mut stdin = java.stdin.take().expect("stdin piped");
        for key in &keys {
            writeln!(stdin, "{key}:{}", String::from_utf8_lossy(JAVA_VALUE)).unwrap();
        }
    } // closing stdin ends the console producer after it flushed
    let output = java.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "ConsoleProducer failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let mut java_partition: BTreeMap<Vec<u8>, i32> = BTreeMap::new();
    for m in env.read(&topic, count + keys.len(), Duration::from_secs(120)) {
        if m.payload() == Some(JAVA_VALUE) {
            java_partition.insert(m.key().expect("keyed record").to_vec(), m.partition());
        }
    }
    assert_eq!(java_partition.len(), keys.len(), "one Java record per key");
    let differ: Vec<String> = orderpipe_partition
        .iter()
        .filter(|(key, p)| java_partition.get(*key) != Some(*p))
        .map(|(key, p)| {
            format!(
                "{}: orderpipe {p}, java {:?}",
                String::from_utf8_lossy(key),
                java_partition.get(key)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "{} of {} keys in another partition than Java's, e.g. {:?}",
        differ.len(),
        keys.len(),
        &differ[..differ.len().min(5)]
    );
}
