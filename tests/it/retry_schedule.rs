//! The built-in retry schedules, observed on the real retry topic, and the
//! group naming warning.
//!
//! Each schedule is set through a different layer (`[retry]`'s profile, a
//! group's `[retry.groups."<group>"]`, a subscription's `retry` table) and
//! scaled down by the harness-only `retry.time_scale`, so minutes take
//! seconds. What is checked is what the broker holds: each hop's record
//! timestamp (the forwarder's produce time) and its due-time header. The
//! gap between a record's successive appends (the last one: to the DLQ)
//! is the delay the consumer really waited; each must be within ±10 % of
//! the (scaled) schedule, and never early. Jitter: 40 first delays drawn
//! by the forwarder, read back from their due headers, stay within their
//! bounds and spread over them.

use std::time::Duration;

use orderpipe::kafka::record::header;
use orderpipe::retry::retry_topic;
use rdkafka::Message;
use rdkafka::message::OwnedMessage;

use crate::consumer::{produce_lifecycles, sigterm};
use crate::helpers::{TestEnv, header as header_of};

/// Every delay of these tests is this fraction of the schedule's: the first
/// delay stays at 500 ms or more, so the fixed cost of a hop (the failing
/// attempt, an HTTP call, the forward's acknowledgement: 5-20 ms measured)
/// stays well inside 10 % of it. That holds on a quiet machine, not on one
/// running the parallel tests (3-5 times slower): the three schedule tests
/// are serial.
const TIME_SCALE: f64 = 0.05;

/// The 5s-30s-5m schedule's first delay is 5 s: twice the scale.
const FIVE_S_TIME_SCALE: f64 = 0.1;

/// One delayed attempt as the topics show it.
#[derive(Debug)]
struct Hop {
    /// The schedule's delay, scaled (ms).
    want_ms: f64,
    /// Due header minus the record's timestamp: the delay the forwarder chose.
    scheduled_ms: i64,
    /// The next append (retry or DLQ) minus this one: the delay really waited.
    observed_ms: i64,
}

fn timestamp(message: &OwnedMessage) -> i64 {
    message
        .timestamp()
        .to_millis()
        .expect("records carry a timestamp")
}

/// Reads the one failing record's hops off `group`'s retry topic and the
/// DLQ, and checks them against `schedule_secs` (the schedule's, unscaled).
fn observe(env: &TestEnv, group: &str, schedule_secs: &[u64], scale: f64) -> Vec<Hop> {
    let topics = &env.settings.topics;
    let wait: f64 = schedule_secs.iter().sum::<u64>() as f64 * scale;
    let timeout = Duration::from_secs_f64(wait + 30.0);
    let retries = env.read(
        &retry_topic(&topics.order_events.name, group),
        schedule_secs.len(),
        timeout,
    );
    let dlq = env.read(&topics.dead_letter.name, 1, timeout);
    assert_eq!(
        header_of(&dlq[0], header::ATTEMPT).as_deref(),
        Some(schedule_secs.len().to_string().as_str()),
        "{group}"
    );
    let mut hops = Vec::new();
    for (i, record) in retries.iter().enumerate() {
        assert_eq!(
            header_of(record, header::ATTEMPT),
            Some((i + 1).to_string()),
            "{group}: hop {i} in attempt order"
        );
        let due: i64 = header_of(record, header::DUE)
            .expect("a due header")
            .parse()
            .unwrap();
        let next = retries.get(i + 1).unwrap_or(&dlq[0]);
        hops.push(Hop {
            want_ms: schedule_secs[i] as f64 * 1000.0 * scale,
            scheduled_ms: due - timestamp(record),
            observed_ms: timestamp(next) - timestamp(record),
        });
    }
    println!("{group}: schedule {schedule_secs:?} s x {scale}");
    for (i, hop) in hops.iter().enumerate() {
        println!(
            "  delay {}: want {:.0} ms, due header {} ms, observed gap {} ms ({:+.1} %)",
            i + 1,
            hop.want_ms,
            hop.scheduled_ms,
            hop.observed_ms,
            (hop.observed_ms as f64 / hop.want_ms - 1.0) * 100.0
        );
    }
    for (i, hop) in hops.iter().enumerate() {
        let within = |ms: i64| (ms as f64 - hop.want_ms).abs() <= hop.want_ms * 0.10;
        assert!(
            within(hop.scheduled_ms),
            "{group} delay {}: due header says {hop:?}",
            i + 1
        );
        assert!(
            within(hop.observed_ms),
            "{group} delay {}: the record waited outside ±10 %: {hop:?} ({hops:?})",
            i + 1
        );
        assert!(
            hop.observed_ms as f64 >= hop.want_ms * 0.99,
            "{group} delay {}: retried early: {hop:?}",
            i + 1
        );
    }
    hops
}

