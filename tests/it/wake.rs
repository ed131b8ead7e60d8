//! The relay's wake-up on new outbox rows, against Kafka + MariaDB: an idle
//! relay with a long poll interval publishes an order's events right after
//! the API's wake-up datagram, and, when no datagram comes (not configured,
//! or lost), still publishes them at its next poll.

use std::time::{Duration, Instant};

use orderpipe::api::orders::{NewOrder, OrderService};
use orderpipe::outbox::wake::WakeNotifier;

use crate::helpers::TestEnv;

/// The relay's poll interval in this test: long, so a wake-up is plain to
/// see even on a loaded machine, where one publish may take seconds (10 s,
/// not 5: a woken publish had 1.5 s).
const POLL: Duration = Duration::from_secs(10);

/// Reads the relay's stderr until it announces its wake-up address; the
/// rest keeps draining in a thread.
fn wake_addr(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(addr) = line.strip_prefix("relay wake-up listening on udp://") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("wake-up address announced")
}

/// Creates an order and waits until the relay marked every outbox row of
/// it sent (strictly after its Kafka commit); the time from the API's
/// commit to then.
async fn publish_time(env: &TestEnv, service: &OrderService, limit: Duration) -> Duration {
    let new = NewOrder {
        user_id: 7,
        sku: "W-1".into(),
        quantity: 1,
        amount: 100,
        currency: None,
    };
    let order = service.create(new, None).await.expect("order created");
    let committed = Instant::now();
    let pool = env.db().pool;
    loop {
        let (unsent,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM outbox_messages WHERE message_key = ? AND sent_ms IS NULL",
        )
        .bind(order.order_id.to_string())
        .fetch_one(&pool)
        .await
        .unwrap();
        if unsent == 0 {
            return committed.elapsed();
        }
        assert!(
            committed.elapsed() < limit,
            "order {} not published within {limit:?}",
            order.order_id
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_relay_publishes_at_once_when_woken_and_at_its_poll_when_not() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "wake"]).success();
    let poll_ms = POLL.as_millis().to_string();
    let mut relay = env.spawn(&[
        "relay",
        "--instance",
        "wake",
        "--poll-ms",
        &poll_ms,
        "--wake-listen",
        "127.0.0.1:0",
    ]);
    let addr = wake_addr(&mut relay);
    let woken = OrderService::new(env.db(), &env.settings.producer, &env.settings.topics)
        .with_wake(Some(WakeNotifier::new(&[addr]).unwrap()));
    let unwoken = OrderService::new(env.db(), &env.settings.producer, &env.settings.topics);

    // Warm-up: the relay takes its shards' leases and builds their producers.
    publish_time(&env, &woken, Duration::from_secs(60)).await;
    // Idle now: every shard waits out a fresh poll interval.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let fast = publish_time(&env, &woken, POLL * 2).await;
    assert!(
        fast < Duration::from_secs(4),
        "woken relay took {fast:?} (poll interval {POLL:?})"
    );
    // The wake-up made every shard claim just now, so each one's next poll is
    // a whole interval away: an order without a wake-up waits for it (10 s
    // from the wake-up, less the woken publish's 4 s at most).
    let slow = publish_time(&env, &unwoken, POLL * 3).await;
    assert!(
        slow > Duration::from_secs(5),
        "without a wake-up the row waits for the poll, took {slow:?}"
    );

    // Every event reached the topic (3 orders: order.created each).
    env.read(
        &env.settings.topics.order_events.name,
        3,
        Duration::from_secs(30),
    );
}
