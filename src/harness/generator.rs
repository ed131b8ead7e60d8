//! Synthetic order lifecycles: envelopes for `orderpipe produce --count`
//! ([`LifecycleGenerator`]), or orders driven through the order service
//! ([`drive`], the demo and `bench-drive-orders`).
//!
//! Orders follow realistic paths, interleaved across a pool of open orders
//! the way a busy shop interleaves them:
//!
//! | share | path |
//! |---|---|
//! | 75% | created → payment.succeeded → shipped |
//! | 10% | created → canceled |
//! | 10% | created → payment.succeeded → refunded |
//! | 5%  | created → payment.succeeded → shipped → refunded |
//!
//! A seed makes a run reproducible.

use chrono::{DateTime, Duration, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::api::orders::{Action, ApiError, NewOrder, OrderService};
use crate::envelope::{
    Envelope, EventData, OrderCanceled, OrderCreated, OrderPaymentSucceeded, OrderRefunded,
    OrderShipped, format_utc,
};

/// The steps an order can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `order.created`
    Created,
    /// `order.payment.succeeded`
    Paid,
    /// `order.shipped`
    Shipped,
    /// `order.canceled`
    Canceled,
    /// `order.refunded`
    Refunded,
}

/// A lifecycle drawn with the shares in the table above.
pub fn choose_path(rng: &mut impl Rng) -> &'static [Step] {
    let roll = rng.random_range(0..100);
    let mut acc = 0;
    PATHS
        .iter()
        .find(|(share, _)| {
            acc += share;
            roll < acc
        })
        .map(|(_, p)| *p)
        .expect("shares add up to 100")
}

const PATHS: &[(u32, &[Step])] = &[
    (75, &[Step::Created, Step::Paid, Step::Shipped]),
    (10, &[Step::Created, Step::Canceled]),
    (10, &[Step::Created, Step::Paid, Step::Refunded]),
    (
        5,
        &[Step::Created, Step::Paid, Step::Shipped, Step::Refunded],
    ),
];

const CARRIERS: &[&str] = &["sf-express", "jd-logistics", "ems", "yto"];

struct OpenOrder {
    id: i64,
    path: &'static [Step],
    next: usize,
    amount: i64,
}

/// An endless, deterministic stream of lifecycle events.
pub struct LifecycleGenerator {
    rng: StdRng,
    producer: String,
    open: Vec<OpenOrder>,
    next_order_id: i64,
    clock: DateTime<Utc>,
}

impl LifecycleGenerator {
    /// `concurrency` orders are open at once; ids start at `first_order_id`.
    pub fn new(producer: &str, concurrency: usize, first_order_id: i64, seed: u64) -> Self {
        let mut generator = Self {
            rng: StdRng::seed_from_u64(seed),
            producer: producer.to_string(),
            open: Vec::with_capacity(concurrency.max(1)),
            next_order_id: first_order_id,
            clock: Utc::now(),
        };
        for _ in 0..concurrency.max(1) {
            let order = generator.open_order();
            generator.open.push(order);
        }
        generator
    }

    fn open_order(&mut self) -> OpenOrder {
        let path = choose_path(&mut self.rng);
        let id = self.next_order_id;
        self.next_order_id += 1;
        OpenOrder {
            id,
            path,
            next: 0,
            amount: self.rng.random_range(100..500_000),
        }
    }

    fn data(&mut self, step: Step, order_id: i64, amount: i64) -> EventData {
        let at = format_utc(&self.clock);
        match step {
            Step::Created => EventData::Created(OrderCreated {
                order_id,
                user_id: self.rng.random_range(1..1_000_000),
                sku: format!("SKU-{}", self.rng.random_range(1..500)),
                quantity: self.rng.random_range(1..5),
                amount,
                currency: "CNY".into(),
                created_at: at,
            }),
            Step::Paid => EventData::PaymentSucceeded(OrderPaymentSucceeded {
                order_id,
                payment_id: format!("pay-{order_id}"),
                amount,
                paid_at: at,
            }),
            Step::Shipped => EventData::Shipped(OrderShipped {
                order_id,
                shipment_id: format!("shp-{order_id}"),
                carrier: CARRIERS[self.rng.random_range(0..CARRIERS.len())].into(),
                shipped_at: at,
            }),
            Step::Canceled => EventData::Canceled(OrderCanceled {
                order_id,
                reason: "customer_request".into(),
                canceled_at: at,
            }),
            Step::Refunded => EventData::Refunded(OrderRefunded {
                order_id,
                refund_id: format!("rfd-{order_id}"),
                amount,
                refunded_at: at,
            }),
        }
    }
}

impl Iterator for LifecycleGenerator {
    type Item = Envelope;