/// A test env whose order-1 events fail retryably forever (chaos handler),
/// with no local retries and every delay times `scale`.
async fn failing_env(scale: f64) -> TestEnv {
    let mut env = TestEnv::new().with_database().await;
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_ORDERS", "[1]");
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "1000");
    env.set_env("ORDERPIPE_RETRY__LOCAL_RETRIES", "0");
    env.set_env("ORDERPIPE_RETRY__TIME_SCALE", &scale.to_string());
    env
}

/// Points the CLI of `env` at a config file holding `text`; keep the file
/// while the test runs.
fn use_config(env: &mut TestEnv, text: &str) -> tempfile::NamedTempFile {
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut config, text.as_bytes()).unwrap();
    env.set_env("ORDERPIPE_CONFIG", config.path().to_str().unwrap());
    config
}

/// Produces one event of order 1, runs `args` (a group member as `group`)
/// until the failing record reached the DLQ, then checks its hops.
fn run_and_observe(env: &TestEnv, args: &[&str], group: &str, schedule_secs: &[u64], scale: f64) {
    env.cli(&["topics", "ensure", "--group", group]).success();
    produce_lifecycles(env, 1, 1, 5);
    let mut consumer = env.spawn(args);
    let hops = observe(env, group, schedule_secs, scale);
    sigterm(&mut consumer);
    let stderr = std::io::read_to_string(consumer.stderr.take().unwrap()).unwrap();
    assert!(
        !stderr.contains("house pattern"),
        "{group} follows the house pattern: {stderr}"
    );
    assert_eq!(hops.len(), schedule_secs.len());
}

