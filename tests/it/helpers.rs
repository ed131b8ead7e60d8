//! Shared test plumbing: a fresh namespace per test, the CLI as a
//! subprocess, and a reader that drains a topic.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use orderpipe::config::Settings;
use orderpipe::producer::config::client_config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

/// One test's view of the stack: settings with its own topic names, and
/// the same settings as `ORDERPIPE_*` variables for the CLI.
pub struct TestEnv {
    /// Unique prefix of this test's topics.
    pub prefix: String,
    /// Settings pointing at the dev stack with this test's topics.
    pub settings: Settings,
    env: BTreeMap<String, String>,
}

impl TestEnv {
    /// A fresh namespace on the dev stack.
    pub fn new() -> Self {
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let mut settings = Settings::load(None).expect("settings load");
        let mut env = BTreeMap::new();
        for (key, spec) in [
            ("ORDER_EVENTS", &mut settings.topics.order_events),
            ("INVENTORY_EVENTS", &mut settings.topics.inventory_events),
            ("DEAD_LETTER", &mut settings.topics.dead_letter),
        ] {
            spec.name = format!("{prefix}.{}", spec.name);
            env.insert(format!("ORDERPIPE_TOPICS__{key}__NAME"), spec.name.clone());
        }
        Self {
            prefix,
            settings,
            env,
        }
    }

    /// Sets a config value for the CLI through the environment.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.insert(key.to_string(), value.to_string());
    }

    /// Runs `orderpipe ARGS` with this test's environment.
    pub fn cli(&self, args: &[&str]) -> CliRun {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_orderpipe"))
            .args(args)
            .envs(&self.env)
            .env("RUST_LOG", "warn")
            .output()
            .expect("orderpipe runs");
        CliRun {
            output,
            elapsed: started.elapsed(),
        }
    }

    /// Reads `count` records of `topic` from the beginning (all partitions),
    /// failing the test if they do not arrive within `timeout`.
    pub fn read(&self, topic: &str, count: usize, timeout: Duration) -> Vec<OwnedMessage> {
        let consumer: BaseConsumer = client_config(&self.settings.kafka_client_options())
            .set("group.id", format!("{}-reader", self.prefix))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = metadata.topics()[0].partitions().len() as i32;
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).expect("assign");
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            assert!(
                Instant::now() < deadline,
                "read only {} of {count} records of {topic} within {timeout:?}",
                out.len()
            );
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                out.push(message.expect("consume").detach());
            }
        }
        // Nothing beyond what was expected.
        if let Some(Ok(extra)) = consumer.poll(Duration::from_secs(1)) {
            panic!("unexpected extra record at offset {} of {topic}", extra.offset());
        }
        out
    }
}

/// A finished CLI run.
pub struct CliRun {
    /// Exit status and captured streams.
    pub output: Output,
    /// Wall time.
    pub elapsed: Duration,
}

impl CliRun {
    /// stdout + stderr, for assertions and failure messages.
    pub fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.output.stdout),
            String::from_utf8_lossy(&self.output.stderr)
        )
    }

    /// Asserts success and returns stdout.
    pub fn success(&self) -> String {
        assert!(self.output.status.success(), "orderpipe failed:\n{}", self.text());
        String::from_utf8_lossy(&self.output.stdout).to_string()
    }

    /// Asserts failure and returns stdout + stderr.
    pub fn failure(&self) -> String {
        assert!(!self.output.status.success(), "orderpipe unexpectedly succeeded:\n{}", self.text());
        self.text()
    }
}

/// A header of a record as text.
pub fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).to_string()))
    })
}
