//! SIGTERM in the first half second of `cdc`, the router (`deliver`
//! without `--subscription`), `consume` and `relay`: the handler is
//! installed at process start, so the process stops with status 0 instead
//! of dying by the signal. The half second counts from the handler's
//! installation, which the kernel shows (`SigCgt` in /proc/<pid>/status).

use std::process::Child;
use std::time::{Duration, Instant};

use crate::helpers::TestEnv;

/// Sends SIGTERM to `child` `after` its SIGTERM handler is installed;
/// returns its exit status (killed after 60 s if it never exits) and its
/// stderr.
///
/// The clock starts at the handler, as the kernel shows it, not at the
/// spawn: before it, SIGTERM's default action ends any process, and under
/// the parallel phase's load a debug build took over 80 ms to get there.
fn sigterm_after(mut child: Child, after: Duration) -> (std::process::ExitStatus, String) {
    // Still early: a handler installed only after the connections (a
    // regression) would take longer than this.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !catches_sigterm(child.id()) {
        assert!(
            Instant::now() < deadline,
            "no SIGTERM handler within 2 s of the start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(after);
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Whether process `pid` has a handler for SIGTERM: bit 15 of the
/// `SigCgt` mask in /proc/<pid>/status.
fn catches_sigterm(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (SIGTERM - 1)) != 0)
}

/// SIGTERM's number on Linux.
const SIGTERM: u32 = 15;

#[tokio::test(flavor = "multi_thread")]
async fn a_sigterm_in_the_first_half_second_stops_every_long_running_command_with_status_0() {
    let mut env = TestEnv::new().with_database().await.with_cdc();
    env.cli(&["topics", "ensure", "--group", "sig.consumer"])
        .success();
    let database = format!("op_{}", env.prefix);
    // A table of the migrated database (it has a primary key).
    let table = format!("{database}.event_dedup");
    let server_id = crate::helpers::cdc_server_id();
    let cdc = [
        "cdc",
        "--table",
        &table,
        "--server-id",
        &server_id,
        "--health-addr",
        "127.0.0.1:0",
    ];
    env.set_env(
        "ORDERPIPE_CONSOLE__VIEWER_TOKEN",
        crate::console_browser::VIEWER_TOKEN,
    );
    let commands: [(&str, &[&str]); 7] = [
        ("cdc", &cdc),
        ("router", &["deliver", "--health-addr", "127.0.0.1:0"]),
        (
            "consume",
            &[
                "consume",
                "--group",
                "sig.consumer",
                "--handler",
                "inventory",
            ],
        ),
        ("relay", &["relay", "--instance", "sig"]),
        ("console", &["console", "--listen", "127.0.0.1:0"]),
        (
            "dlq persist",
            &["dlq", "persist", "--health-addr", "127.0.0.1:0"],
        ),
        ("subs serve", &["subs", "serve", "--addr", "127.0.0.1:0"]),
    ];
    for after_ms in [80, 300] {
        for (what, args) in commands {
            let child = env
                .command(args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let after = Duration::from_millis(after_ms);
            let (status, stderr) = tokio::task::block_in_place(|| sigterm_after(child, after));
            assert!(
                status.success(),
                "{what}, SIGTERM after {after_ms} ms: {status:?}\n{stderr}"
            );
        }
    }
}
