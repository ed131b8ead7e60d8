//! Following the control plane without reading every table: each change
//! (CLI, admin API, console, `POST /refresh`, `POST /reload`) writes a
//! `control_requests` row in its transaction, and ids only grow.
//! [`ChangeWatch`] keeps the newest id its owner acted on and says whether
//! a newer one came; the owner re-reads what it needs when one did, and
//! marks it acted on only once that re-read succeeded, so a failed re-read
//! is tried again at the next poll. The router and `orderpipe cdc --source`
//! both follow the tables this way; each decides what an error means for
//! it (the router backs off and keeps its groups, cdc keeps its capture).

use std::time::Duration;

use super::{Store, SubsError};

/// How often the owners of a [`ChangeWatch`] read the newest request (one
/// query by primary key).
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The newest `control_requests` id acted on (see the module docs).
#[derive(Debug, Clone)]
pub struct ChangeWatch {
    store: Store,
    /// None: nothing acted on yet; Some(None): acted on an empty table.
    acted_on: Option<Option<i64>>,
}

/// The newest request id read by [`ChangeWatch::check`], and whether the
/// watch has not acted on it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Latest {
    id: Option<i64>,
    new: bool,
}

impl Latest {
    /// Whether a request came since the owner last acted (always, before it
    /// ever acted).
    pub fn is_new(&self) -> bool {
        self.new
    }
}

impl ChangeWatch {
    /// A watch that has acted on nothing: every [`check`](Self::check)
    /// says "new" until the owner first calls [`acted`](Self::acted).
    pub fn new(store: Store) -> Self {
        Self {
            store,
            acted_on: None,
        }
    }

    /// A watch that has acted on every request so far. Make it before
    /// reading what the requests change: a change written while that read
    /// runs is then seen again at the next check.
    pub async fn from_now(store: Store) -> Result<Self, SubsError> {
        let latest = store.latest_request().await?.map(|r| r.id);
        Ok(Self {
            store,
            acted_on: Some(latest),
        })
    }

    /// The store the watch reads.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Reads the newest request id and compares it with the one acted on.
    pub async fn check(&self) -> Result<Latest, SubsError> {
        let id = self.store.latest_request().await?.map(|r| r.id);
        Ok(Latest {
            id,
            new: self.acted_on != Some(id),
        })
    }

    /// Records that the owner acted on every request up to `latest`.
    pub fn acted(&mut self, latest: Latest) {
        self.acted_on = Some(latest.id);
    }

    /// Whether the owner has acted once (made with [`from_now`](Self::from_now), or
    /// [`acted`](Self::acted) called).
    pub fn has_acted(&self) -> bool {
        self.acted_on.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::store::{Origin, RequestKind};

    #[tokio::test]
    async fn a_request_is_new_until_acted_on_and_a_later_one_is_new_again() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let store = Store::new(db, Origin::Cli);
        let mut fresh = ChangeWatch::new(store.clone());
        assert!(!fresh.has_acted());
        // Before the owner ever acted, even an empty table is news.
        let latest = fresh.check().await.unwrap();
        assert!(latest.is_new());
        fresh.acted(latest);
        assert!(fresh.has_acted());
        assert!(!fresh.check().await.unwrap().is_new());

        store.request(RequestKind::Reload, None).await.unwrap();
        let mut caught_up = ChangeWatch::from_now(store.clone()).await.unwrap();
        assert!(caught_up.has_acted());
        assert!(!caught_up.check().await.unwrap().is_new());
        let latest = fresh.check().await.unwrap();
        assert!(latest.is_new());
        // Not acted on (the owner's re-read failed): still new at the next check.
        assert!(fresh.check().await.unwrap().is_new());
        fresh.acted(latest);
        assert!(!fresh.check().await.unwrap().is_new());

        store.request(RequestKind::Refresh, None).await.unwrap();
        let latest = caught_up.check().await.unwrap();
        assert!(latest.is_new());
        caught_up.acted(latest);
        assert!(!caught_up.check().await.unwrap().is_new());
        assert!(fresh.check().await.unwrap().is_new());
    }
}
