//! `orderpipe dlq ignore`: close dead letters without replaying them.
//!
//! A dead letter may be the head of a parked key (see [`crate::ordering`]):
//! later events of its order are held behind it. Ignoring it is then a
//! choice the operator makes explicitly, never by default:
//!
//! * [`Followers::Release`]: the held records are applied in their order
//!   (by the group's consumer, within seconds) and the key is unparked;
//! * [`Followers::KeepHeld`]: they stay held behind the ignored head, until
//!   the head is replayed or ignored again with `--release-followers`.
//!
//! Without a choice, a head with nothing held behind it is released.

use serde::Serialize;

use super::held;
use super::store::{self, DeadLetterRecord};
use crate::db::{Db, DbError};
use crate::ordering::{self, Origin};

/// What happens to the records held behind an ignored head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followers {
    /// Apply them now, in order, and unpark the key.
    Release,
    /// Keep them held behind the ignored head.
    KeepHeld,
}

/// What an ignore did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct IgnoreSummary {
    /// Rows marked ignored.
    pub ignored: usize,
    /// Keys whose held records will be applied (group, key, records held).
    pub released: Vec<(String, String, i64)>,
    /// Keys whose records stay held (group, key, records held).
    pub kept_held: Vec<(String, String, i64)>,
}

/// Why nothing was ignored.
#[derive(Debug, thiserror::Error)]
pub enum IgnoreError {
    /// Some rows head parked keys with records held behind them and no
    /// choice was given.
    #[error("{0}")]
    ChoiceNeeded(String),
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

/// The parked key a dead letter heads, if it does, with the number of
/// records held behind it.
pub async fn heading(
    db: &Db,
    row: &DeadLetterRecord,
) -> Result<Option<(ordering::Parked, i64)>, DbError> {
    let Some(key) = row
        .key
        .as_ref()
        .map(|k| String::from_utf8_lossy(k).into_owned())
    else {
        return Ok(None);
    };
    let r = &row.row;
    let origin = Origin {
        topic: r.original_topic.clone(),
        partition: r.original_partition,
        offset: r.original_offset,
    };
    let Some(parked) =
        held::headed_by(db, &r.consumer_group, &key, &origin, r.event_id.as_deref()).await?
    else {
        return Ok(None);
    };
    let held = held::held_count(db, &r.consumer_group, &parked.order_key()).await?;
    Ok(Some((parked, held)))
}

/// Marks `rows` ignored with `reason`, deciding for heads of parked keys
/// as `followers` says. Changes nothing when a head has records held behind
/// it and `followers` is None.
pub async fn ignore(
    db: &Db,
    rows: &[DeadLetterRecord],
    reason: &str,
    followers: Option<Followers>,
) -> Result<IgnoreSummary, IgnoreError> {
    let mut heads = Vec::new();
    for row in rows {
        if let Some((parked, held)) = heading(db, row).await? {
            heads.push((
                row.row.id,
                (row.row.consumer_group.clone(), parked.order_key(), held),
            ));
        }
    }
    let waiting: Vec<String> = heads
        .iter()
        .filter(|(_, (_, _, held))| *held > 0)
        .map(|(id, (group, key, held))| {
            format!(
                "dead letter {id} heads {key} for group {group} with {held} records held behind it"
            )
        })
        .collect();
    if followers.is_none() && !waiting.is_empty() {
        return Err(IgnoreError::ChoiceNeeded(format!(
            "{}.\nAdd --release-followers to apply them now in their original order, or --keep-held to keep them \
             held (replay the head later, or ignore it again with --release-followers). See them with \
             `orderpipe dlq list --status held`.",
            waiting.join(";\n")
        )));
    }
    let mut summary = IgnoreSummary::default();
    for row in rows {
        store::mark_ignored(db, row.row.id, reason).await?;
        summary.ignored += 1;
    }
    for (_, (group, key, held)) in heads {
        if followers == Some(Followers::KeepHeld) {
            summary.kept_held.push((group, key.key, held));
        } else {
            ordering::mark_release(db, &group, &key).await?;
            summary.released.push((group, key.key, held));
        }
    }
    Ok(summary)
}
