//! Running one member of a consumer group ([`run`]): the checks before it
//! joins, the state its dispatcher and workers share, the background tasks,
//! and the final offset commit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::assignment::{Assignment, AssignmentContext};
use super::background::{release_parked, report_lag};
use super::coordinator_watch::{self, CoordinatorWatch};
use super::error::ConsumerError;
use super::options::{ConsumeOptions, required_topics};
use super::settings::{ConsumerSections, consumer_config};
use super::shared::Shared;
use super::summary::ConsumeSummary;
use super::{dispatch, events, group_pause, pause};
use crate::codec::Codec;
use crate::db::Db;
use crate::health::HealthState;
use crate::metrics::InternalEvent;
use crate::retry::{Forwarder, TierTopics};
use crate::schema::SchemaCatalog;

/// Runs a consumer until `shutdown` resolves or, with `until_idle`, until
/// the topic has been idle that long. Returns what was done.
pub async fn run(
    settings: ConsumerSections<'_>,
    db: Db,
    options: ConsumeOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<ConsumeSummary, ConsumerError> {
    check_group_length(&options.group)?;
    crate::metrics::install();
    events::conflicting_duplicates_start(&options.group);
    let health = HealthState::consumer(
        settings.consumer.lag_threshold,
        Duration::from_secs(settings.consumer.max_poll_gap_secs.max(1)),
    );
    if let Some(addr) = options.health_addr {
        let bound = crate::health::serve(addr, health.clone()).await?;
        tracing::info!(%bound, "health endpoints listening");
        eprintln!("health endpoints on http://{bound}/health/ready");
    }
    let assignment = Arc::new(Assignment::new(health.clone()));
    let coordinator = Arc::new(CoordinatorWatch::default());
    let config = consumer_config(settings, &options.group, options.start_from)?;
    let context = AssignmentContext::new(
        assignment.clone(),
        &options.group,
        coordinator.clone(),
        &config,
    );
    let consumer: StreamConsumer<AssignmentContext> = config.create_with_context(context)?;
    // Read-only rights: check the topics with metadata, never create or alter them.
    crate::topics::require(
        consumer.client(),
        &settings.kafka.bootstrap_servers,
        &required_topics(settings.topics, &options),
        &crate::topics::ensure_command(Some(&options.group)),
    )?;
    let forwarder = forwarder(settings, &options)?;
    let mut subscribed: Vec<&str> = options.read_topics().collect();
    if options.error_tier {
        subscribed.push(&forwarder.topics.retry);
    }
    consumer.subscribe(&subscribed)?;

    let catalog = SchemaCatalog::embedded();
    let codec = Codec::new(
        settings.registry,
        &options.topic,
        catalog.order_events(),
        false,
    )?;
    let applied_metrics = super::events::AppliedMetrics::new(&options.group);
    let shared = Arc::new(Shared {
        consumer,
        codec,
        forwarder,
        db,
        summary: Mutex::new(ConsumeSummary {
            group: options.group.clone(),
            ..Default::default()
        }),
        options,
        assignment,
        health,
        in_flight: Mutex::new(HashMap::new()),
        active: Mutex::new(None),
        parked: Mutex::new(crate::ordering::ParkedSet::default()),
        pauses: Mutex::new(pause::Pauses::default()),
        operator_paused: Default::default(),
        release_locks: Default::default(),
        applied_metrics,
        batch_size: settings.consumer.batch_size.max(1),
        overflow_batches: settings.consumer.overflow_batches,
        batch_linger: std::time::Duration::from_millis(settings.consumer.batch_linger_ms),
    });
    // Report the database state from the start, not only after the first
    // record, and keep reporting it while idle (nothing else would notice
    // the database going away then).
    match shared.db.ping().await {
        Ok(()) => shared.health.db_up().await,
        Err(e) => shared.health.db_down(&e.to_string()).await,
    }
    let db_task = tokio::spawn(crate::health::ping_db_forever(
        shared.db.clone(),
        shared.health.clone(),
    ));

    // Before the first record: a member that starts while its group is paused holds it.
    shared.follow_group_pause_once().await;
    let pause_task = tokio::spawn(group_pause::follow(shared.clone()));
    let lag_task = tokio::spawn(report_lag(shared.clone()));
    let release_task = tokio::spawn(release_parked(shared.clone()));
    let watch_task = tokio::spawn(coordinator_watch::watch(
        shared.clone(),
        coordinator.clone(),
    ));
    // A stuck group handler stops the member like a shutdown does.
    let stop = async {
        tokio::select! {
            _ = shutdown => {}
            reason = coordinator.stuck() => {
                events::CoordinatorStuck { group: &shared.options.group, reason: &reason }.emit();
            }
        }
        crate::stopping::phase(
            "the partition workers finish their batches (database transactions, forwards to the retry topic or DLQ)",
        );
    };
    dispatch::dispatch(&shared, stop).await;
    lag_task.abort();
    pause_task.abort();
    release_task.abort();
    db_task.abort();
    watch_task.abort();
    if let Some(reason) = coordinator.reason() {
        // No commit: it needs the coordinator the handler cannot find. What
        // the workers stored since the last commit is redelivered to the
        // next member and skipped as duplicates.
        return Err(ConsumerError::CoordinatorStuck(reason));
    }
    // Workers have finished; commit what they stored before leaving.
    crate::stopping::phase("committing the group's offsets");
    match shared.consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => {}
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(error = %e, "final offset commit failed; records since the last commit will be redelivered and skipped as duplicates")
        }
    }
    crate::stopping::phase("closing the Kafka consumer and the error tier's producer");
    let mut summary = shared.summary.lock().expect("summary lock").clone();
    summary.active_secs = shared
        .active
        .lock()
        .expect("active lock")
        .map_or(0.0, |(first, last)| {
            last.duration_since(first).as_secs_f64()
        });
    Ok(summary)
}

/// The group's error tier: an idempotent producer to forward failures to
/// its retry topic and the DLQ topic (both checked by [`required_topics`]).
fn forwarder(
    settings: ConsumerSections<'_>,
    options: &ConsumeOptions,
) -> Result<Forwarder, ConsumerError> {
    let policy = settings
        .retry
        .policy_for(&options.group)
        .map_err(|e| ConsumerError::Config(e.to_string()))?;
    let producer_options = crate::kafka::client::producer_options(
        &settings.kafka.client_options(),
        &settings.producer.options,
    )
    .map_err(|e| ConsumerError::Config(e.to_string()))?;
    let producer = crate::kafka::client::measured_producer(&producer_options)?;
    Ok(Forwarder::new(
        producer,
        TierTopics::of(
            &options.topic,
            &options.group,
            &settings.topics.dead_letter.name,
        ),
        &options.group,
        policy,
    ))
}

/// Refuses a group name longer than the `consumer_group` columns: writing it
/// with `INSERT IGNORE` would cut it to fit, into another group's dedup rows.
fn check_group_length(group: &str) -> Result<(), ConsumerError> {
    let chars = group.chars().count();
    if crate::db::fits_column(group, crate::db::CONSUMER_GROUP_CHARS) {
        return Ok(());
    }
    Err(ConsumerError::Config(format!(
        "consumer group `{}...` is {chars} characters long; the limit is {} (the name column of dedup_groups and the consumer_group column of \
         dead_letters, parked_keys and held_records): choose a shorter group name",
        group.chars().take(40).collect::<String>(),
        crate::db::CONSUMER_GROUP_CHARS
    )))
}
