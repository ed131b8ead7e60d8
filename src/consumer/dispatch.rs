//! The dispatcher: one poll loop routing records to one worker per
//! assigned partition, which never waits on a worker.
//!
//! Each worker reads from a bounded queue of one batch. When a partition's
//! queue is full (its worker waits for a retry record's due time, for the
//! database, or is just slower than the fetch), the record that did not fit
//! and every later one of that partition go to the partition's *overflow*,
//! in offset order. As soon as the worker makes room, the overflow moves
//! into its queue. Once the overflow holds `consumer.overflow_batches`
//! batches, the partition is paused on the consumer, so librdkafka fetches
//! nothing more for it, and it is resumed when the overflow is empty;
//! librdkafka fetches again from the record after the last one delivered.
//! Pausing late is deliberate: librdkafka drops what it had prefetched for
//! a partition it pauses, so a pause at the first record that did not fit
//! made it fetch again for every batch and the worker wait for that fetch
//! (docs/tuning.md, "Pausing late").
//! Meanwhile the loop keeps polling: every other partition flows, the
//! health poll stays fresh, and the member never exceeds
//! `max.poll.interval.ms`.
//!
//! A worker pauses its partition too, while it waits for a retry-topic
//! record's due time. Both go through [`Pauses`](super::pause::Pauses): a
//! partition is paused while any reason holds, for the generation of the
//! assignment that set it, and resumed only when none is left.
//!
//! An operator's pause of the group ([`group_pause`](super::group_pause))
//! *holds* every route: records go to the overflow, none to the worker,
//! and the partition is paused on the consumer. Resuming refills the
//! queues from the overflow first, so the held records keep their order.
//!
//! A revoked partition's overflow is dropped (its next owner re-reads those
//! records: their offsets were never stored).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kafka::consumed::ConsumedRecord;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::Message;
use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::sync::mpsc::{self, OwnedPermit};

use super::Shared;
use super::assignment::PartitionKey;
use super::events::{self, PartitionPaused};
use super::pause::PauseReason;
use super::worker::PartitionWorker;
use crate::metrics::InternalEvent;

/// Records a worker's queue holds: one batch, so the worker finds its next
/// batch waiting while it applies one; a second one only held memory
/// (~12k decoded records across 12 partitions; docs/tuning.md, Memory).
fn queue_capacity(batch_size: usize) -> usize {
    batch_size
}

/// Records in a partition's overflow that pause it: `overflow_batches`
/// batches, at least one record.
fn pause_at(batch_size: usize, overflow_batches: usize) -> usize {
    (batch_size * overflow_batches).max(1)
}

/// One partition's way to its worker: the worker's queue and the records
/// that did not fit, oldest first.
struct Route {
    generation: u64,
    tx: mpsc::Sender<ConsumedRecord>,
    overflow: VecDeque<ConsumedRecord>,
    /// Overflow records that pause the partition, at least one ([`pause_at`]).
    pause_at: usize,
    /// Paused for a full queue, until the overflow is empty.
    paused: bool,
    /// Held by an operator's pause: nothing goes to the worker.
    held: bool,
    /// `orderpipe_consumed_total` of the partition's topic, looked up once.
    consumed: metrics::Counter,
}

/// Where [`Route::offer`] put a record.
#[derive(Debug, PartialEq, Eq)]
enum Offered {
    /// Into the worker's queue.
    Queued,
    /// Into the overflow; `first`: the overflow was empty (wait for room);
    /// `pause`: the overflow just reached the pause threshold.
    Overflow { first: bool, pause: bool },
    /// Nowhere: the worker stopped (its partition was revoked).
    WorkerGone,
}

impl Route {
    fn new(
        generation: u64,
        tx: mpsc::Sender<ConsumedRecord>,
        pause_at: usize,
        consumed: metrics::Counter,
    ) -> Self {
        Self {
            generation,
            tx,
            overflow: VecDeque::new(),
            pause_at,
            paused: false,
            held: false,
            consumed,
        }
    }

    /// Whether the overflow just reached the pause threshold: pause now.
    fn pause_now(&mut self) -> bool {
        let pause = !self.paused && self.overflow.len() >= self.pause_at;
        self.paused |= pause;
        pause
    }

    /// Whether the partition was paused and its overflow is now empty:
    /// resume it now.
    fn resume_now(&mut self) -> bool {
        self.overflow.is_empty() && std::mem::take(&mut self.paused)
    }

