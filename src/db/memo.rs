//! [`Memo`]: what a process may remember about the database between
//! transactions, shared by a [`super::Db`] and its transactions.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// Facts that, once read from committed rows, stay true for the process:
/// the id of a dedup group (a `dedup_groups` row is never renamed or
/// deleted), and whether the pre-upgrade `event_dedup_legacy` table is gone
/// (it is dropped once and never recreated).
#[derive(Debug, Default)]
pub struct Memo {
    group_ids: Mutex<HashMap<String, i64>>,
    legacy: AtomicU8,
}

/// Whether `event_dedup_legacy` exists, as far as a [`Memo`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legacy {
    /// Not looked up yet.
    Unknown,
    /// There: dedup lookups read it too.
    Present,
    /// Gone (or never there).
    Gone,
}

impl Memo {
    /// The id of dedup group `name`, if read before.
    pub fn group_id(&self, name: &str) -> Option<i64> {
        self.group_ids.lock().expect("memo lock").get(name).copied()
    }

    /// Remembers a group id read from a committed row.
    pub fn remember_group(&self, name: &str, id: i64) {
        let mut ids = self.group_ids.lock().expect("memo lock");
        ids.insert(name.to_string(), id);
    }

    /// What is known about the legacy dedup table.
    pub fn legacy(&self) -> Legacy {
        match self.legacy.load(Ordering::Relaxed) {
            1 => Legacy::Present,
            2 => Legacy::Gone,
            _ => Legacy::Unknown,
        }
    }

    /// Records what a lookup found.
    pub fn set_legacy(&self, legacy: Legacy) {
        let value = match legacy {
            Legacy::Unknown => 0,
            Legacy::Present => 1,
            Legacy::Gone => 2,
        };
        self.legacy.store(value, Ordering::Relaxed);
    }
}
