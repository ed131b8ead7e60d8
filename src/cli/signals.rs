//! SIGTERM and SIGINT, caught from the start of a long-running command.
//!
//! A handler installed only when a command first waits for its shutdown
//! (after connecting, creating topics, fencing its producer) leaves the
//! first half second to the default disposition: a SIGTERM then kills the
//! process (status -15) instead of stopping it. [`install`] is the first
//! thing every long-running command does (cdc, deliver, consume, relay, api,
//! console, dlq persist, subs serve): a signal during start-up is remembered,
//! and the command stops at its first chance with status 0. A second
//! signal exits at once (status 130); with no second signal, a stop that
//! overruns `--stop-timeout` exits with status 124 ([`crate::stopping`]).

use std::sync::OnceLock;

use tokio::sync::watch;

/// Set to `true` by the first signal; one per process.
static STOP: OnceLock<watch::Receiver<bool>> = OnceLock::new();

/// Installs the SIGTERM and SIGINT handlers now (idempotent). Needs the
/// tokio runtime.
pub fn install() -> std::io::Result<()> {
    if STOP.get().is_some() {
        return Ok(());
    }
    let (stop, stopped) = watch::channel(false);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        if STOP.set(stopped).is_err() {
            return Ok(());
        }
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "stopping (a second signal exits at once)");
            crate::stopping::arm();
            let _ = stop.send(true);
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
            eprintln!("second signal: exiting at once");
            std::process::exit(130);
        });
    }
    #[cfg(not(unix))]
    {
        if STOP.set(stopped).is_err() {
            return Ok(());
        }
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            crate::stopping::arm();
            let _ = stop.send(true);
        });
    }
    Ok(())
}

/// Resolves once SIGINT or SIGTERM has come, also when it came before this
/// call (after [`install`]); installs the handlers if nothing did yet.
pub async fn shutdown_signal() {
    install().expect("SIGTERM and SIGINT handlers install");
    let mut stopped = STOP.get().expect("installed above").clone();
    // An error means the sender is gone: nothing can signal any more; stop.
    let _ = stopped.wait_for(|stop| *stop).await;
}