    /// Queues `message` behind every record of the partition already
    /// offered, without waiting.
    fn offer(&mut self, message: ConsumedRecord) -> Offered {
        if self.held || !self.overflow.is_empty() {
            self.overflow.push_back(message);
            return Offered::Overflow {
                first: false,
                pause: self.pause_now(),
            };
        }
        match self.tx.try_send(message) {
            Ok(()) => Offered::Queued,
            Err(TrySendError::Full(message)) => {
                self.overflow.push_back(message);
                Offered::Overflow {
                    first: true,
                    pause: self.pause_now(),
                }
            }
            Err(TrySendError::Closed(_)) => Offered::WorkerGone,
        }
    }

    /// Moves the overflow into the queue: the oldest record through
    /// `permit` (room the worker made), then as many as fit. True when the
    /// overflow is empty.
    fn refill(&mut self, permit: OwnedPermit<ConsumedRecord>) -> bool {
        let Some(oldest) = self.overflow.pop_front() else {
            return true;
        };
        permit.send(oldest);
        while let Some(message) = self.overflow.pop_front() {
            if let Err(TrySendError::Full(message) | TrySendError::Closed(message)) =
                self.tx.try_send(message)
            {
                self.overflow.push_front(message);
                return false;
            }
        }
        true
    }

    /// Drops the overflow (the partition was revoked, or the consumer stops);
    /// the number of records dropped.
    fn drop_overflow(&mut self) -> usize {
        let n = self.overflow.len();
        self.overflow.clear();
        n
    }
}

/// Room in a partition's queue, or its worker gone: (partition, generation, permit).
type Room = Pin<
    Box<
        dyn Future<
                Output = (
                    PartitionKey,
                    u64,
                    Result<OwnedPermit<ConsumedRecord>, SendError<()>>,
                ),
            > + Send,
    >,
>;

/// Waits for room in `route`'s queue.
fn room(key: PartitionKey, route: &Route) -> Room {
    let tx = route.tx.clone();
    let generation = route.generation;
    Box::pin(async move { (key, generation, tx.reserve_owned().await) })
}

/// Holds `route` (an operator's pause: paused on the consumer, records kept
/// in the overflow) or releases it (resumed, the overflow first).
fn hold(
    shared: &Shared,
    key: &PartitionKey,
    route: &mut Route,
    held: bool,
    rooms: &mut FuturesUnordered<Room>,
) {
    route.held = held;
    if held {
        shared.pause_partition(key, route.generation, PauseReason::Operator);
        return;
    }
    shared.resume_partition(key, route.generation, PauseReason::Operator);
    if !route.overflow.is_empty() {
        rooms.push(room(key.clone(), route));
    }
}

/// Holds or releases every route when the operator's pause, as last read,
/// differs from `holding`.
fn follow_operator_pause(
    shared: &Shared,
    holding: &mut bool,
    routes: &mut HashMap<PartitionKey, Route>,
    rooms: &mut FuturesUnordered<Room>,
) {
    if shared.operator_paused() == *holding {
        return;
    }
    *holding = !*holding;
    for (key, route) in routes.iter_mut() {
        hold(shared, key, route, *holding, rooms);
    }
}

/// The partition whose records are arriving. librdkafka hands records over
/// in runs of one partition, so a run's records share one topic name and
/// its key is copied once, not once per record.
#[derive(Default)]
struct PartitionRun {
    topic: Option<Arc<str>>,
    key: PartitionKey,
}

impl PartitionRun {
    /// `message` copied out of librdkafka; a record of another partition
    /// starts a new run.
    fn record(&mut self, message: &impl Message) -> ConsumedRecord {
        let record = ConsumedRecord::of(message, self.topic.as_ref());
        if self.key.1 != record.partition() || self.key.0 != record.topic() {
            self.key = (record.topic().to_string(), record.partition());
            self.topic = Some(Arc::clone(record.topic_name()));
        }
        record
    }
}

