//! Waking the relay when the API commits new outbox rows.
//!
//! Without it an idle relay finds a new row only at its next poll, so every
//! event of a quiet system waits half a poll interval on average (and a
//! whole one at worst) before it is even claimed. Polling faster costs a
//! database query per relay per interval, forever. Instead, the order API
//! sends one small UDP datagram to each relay after each business
//! transaction commits ([`WakeNotifier::notify`]), and an idle relay waits
//! on its socket ([`WakeListener::wait`]) as well as on its poll timer:
//! a datagram starts its next claim at once.
//!
//! Why UDP: no broker, no connection to keep, nothing to block. Sending
//! never waits (a full socket buffer drops the datagram) and never fails a
//! request. A lost datagram, a relay that listens nowhere, or an API that
//! knows no relay address all fall back to the poll: the wake-up only
//! shortens the wait, correctness never depends on it (the relay still
//! claims what is in the table, not what it was told).
//!
//! Datagrams coalesce: one [`WakeListener::wait`] drains every datagram
//! queued, so a burst of commits costs the relay one claim. Datagrams that
//! arrive while the relay works make its next wait return at once: rows
//! committed during a claim are claimed right after it.
//!
//! Configuration: `[outbox] wake_listen` (relay, `--wake-listen`) and
//! `[outbox] wake_targets` (API, `--wake-relay`), see [`super::OutboxSettings`].

use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// What a wake-up datagram carries (its content is not checked: any
/// datagram on the port wakes the relay, the worst a stray one does is an
/// early poll).
const DATAGRAM: &[u8] = b"orderpipe-outbox-wake";

/// How often a [`WakeNotifier`] resolves its host names again (a headless
/// Service's name resolves to the relay pods running now).
pub const RESOLVE_EVERY: Duration = Duration::from_secs(15);

/// The relay's side: a UDP socket whose datagrams end an idle wait.
#[derive(Debug)]
pub struct WakeListener {
    socket: tokio::net::UdpSocket,
}

impl WakeListener {
    /// Listens on `addr` (port 0: any free port, see [`Self::local_addr`]).
    /// Call inside a tokio runtime.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket: tokio::net::UdpSocket::from_std(socket)?,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Waits until a wake-up datagram arrives (true) or `timeout` passes
    /// (false). Every datagram already queued is consumed with the first,
    /// so a burst wakes once.
    pub async fn wait(&self, timeout: Duration) -> bool {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(timeout, self.socket.recv_from(&mut buf)).await {
            Ok(Ok(_)) => {
                while self.socket.try_recv_from(&mut buf).is_ok() {}
                true
            }
            Ok(Err(e)) => {
                // Not expected on an unconnected socket; the poll covers it.
                tracing::debug!(error = %e, "wake-up socket read failed");
                false
            }
            Err(_elapsed) => false,
        }
    }
}

/// The API's side: sends a wake-up datagram to every relay address,
/// without ever waiting.
#[derive(Debug, Clone)]
pub struct WakeNotifier {
    socket: Arc<UdpSocket>,
    resolved: Arc<RwLock<Vec<SocketAddr>>>,
}

impl WakeNotifier {
    /// A notifier of `targets` (`host:port` each). Names are resolved now
    /// and then every [`RESOLVE_EVERY`] in the background when a tokio
    /// runtime runs (a name that does not resolve yet, such as a Service
    /// without pods, is tried again then).
    pub fn new(targets: &[String]) -> io::Result<Self> {
        let socket = UdpSocket::bind(("0.0.0.0", 0))?;
        socket.set_nonblocking(true)?;
        let notifier = Self {
            socket: Arc::new(socket),
            resolved: Arc::new(RwLock::new(resolve(targets))),
        };
        let literal = targets.iter().all(|t| t.parse::<SocketAddr>().is_ok());
        if !literal && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (targets, resolved) = (targets.to_vec(), Arc::downgrade(&notifier.resolved));
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(RESOLVE_EVERY).await;
                    let addrs = {
                        let targets = targets.clone();
                        tokio::task::spawn_blocking(move || resolve(&targets))
                            .await
                            .unwrap_or_default()
                    };
                    // The notifier is gone: stop.
                    let Some(resolved) = resolved.upgrade() else {
                        return;
                    };
                    *resolved.write().expect("wake targets lock") = addrs;
                }
            });
        }
        Ok(notifier)
    }

    /// The notifier of `settings.wake_targets`; None when there are none.
    pub fn from_settings(settings: &super::OutboxSettings) -> io::Result<Option<Self>> {
        if settings.wake_targets.is_empty() {
            Ok(None)
        } else {
            Self::new(&settings.wake_targets).map(Some)
        }
    }

    /// The addresses wake-ups go to now.
    pub fn targets(&self) -> Vec<SocketAddr> {
        self.resolved.read().expect("wake targets lock").clone()
    }

    /// Sends one wake-up to every relay address; never blocks, never fails
    /// (a datagram that cannot be sent is dropped: the relay's poll finds
    /// the rows).
    pub fn notify(&self) {
        for addr in self.resolved.read().expect("wake targets lock").iter() {
            if let Err(e) = self.socket.send_to(DATAGRAM, addr) {
                tracing::debug!(%addr, error = %e, "wake-up datagram not sent");
            }
        }
    }
}

/// Every address of `targets` that resolves now (IPv4 only when the
/// notifier's socket is IPv4).
fn resolve(targets: &[String]) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    for target in targets {
        match target.to_socket_addrs() {
            Ok(found) => addrs.extend(found.filter(SocketAddr::is_ipv4)),
            Err(e) => {
                tracing::warn!(target, error = %e, "wake-up target does not resolve (yet); the relay's poll finds the rows meanwhile")
            }
        }
    }
    addrs.sort_unstable();
    addrs.dedup();
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_datagram_wakes_and_a_burst_wakes_once() {
        let listener = WakeListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(
            !listener.wait(Duration::from_millis(50)).await,
            "nothing sent: times out"
        );
        let notifier = WakeNotifier::new(&[addr.to_string()]).unwrap();
        assert_eq!(notifier.targets(), vec![addr]);
        for _ in 0..20 {
            notifier.notify();
        }
        // Loopback delivers at once; give the datagrams a moment to queue.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = std::time::Instant::now();
        assert!(listener.wait(Duration::from_secs(5)).await);
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            !listener.wait(Duration::from_millis(50)).await,
            "the burst was drained by one wait"
        );
    }

    #[test]
    fn addresses_are_checked_naming_the_field() {
        let ok = crate::outbox::OutboxSettings {
            wake_listen: "0.0.0.0:7070".into(),
            wake_targets: vec!["orderpipe-relay:7070".into()],
            ..Default::default()
        };
        assert_eq!(ok.validate(), Ok(()));
        let bad = crate::outbox::OutboxSettings {
            wake_listen: "7070".into(),
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .starts_with("outbox.wake_listen: `7070` is not host:port")
        );
        let bad = crate::outbox::OutboxSettings {
            wake_targets: vec!["relay:http".into()],
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .starts_with("outbox.wake_targets: `relay:http`")
        );
        assert_eq!(crate::outbox::OutboxSettings::default().validate(), Ok(()));
    }

    #[test]
    fn an_unresolvable_target_is_skipped_not_an_error() {
        let notifier =
            WakeNotifier::new(&["no-such-host.invalid:7070".into(), "127.0.0.1:9".into()]).unwrap();
        assert_eq!(notifier.targets(), vec!["127.0.0.1:9".parse().unwrap()]);
        notifier.notify();
    }
}