    fn next(&mut self) -> Option<Envelope> {
        let slot = self.rng.random_range(0..self.open.len());
        let (id, step, amount) = {
            let order = &mut self.open[slot];
            let step = order.path[order.next];
            order.next += 1;
            (order.id, step, order.amount)
        };
        if self.open[slot].next == self.open[slot].path.len() {
            self.open[slot] = self.open_order();
        }
        self.clock += Duration::milliseconds(1);
        let data = self.data(step, id, amount);
        let mut envelope = Envelope::new_at(&self.producer, data, self.clock);
        // Reproducible ids for a given seed.
        envelope.event_id = uuid::Builder::from_random_bytes(self.rng.random()).into_uuid();
        envelope.trace_id = uuid::Builder::from_random_bytes(self.rng.random())
            .into_uuid()
            .simple()
            .to_string();
        Some(envelope)
    }
}

/// Drives `orders` lifecycles through the order service in-process (the
/// demo and `bench-drive-orders`), with the shares of the table above;
/// returns how many order events were recorded.
pub async fn drive(service: &OrderService, orders: usize, seed: u64) -> Result<usize, ApiError> {
    drive_at(service, orders, seed, None).await
}

/// Like [`drive_at`] with `drivers` drivers side by side (a sequential
/// driver waits out each request's commit, so one cannot reach a high
/// rate): each drives its share of the orders at its share of the rate,
/// with its own seed (`seed + i`).
pub async fn drive_concurrently(
    service: &OrderService,
    orders: usize,
    seed: u64,
    rate: Option<u32>,
    drivers: usize,
) -> Result<usize, ApiError> {
    let drivers = drivers.clamp(1, orders.max(1));
    let runs = (0..drivers).map(|i| {
        let share = orders / drivers + usize::from(i < orders % drivers);
        // Each driver's rate: its share of the total, at least 1 per second.
        let rate = rate
            .filter(|r| *r > 0)
            .map(|r| ((f64::from(r) * share as f64 / orders.max(1) as f64).round() as u32).max(1));
        drive_at(service, share, seed + i as u64, rate)
    });
    futures::future::try_join_all(runs)
        .await
        .map(|events| events.into_iter().sum())
}

/// Like [`drive`], starting at most `rate` orders per second.
pub async fn drive_at(
    service: &OrderService,
    orders: usize,
    seed: u64,
    rate: Option<u32>,
) -> Result<usize, ApiError> {
    let started = tokio::time::Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut events = 0;
    for i in 0..orders {
        if let Some(rate) = rate.filter(|r| *r > 0) {
            tokio::time::sleep_until(
                started + std::time::Duration::from_secs_f64(i as f64 / f64::from(rate)),
            )
            .await;
        }
        let amount = rng.random_range(100..500_000);
        let order = service
            .create(
                NewOrder {
                    user_id: rng.random_range(1..1_000_000),
                    sku: format!("SKU-{}", rng.random_range(1..500)),
                    quantity: rng.random_range(1..5),
                    amount,
                    currency: None,
                },
                None,
            )
            .await?;
        events += 1;
        let id = order.order_id;
        for step in &choose_path(&mut rng)[1..] {
            let action = match step {
                Step::Paid => Action::Pay {
                    payment_id: format!("pay-{id}"),
                    amount,
                },
                Step::Shipped => Action::Ship {
                    shipment_id: format!("shp-{id}"),
                    carrier: "sf-express".into(),
                },
                Step::Canceled => Action::Cancel {
                    reason: "customer_request".into(),
                },
                Step::Refunded => Action::Refund {
                    refund_id: format!("rfd-{id}"),
                    amount,
                },
                Step::Created => continue,
            };
            service.act(id, action, None).await?;
            events += 1;
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn lifecycles_are_valid_ordered_and_reproducible() {
        let a: Vec<_> = LifecycleGenerator::new("t", 50, 1, 42).take(5000).collect();
        let b: Vec<_> = LifecycleGenerator::new("t", 50, 1, 42).take(5000).collect();
        assert_eq!(
            a.iter().map(|e| e.event_id).collect::<Vec<_>>(),
            b.iter().map(|e| e.event_id).collect::<Vec<_>>()
        );
        let mut seen: HashMap<i64, Vec<String>> = HashMap::new();
        for env in &a {
            env.validate().unwrap();
            seen.entry(env.data.order_id())
                .or_default()
                .push(env.event_name.to_string());
        }
        for (order, names) in seen {
            assert_eq!(names[0], "order.created", "order {order}: {names:?}");
            let paths: Vec<Vec<&str>> = vec![
                vec!["order.created", "order.payment.succeeded", "order.shipped"],
                vec!["order.created", "order.canceled"],
                vec!["order.created", "order.payment.succeeded", "order.refunded"],
                vec![
                    "order.created",
                    "order.payment.succeeded",
                    "order.shipped",
                    "order.refunded",
                ],
            ];
            assert!(
                paths
                    .iter()
                    .any(|p| p.starts_with(&names.iter().map(String::as_str).collect::<Vec<_>>())),
                "order {order}: {names:?}"
            );
        }
    }
}