/// Routes records to partition workers until shutdown or idle.
pub(super) async fn dispatch(shared: &Arc<Shared>, shutdown: impl Future<Output = ()>) {
    let mut routes: HashMap<PartitionKey, Route> = HashMap::new();
    let mut rooms: FuturesUnordered<Room> = FuturesUnordered::new();
    let mut handles = Vec::new();
    let mut last_record = Instant::now();
    let mut run = PartitionRun::default();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    // Whether the routes are held by an operator's pause.
    let mut holding = false;
    // Drops a route's overflow: those records are no longer in flight here.
    let retire = |key: &PartitionKey, route: &mut Route| {
        let dropped = route.drop_overflow();
        if dropped > 0 {
            shared.in_flight_change(key, -(dropped as isize));
        }
        if route.resume_now() {
            shared.resume_partition(key, route.generation, PauseReason::QueueFull);
        }
    };
    tokio::pin!(shutdown);
    loop {
        shared.health.polled();
        tokio::select! {
            _ = &mut shutdown => break,
            Some((key, generation, reserved)) = rooms.next(), if !rooms.is_empty() => {
                let Some(route) = routes.get_mut(&key).filter(|r| r.generation == generation) else {
                    // A route replaced since (the partition was assigned again).
                    continue;
                };
                match reserved {
                    // Held: the resume asks for room again.
                    Ok(_) if route.held => {}
                    Ok(permit) => {
                        if !route.refill(permit) {
                            rooms.push(room(key.clone(), route));
                        } else if route.resume_now() {
                            shared.resume_partition(&key, generation, PauseReason::QueueFull);
                        }
                    }
                    // The worker stopped: its partition was revoked.
                    Err(_) => retire(&key, route),
                }
            }
            _ = tick.tick() => {
                // Revoked partitions: their overflow goes, their next owner re-reads it.
                routes.retain(|key, route| {
                    let current = shared.assignment.is_current(key, route.generation);
                    if !current {
                        retire(key, route);
                    }
                    current
                });
                shared.forget_stale_pauses();
                follow_operator_pause(shared, &mut holding, &mut routes, &mut rooms);
                if let Some(idle) = shared.options.until_idle {
                    // Idle: nothing pending, and no record nor rebalance for `idle`
                    // (a member that just joined has not been idle yet).
                    let quiet = shared
                        .assignment
                        .since_change()
                        .map(|since| since.min(last_record.elapsed()));
                    if shared.in_flight_total() == 0 && quiet.is_some_and(|q| q >= idle) {
                        break;
                    }
                }
            }
            received = shared.consumer.recv() => {
                let message = match received {
                    Ok(m) => run.record(&m),
                    Err(e) => {
                        tracing::warn!(error = %e, "consumer error; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                };
                last_record = Instant::now();
                // At once, not at the next tick: a record that arrives after
                // the pause was read is held, whatever the tick's phase.
                follow_operator_pause(shared, &mut holding, &mut routes, &mut rooms);
                shared.active.lock().expect("active lock").get_or_insert((last_record, last_record));
                let key = &run.key;
                let Some(generation) = shared.assignment.generation(key) else {
                    // Delivered after its partition was revoked: the new owner reads it.
                    continue;
                };
                if routes.get(key).is_none_or(|r| r.generation != generation) {
                    if let Some(mut old) = routes.remove(key) {
                        retire(key, &mut old);
                    }
                    let (tx, rx) = mpsc::channel(queue_capacity(shared.batch_size));
                    let worker = PartitionWorker::new(shared.clone(), key.clone(), generation);
                    handles.push(tokio::spawn(worker.run(rx)));
                    let consumed = events::consumed(&shared.options.group, &key.0);
                    let mut route = Route::new(generation, tx, pause_at(shared.batch_size, shared.overflow_batches), consumed);
                    if holding {
                        hold(shared, key, &mut route, true, &mut rooms);
                    }
                    routes.insert(key.clone(), route);
                }
                shared.summary.lock().expect("summary lock").consumed += 1;
                shared.in_flight_change(key, 1);
                let route = routes.get_mut(key).expect("route just ensured");
                route.consumed.increment(1);
                match route.offer(message) {
                    Offered::Queued => {}
                    Offered::Overflow { first, pause } => {
                        if pause {
                            shared.summary.lock().expect("summary lock").queue_full_pauses += 1;
                            PartitionPaused { group: &shared.options.group, topic: &key.0, partition: key.1 }.emit();
                            shared.pause_partition(key, generation, PauseReason::QueueFull);
                        }
                        if first {
                            rooms.push(room(key.clone(), route));
                        }
                    }
                    // The worker stopped because the partition was revoked.
                    Offered::WorkerGone => shared.in_flight_change(key, -1),
                }
            }
        }
    }
    for (key, route) in routes.iter_mut() {
        retire(key, route);
    }
    // Every sender goes (the routes' and the waits' for room), so each
    // worker finishes what its queue holds and stops.
    drop(rooms);
    drop(routes);
    for handle in handles {
        let _ = handle.await;
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    use super::*;

    fn record(offset: i64) -> ConsumedRecord {
        ConsumedRecord::of(
            &OwnedMessage::new(
                Some(b"v".to_vec()),
                Some(b"k".to_vec()),
                "orders".into(),
                Timestamp::CreateTime(1),
                3,
                offset,
                None,
            ),
            None,
        )
    }

    /// An overflow record that neither starts the overflow nor pauses.
    const QUIET: Offered = Offered::Overflow {
        first: false,
        pause: false,
    };

    #[tokio::test]
    async fn a_partition_is_paused_once_when_its_overflow_reaches_the_threshold_and_resumed_when_it_is_empty()
     {
        // A queue of two records; paused at three in the overflow.
        let (tx, mut rx) = mpsc::channel(2);
        let mut route = Route::new(1, tx, 3, metrics::Counter::noop());
        let offered: Vec<Offered> = (0..7).map(|o| route.offer(record(o))).collect();
        let overflow = |first, pause| Offered::Overflow { first, pause };
        assert_eq!(
            offered,
            vec![
                Offered::Queued,
                Offered::Queued,
                overflow(true, false),
                QUIET,
                overflow(false, true),
                QUIET,
                QUIET,
            ],
            "waits for room at the first overflow, pauses at the third, once"
        );
        assert!(!route.resume_now(), "not while the overflow holds records");
        let mut received = Vec::new();
        while !route.overflow.is_empty() {
            received.push(rx.recv().await.expect("queued").offset());
            let permit = route.tx.clone().reserve_owned().await.expect("alive");
            route.refill(permit);
        }
        assert!(route.resume_now(), "the overflow is empty: resume");
        assert!(!route.resume_now(), "once");
        while let Ok(m) = rx.try_recv() {
            received.push(m.offset());
        }
        assert_eq!(received, (0..7).collect::<Vec<_>>(), "in order, once each");
    }

    #[tokio::test]
    async fn a_full_queue_overflows_in_order_and_refills_as_the_worker_makes_room() {
        // A queue of two records.
        let (tx, mut rx) = mpsc::channel(2);
        let mut route = Route::new(1, tx, 1, metrics::Counter::noop());
        assert_eq!(route.offer(record(0)), Offered::Queued);
        assert_eq!(route.offer(record(1)), Offered::Queued);
        assert_eq!(
            route.offer(record(2)),
            Offered::Overflow {
                first: true,
                pause: true
            }
        );
        assert_eq!(route.offer(record(3)), QUIET);
        // Room appears, but record 4 must not overtake the overflow.
        assert_eq!(rx.recv().await.map(|m| m.offset()), Some(0));
        assert_eq!(route.offer(record(4)), QUIET);
        let mut received = vec![0];
        while !route.overflow.is_empty() {
            let permit = route
                .tx
                .clone()
                .reserve_owned()
                .await
                .expect("worker alive");
            let drained = route.refill(permit);
            assert_eq!(drained, route.overflow.is_empty());
            received.push(rx.recv().await.expect("queued").offset());
        }
        while let Ok(m) = rx.try_recv() {
            received.push(m.offset());
        }
        assert_eq!(
            received,
            vec![0, 1, 2, 3, 4],
            "every record once, in offset order"
        );
        assert_eq!(
            route.offer(record(5)),
            Offered::Queued,
            "an empty overflow sends straight to the queue"
        );
    }

    #[tokio::test]
    async fn a_held_route_gives_its_worker_nothing_and_on_release_hands_on_in_order() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut route = Route::new(1, tx, 100, metrics::Counter::noop());
        assert_eq!(route.offer(record(0)), Offered::Queued);
        route.held = true;
        for offset in 1..5 {
            assert_eq!(
                route.offer(record(offset)),
                QUIET,
                "held: into the overflow"
            );
        }
        assert_eq!(rx.recv().await.map(|m| m.offset()), Some(0));
        assert!(
            rx.try_recv().is_err(),
            "nothing reaches the worker while held"
        );
        route.held = false;
        let mut received = Vec::new();
        while !route.overflow.is_empty() {
            let permit = route.tx.clone().reserve_owned().await.expect("alive");
            route.refill(permit);
            while let Ok(m) = rx.try_recv() {
                received.push(m.offset());
            }
        }
        assert_eq!(route.offer(record(5)), Offered::Queued);
        while let Ok(m) = rx.try_recv() {
            received.push(m.offset());
        }
        assert_eq!(
            received,
            vec![1, 2, 3, 4, 5],
            "the held records first, in order"
        );
    }

    #[tokio::test]
    async fn a_stopped_worker_gets_nothing_and_its_overflow_is_dropped() {
        let (tx, rx) = mpsc::channel(2);
        let mut route = Route::new(1, tx, 1, metrics::Counter::noop());
        for offset in 0..4 {
            route.offer(record(offset));
        }
        drop(rx);
        assert_eq!(route.offer(record(9)), QUIET);
        assert!(route.tx.clone().reserve_owned().await.is_err());
        assert_eq!(route.drop_overflow(), 3);
        assert_eq!(route.offer(record(10)), Offered::WorkerGone);
    }
}
