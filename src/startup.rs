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
use crate::outbox::log_relay::LogRelaySections;
use crate::outbox::relay::RelaySections;
use crate::topics::TopicSpec;

/// glibc malloc arenas a process uses at most, unless `MALLOC_ARENA_MAX`
/// says otherwise (glibc's own limit: 8 per core).
pub const MALLOC_ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]. Every thread that
/// allocates (librdkafka's broker and main threads, tokio's workers and
/// blocking pool) otherwise gets an arena of its own, and memory freed in
/// one arena is not reused by another: a consumer on a 1M backlog peaked
/// at ~76 MB with glibc's limit and ~70 MB with 2 (docs/tuning.md, "Memory").
/// `MALLOC_ARENA_MAX` in the environment wins: glibc reads it itself. Call
/// before any thread starts. Returns whether the cap was set here.
pub fn cap_malloc_arenas() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return false;
        }
        // SAFETY: mallopt sets one allocator parameter; glibc takes it under its own lock.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

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

/// What the log-based relay reads of the settings.
pub fn log_relay_sections(settings: &Settings) -> LogRelaySections<'_> {
    LogRelaySections {
        relay: relay_sections(settings),
        outbox: &settings.outbox,
        cdc: &settings.cdc,
        database_url: &settings.database.url,
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
    crate::topics::declared(
        &settings.topics,
        groups.iter().cloned().chain(subscription_groups),
    )
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The child's marker: set, the test runs as the measured child process.
    const CHILD: &str = "STARTUP_ARENA_TEST_CHILD";

    /// Arenas (`<heap nr=...>`) glibc reports for this process.
    fn arenas() -> usize {
        let file = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: a dup of an open descriptor, written through stdio and closed here.
        let text = unsafe {
            let stream = libc::fdopen(libc::dup(fd), c"w".as_ptr());
            assert!(!stream.is_null());
            libc::malloc_info(0, stream);
            libc::fclose(stream);
            let mut text = String::new();
            std::io::Read::read_to_string(
                &mut std::fs::File::open(format!("/proc/self/fd/{fd}")).unwrap(),
                &mut text,
            )
            .unwrap();
            text
        };
        text.matches("<heap nr=").count()
    }

    /// Eight threads allocating at once, holding their memory until all have.
    fn allocate_in_threads() {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let held: Vec<Vec<u8>> = (0..200).map(|i| vec![i as u8; 1024]).collect();
                    barrier.wait();
                    held.len()
                })
            })
            .collect();
        threads
            .into_iter()
            .for_each(|t| assert_eq!(t.join().unwrap(), 200));
    }

    #[test]
    fn malloc_arenas_are_capped_unless_the_environment_sets_them() {
        if let Some(mode) = std::env::var_os(CHILD) {
            let capped = cap_malloc_arenas();
            allocate_in_threads();
            println!("capped={capped} arenas={}", arenas());
            assert_eq!(capped, mode == "cap");
            return;
        }
        let run = |mode: &str, arena_max: Option<&str>| {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap());
            child.args([
                "--exact",
                "startup::tests::malloc_arenas_are_capped_unless_the_environment_sets_them",
                "--nocapture",
                "--test-threads=1",
            ]);
            child.env(CHILD, mode).env_remove("MALLOC_ARENA_MAX");
            if let Some(max) = arena_max {
                child.env("MALLOC_ARENA_MAX", max);
            }
            let out = child.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let arenas = stdout
                .split("arenas=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap();
            arenas.parse::<usize>().unwrap()
        };
        let capped = run("cap", None);
        assert!(
            capped <= MALLOC_ARENAS as usize,
            "{capped} arenas with the cap"
        );
        // The environment wins, and without a cap the same threads take more arenas.
        let uncapped = run("env", Some("16"));
        assert!(
            uncapped > MALLOC_ARENAS as usize,
            "{uncapped} arenas with MALLOC_ARENA_MAX=16"
        );
    }
}
