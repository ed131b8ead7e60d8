//! The four kinds of control-plane record (sources, event definitions,
//! consumers, subscriptions) behind one trait, so the admin API
//! ([`super::admin`]) and `orderpipe subs` show, add, update, enable,
//! disable and remove every kind with one generic function each, instead
//! of one copy per kind.
//!
//! Each impl only maps the operation to its [`Store`] method; the checks,
//! SQL and errors stay in the store.

use std::fmt::Display;
use std::future::Future;
use std::str::FromStr;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::model::*;
use super::store::{Store, SubscriptionQuery};
use super::{Invalid, SubsError};

/// A kind of record the control plane keeps, with its key, its inputs and
/// its operations on a [`Store`].
pub trait Record: Serialize + Sized + Send + Sync + 'static {
    /// Its key: a name (sources, consumers), a routing key (events) or an id (subscriptions).
    type Key: Display + FromStr + Send + Sync;
    /// The input that adds one.
    type New: DeserializeOwned + Send + Sync;
    /// The changes to one; unset fields stay.
    type Patch: DeserializeOwned + Send + Sync;
    /// The kind's name in messages and commands: `source`, `event`, `consumer`, `subscription`.
    const KIND: &'static str;

    /// The key given as text (a path segment, a command argument); only an
    /// id can fail: `id: `x1` is not a subscription id (a number)`.
    fn parse_key(text: &str) -> Result<Self::Key, Invalid> {
        text.parse().map_err(|_| {
            Invalid::new(
                "id",
                format!("`{text}` is not a {} id (a number)", Self::KIND),
            )
        })
    }

    /// The patch that only enables or disables one; None when the kind has
    /// no enabled flag (event definitions).
    fn enabled_patch(_enabled: bool) -> Option<Self::Patch> {
        None
    }

    /// Every record of the kind.
    fn list(store: &Store) -> impl Future<Output = Result<Vec<Self>, SubsError>> + Send;

    /// The record with `key`.
    fn get(store: &Store, key: &Self::Key) -> impl Future<Output = Result<Self, SubsError>> + Send;

    /// Adds one; `order_topic` is the topic of event names that are no CDC
    /// routing key ([`default_topic`]), for the kinds that create events.
    fn add(
        store: &Store,
        new: &Self::New,
        order_topic: &str,
    ) -> impl Future<Output = Result<Self, SubsError>> + Send;

    /// Changes the record with `key`; returns it as it is now.
    fn update(
        store: &Store,
        key: &Self::Key,
        patch: &Self::Patch,
    ) -> impl Future<Output = Result<Self, SubsError>> + Send;

    /// Removes the record with `key`; returns it as it was.
    fn remove(
        store: &Store,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Self, SubsError>> + Send;
}

impl Record for Source {
    type Key = String;
    type New = NewSource;
    type Patch = SourcePatch;
    const KIND: &'static str = "source";

    fn enabled_patch(enabled: bool) -> Option<SourcePatch> {
        Some(SourcePatch {
            enabled: Some(enabled),
            ..SourcePatch::default()
        })
    }
    async fn list(store: &Store) -> Result<Vec<Self>, SubsError> {
        store.list_sources().await
    }
    async fn get(store: &Store, name: &String) -> Result<Self, SubsError> {
        store.source(name).await
    }
    async fn add(store: &Store, new: &NewSource, _: &str) -> Result<Self, SubsError> {
        store.add_source(new).await
    }
    async fn update(store: &Store, name: &String, patch: &SourcePatch) -> Result<Self, SubsError> {
        store.update_source(name, patch).await
    }
    async fn remove(store: &Store, name: &String) -> Result<Self, SubsError> {
        store.remove_source(name).await
    }
}

impl Record for EventDefinition {
    type Key = String;
    type New = NewEvent;
    type Patch = EventPatch;
    const KIND: &'static str = "event";

    async fn list(store: &Store) -> Result<Vec<Self>, SubsError> {
        store.list_events().await
    }
    async fn get(store: &Store, routing_key: &String) -> Result<Self, SubsError> {
        store.event(routing_key).await
    }
    async fn add(store: &Store, new: &NewEvent, order_topic: &str) -> Result<Self, SubsError> {
        store.add_event(new, order_topic).await
    }
    async fn update(
        store: &Store,
        routing_key: &String,
        patch: &EventPatch,
    ) -> Result<Self, SubsError> {
        store.update_event(routing_key, patch).await
    }
    async fn remove(store: &Store, routing_key: &String) -> Result<Self, SubsError> {
        store.remove_event(routing_key).await
    }
}

impl Record for Consumer {
    type Key = String;
    type New = NewConsumer;
    type Patch = ConsumerPatch;
    const KIND: &'static str = "consumer";

    fn enabled_patch(enabled: bool) -> Option<ConsumerPatch> {
        Some(ConsumerPatch {
            enabled: Some(enabled),
            ..ConsumerPatch::default()
        })
    }
    async fn list(store: &Store) -> Result<Vec<Self>, SubsError> {
        store.list_consumers().await
    }
    async fn get(store: &Store, name: &String) -> Result<Self, SubsError> {
        store.consumer(name).await
    }
    async fn add(store: &Store, new: &NewConsumer, _: &str) -> Result<Self, SubsError> {
        store.add_consumer(new).await
    }
    async fn update(
        store: &Store,
        name: &String,
        patch: &ConsumerPatch,
    ) -> Result<Self, SubsError> {
        store.update_consumer(name, patch).await
    }
    async fn remove(store: &Store, name: &String) -> Result<Self, SubsError> {
        store.remove_consumer(name).await
    }
}

impl Record for Subscription {
    type Key = i64;
    type New = NewSubscription;
    type Patch = SubscriptionPatch;
    const KIND: &'static str = "subscription";

    fn enabled_patch(enabled: bool) -> Option<SubscriptionPatch> {
        Some(SubscriptionPatch {
            enabled: Some(enabled),
            ..SubscriptionPatch::default()
        })
    }
    async fn list(store: &Store) -> Result<Vec<Self>, SubsError> {
        store
            .list_subscriptions(&SubscriptionQuery::default())
            .await
    }
    async fn get(store: &Store, id: &i64) -> Result<Self, SubsError> {
        store.subscription(*id).await
    }
    async fn add(
        store: &Store,
        new: &NewSubscription,
        order_topic: &str,
    ) -> Result<Self, SubsError> {
        store.add_subscription(new, order_topic).await
    }
    async fn update(store: &Store, id: &i64, patch: &SubscriptionPatch) -> Result<Self, SubsError> {
        store.update_subscription(*id, patch).await
    }
    async fn remove(store: &Store, id: &i64) -> Result<Self, SubsError> {
        store.remove_subscription(*id).await
    }
}
