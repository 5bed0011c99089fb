//! How the harness's binaries (`jepsen-like`, `failover-bench`) end on a
//! signal: SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal hangs up
//! its process group) all end the run the same way, by dropping it, which
//! drops its cluster: every node is SIGKILLed and reaped, every container
//! removed. Left to their default action these signals would end the
//! harness without its drops (and SIGHUP reaches the nodes too, which take
//! it as "reload certificates" and keep running). It only listens; what a
//! run does on the way out is the run's own drop.

use std::io;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The termination signals, listened to from [`Terminations::listen`] on:
/// from then on they no longer end the process by themselves.
pub struct Terminations {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Terminations {
    /// Starts listening (inside a tokio runtime).
    pub fn listen() -> io::Result<Terminations> {
        Ok(Terminations {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves when one of the signals arrives, with its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{Signal as Sig, raise};

    /// Once listening, each of the three signals is received (by name)
    /// instead of ending the process.
    #[tokio::test]
    async fn each_termination_signal_is_received() {
        let mut terminations = Terminations::listen().unwrap();
        for (signal, name) in [
            (Sig::SIGHUP, "SIGHUP"),
            (Sig::SIGTERM, "SIGTERM"),
            (Sig::SIGINT, "SIGINT"),
        ] {
            raise(signal).unwrap();
            let received =
                tokio::time::timeout(std::time::Duration::from_secs(10), terminations.recv())
                    .await
                    .expect("the signal is received");
            assert_eq!(received, name);
        }
    }
}
