//! Commit stamps for the end-to-end latency benchmark (`dev/bench-latency.sh`).
//!
//! The order API (`bench-drive-orders --stamps FILE`) and a consumer
//! (`[chaos] commit_stamps = FILE`) each append one line per event right
//! after their database commit returned: `<event_id>\t<microseconds since
//! the epoch>`, the consumer's with a third column, the record's Kafka
//! timestamp in ms (the relay's produce time, where the latency is split). Joined on the event id, the difference is the time from the
//! API's commit to the consumer's commit, both stamped after the fact, so
//! neither side's transaction time is left out (a stamp taken before the
//! commit, or inside the consumer's transaction, leaves it out).
//!
//! One `write` per committed transaction, under a lock; a build without the
//! harness, or a run without the option, has no stamps at all.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;

use crate::clock::{CommitStamps, now_us};

/// Appends `<event_id>\t<µs>` lines to a file.
pub struct StampFile {
    file: Mutex<File>,
}

impl StampFile {
    /// Appends to `path` (created if missing).
    pub fn append(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }
}

impl CommitStamps for StampFile {
    fn committed(&self, event_ids: &[uuid::Uuid]) {
        let now = now_us();
        let mut lines = String::with_capacity(event_ids.len() * 54);
        for id in event_ids {
            lines.push_str(&format!("{id}\t{now}\n"));
        }
        self.write(&lines);
    }

    fn applied(&self, events: &[(uuid::Uuid, Option<i64>)]) {
        let now = now_us();
        let mut lines = String::with_capacity(events.len() * 68);
        for (id, produced_ms) in events {
            match produced_ms {
                Some(ms) => lines.push_str(&format!("{id}\t{now}\t{ms}\n")),
                None => lines.push_str(&format!("{id}\t{now}\n")),
            }
        }
        self.write(&lines);
    }
}

impl StampFile {
    /// One write of whole lines (O_APPEND): lines never interleave.
    fn write(&self, lines: &str) {
        if let Err(e) = self
            .file
            .lock()
            .expect("stamp file lock")
            .write_all(lines.as_bytes())
        {
            tracing::warn!(error = %e, "commit stamps not written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_committed_event_gets_one_line_with_a_stamp_taken_now() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stamps.tsv");
        let stamps = StampFile::append(&path).unwrap();
        let ids = [uuid::Uuid::now_v7(), uuid::Uuid::now_v7()];
        let before = now_us();
        stamps.committed(&ids);
        stamps.committed(&ids[..1]);
        let after = now_us();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<(&str, i64)> = text
            .lines()
            .map(|l| {
                let (id, us) = l.split_once('\t').unwrap();
                (id, us.parse().unwrap())
            })
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].0, ids[0].to_string());
        assert_eq!(lines[1].0, ids[1].to_string());
        assert_eq!(lines[2].0, ids[0].to_string());
        assert!(lines.iter().all(|(_, us)| (before..=after).contains(us)));
        // A consumer's stamps carry the record's Kafka timestamp.
        stamps.applied(&[(ids[1], Some(1_700_000_000_123)), (ids[0], None)]);
        let text = std::fs::read_to_string(&path).unwrap();
        let last: Vec<Vec<&str>> = text
            .lines()
            .skip(3)
            .map(|l| l.split('\t').collect())
            .collect();
        assert_eq!(last.len(), 2);
        assert_eq!(
            (last[0][0], last[0][2]),
            (ids[1].to_string().as_str(), "1700000000123")
        );
        assert_eq!(
            (last[1][0], last[1].len()),
            (ids[0].to_string().as_str(), 2)
        );
    }
}