/// `consume --group GROUP` with the failing handler first.
fn consume(group: &str) -> [&str; 5] {
    [
        "consume",
        "--group",
        group,
        "--handler",
        "chaos,notification",
    ]
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: a measurement within ±50 ms; run by `make test` in the serial phase"]
async fn profile_10s_1m_5m_of_retry_is_observed_on_the_retry_topic() {
    let mut env = failing_env(TIME_SCALE).await;
    env.set_env("ORDERPIPE_RETRY__PROFILE", "10s-1m-5m");
    let group = "sched-10s-1m-5m.order.consumer";
    run_and_observe(&env, &consume(group), group, &[10, 60, 300], TIME_SCALE);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: a measurement within ±50 ms; run by `make test` in the serial phase"]
async fn profile_10s_30s_1m_5m_of_a_group_layer_is_observed_on_the_retry_topic() {
    let mut env = failing_env(TIME_SCALE).await;
    let group = "sched-10s-30s-1m-5m.order.consumer";
    // [retry] says 5s-30s-5m (by its older name, seed003); the group's own
    // layer says 10s-30s-1m-5m and wins.
    let _config = use_config(
        &mut env,
        &format!(
            "[retry]\nprofile = \"seed003\"\n[retry.groups.\"{group}\"]\nprofile = \"10s-30s-1m-5m\"\n"
        ),
    );
    run_and_observe(&env, &consume(group), group, &[10, 30, 60, 300], TIME_SCALE);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: a measurement within ±50 ms; run by `make test` in the serial phase"]
async fn delays_5s_30s_5m_of_a_subscription_are_observed_on_the_retry_topic() {
    let mut env = failing_env(FIVE_S_TIME_SCALE).await;
    let (base, seen) = crate::delivery::downstream().await;
    let group = "crm.order.consumer";
    let _config = use_config(
        &mut env,
        &format!(
            "[[http.subscriptions]]\nname = \"crm\"\nevents = [\"order.created\"]\n\
             url = \"{base}/hook/broken\"\nretry = {{delays = [\"5s\", \"30s\", \"5m\"]}}\n"
        ),
    );
    let deliver = ["deliver", "--subscription", "crm", "--group", group];
    run_and_observe(&env, &deliver, group, &[5, 30, 300], FIVE_S_TIME_SCALE);
    // Main topic + 3 delayed attempts, one request each (no local retries).
    assert_eq!(seen.lock().unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn consume_and_deliver_warn_at_start_on_a_group_outside_the_house_pattern() {
    let mut env = TestEnv::new().with_database().await;
    let _config = use_config(
        &mut env,
        "[[http.subscriptions]]\nname = \"crm\"\nevents = [\"order.created\"]\nurl = \"http://127.0.0.1:9/\"\n",
    );
    // (command, the group it runs as, whether it must warn)
    let runs = [
        (
            vec![
                "consume",
                "--group",
                "naming_probe",
                "--handler",
                "notification",
            ],
            "naming_probe",
            true,
        ),
        (vec!["deliver", "--subscription", "crm"], "http.crm", true),
        (
            vec![
                "consume",
                "--group",
                "naming-probe.order.consumer",
                "--handler",
                "notification",
            ],
            "naming-probe.order.consumer",
            false,
        ),
    ];
    for (args, group, must_warn) in runs {
        env.cli(&["topics", "ensure", "--group", group]).success();
        let run = env.cli(&[args.clone(), vec!["--until-idle", "1"]].concat());
        run.success();
        let stderr = String::from_utf8_lossy(&run.output.stderr);
        let warned = stderr
            .contains("does not follow the house pattern {service}.{event}.consumer")
            && stderr.contains(&format!("`{group}`"));
        assert_eq!(warned, must_warn, "{args:?} (group {group}): {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn jitter_spreads_each_delay_within_its_bounds_on_the_retry_topic() {
    let mut env = TestEnv::new().with_database().await;
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_RATE", "1.0");
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "1000");
    env.set_env("ORDERPIPE_CONSUMER__ORDERING", "none");
    let group = "sched-jitter.order.consumer";
    let _config = use_config(
        &mut env,
        &format!(
            "[retry]\nlocal_retries = 0\n[retry.groups.\"{group}\"]\ndelays = [\"2s\"]\njitter = 0.5\n"
        ),
    );
    env.cli(&["topics", "ensure", "--group", group]).success();
    let count = 40;
    produce_lifecycles(&env, count, count, 9);
    let mut consumer = env.spawn(&consume(group));
    let topic = retry_topic(&env.settings.topics.order_events.name, group);
    let retries = env.read(&topic, count, Duration::from_secs(30));
    sigterm(&mut consumer);
    let delays: Vec<i64> = retries
        .iter()
        .map(|r| header_of(r, header::DUE).unwrap().parse::<i64>().unwrap() - timestamp(r))
        .collect();
    let (low, high) = (*delays.iter().min().unwrap(), *delays.iter().max().unwrap());
    println!("{count} first delays of 2 s with jitter 0.5: {low} to {high} ms");
    // Each in [1 s, 3 s] (1 ms of rounding), and spread over it, not one value.
    assert!(low >= 999 && high <= 3001, "{delays:?}");
    assert!(
        high - low >= 1000,
        "40 draws over a 2 s range span at least 1 s: {delays:?}"
    );
}
