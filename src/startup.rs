//! Start-up: builds the roles from the whole [`Settings`].
//!
//! Components own their settings sections and never see [`Settings`]
//! (`config` composes them; nothing below it imports it). A role that
//! reads one or two sections takes them as arguments; a role that reads
//! many takes a struct of references ([`ConsumerSections`],
//! [`RelaySections`]), which this module picks out of the settings. The
//! CLI, the harness and the tests call these; components do not.

use crate::config::Settings;
use crate::consumer::ConsumerSections;
use crate::outbox::relay::RelaySections;
use crate::topics::TopicSpec;

/// The sections a consumer group member reads ([`crate::consumer::run`]).
pub fn consumer_sections(settings: &Settings) -> ConsumerSections<'_> {
    ConsumerSections {
        kafka: &settings.kafka,
        consumer: &settings.consumer,
        producer: &settings.producer,
        retry: &settings.retry,
        registry: &settings.registry,
        topics: &settings.topics,
    }
}

/// The sections the outbox relay reads ([`crate::outbox::relay::Relay::new`]).
pub fn relay_sections(settings: &Settings) -> RelaySections<'_> {
    RelaySections {
        kafka: &settings.kafka,
        producer: &settings.producer,
        registry: &settings.registry,
        topics: &settings.topics,
    }
}

/// The topics the settings declare, plus the retry topics of `groups` and
/// of every `[[http.subscriptions]]` entry's default group
/// (`topics ensure` and `topics describe`).
pub fn declared_topics(settings: &Settings, groups: &[String]) -> Vec<TopicSpec> {
    let subscription_groups = settings
        .http
        .subscriptions
        .iter()
        .map(|s| crate::delivery::default_group(&s.name));
    crate::topics::declared(&settings.topics, groups.iter().cloned().chain(subscription_groups))
}
