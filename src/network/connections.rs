//! Bounds on the connections the node's gRPC client port holds, so that no
//! caller — unauthenticated, idle or many — can take all of a node's file
//! descriptors: connections open at once in total and per peer IP address,
//! each counted from its accept (a TLS handshake included) until it closes.
//! One more is closed at once, before a byte is read (logged at most every
//! 10 s, with how many). The numbers are node flags
//! (`--grpc-connections-max`, `--grpc-connections-per-ip-max`), local to
//! each node, never replicated. This module owns the count — the HTTP port
//! counts its connections with it too ([`Gate::place`]; `http_api::limits`
//! answers a refused caller in JSON before it closes) — and the wrapper
//! that holds a connection's place; it reads and writes nothing on the
//! connections.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Default of `--grpc-connections-max`: far below a node's descriptor
/// limit, far above what its clients open (a client library holds one
/// connection per node it talks to).
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;
/// Default of `--grpc-connections-per-ip-max`: a whole machine of clients
/// (or a NAT, or the node's own HTTP API and a proxy on loopback) shares
/// one address.
pub const CONNECTIONS_PER_IP_MAX_DEFAULT: usize = 1024;
/// Largest `--grpc-connections-max` accepted.
pub const CONNECTIONS_MAX_MAX: usize = 1 << 20;
/// The least time between two warnings of refused connections.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The client port's bounds on its connections (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once, all peers together.
    pub connections_max: usize,
    /// Connections open at once from one peer IP address.
    pub connections_per_ip_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_ip_max: CONNECTIONS_PER_IP_MAX_DEFAULT,
        }
    }
}

impl ConnectionLimits {
    /// Checks the bounds as a whole; the error names the flags of `port`
    /// (`"grpc"`: `grpc_connections_max`, `grpc_connections_per_ip_max`).
    pub fn validate(&self, port: &str) -> Result<(), String> {
        if !(1..=CONNECTIONS_MAX_MAX).contains(&self.connections_max) {
            return Err(format!(
                "{port}_connections_max must be in 1..={CONNECTIONS_MAX_MAX}"
            ));
        }
        if !(1..=self.connections_max).contains(&self.connections_per_ip_max) {
            return Err(format!(
                "{port}_connections_per_ip_max must be in 1..={port}_connections_max ({})",
                self.connections_max
            ));
        }
        Ok(())
    }
}

/// The bound one more connection would break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// As many as `max` are open from its address.
    PerIp { max: usize },
    /// As many as `max` are open in all.
    Total { max: usize },
}

/// The connections open on a port, counted in total and per peer IP.
pub struct Gate {
    limits: ConnectionLimits,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// Only addresses with a connection open: the map never outgrows
    /// `connections_max`.
    per_ip: BTreeMap<IpAddr, usize>,
    /// Refused by [`Gate::admit`] since its last warning, and when that was.
    refused: u64,
    warned: Option<Instant>,
}

impl Gate {
    pub fn new(limits: ConnectionLimits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            open: Mutex::new(Open::default()),
        })
    }

    /// A place for one more connection from `peer`, held until the slot is
    /// dropped, or the bound it would break.
    pub fn place(self: &Arc<Gate>, peer: IpAddr) -> Result<Slot, Refused> {
        // An IPv4 client of a dual-stack listener is one address either way.
        let ip = peer.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let from_ip = open.per_ip.get(&ip).copied().unwrap_or(0);
        if from_ip >= self.limits.connections_per_ip_max {
            return Err(Refused::PerIp {
                max: self.limits.connections_per_ip_max,
            });
        }
        if open.total >= self.limits.connections_max {
            return Err(Refused::Total {
                max: self.limits.connections_max,
            });
        }
        open.total += 1;
        *open.per_ip.entry(ip).or_default() += 1;
        Ok(Slot {
            gate: self.clone(),
            ip,
        })
    }

    /// `stream`, from `peer`, holding its place until it is dropped;
    /// `None` (the stream dropped, so closed) when either bound is reached,
    /// with a warning at most every [`REFUSED_LOG_EVERY`].
    pub fn admit<S>(self: &Arc<Gate>, stream: S, peer: IpAddr) -> Option<Admitted<S>> {
        let refused = match self.place(peer) {
            Ok(slot) => {
                return Some(Admitted {
                    stream,
                    _slot: Some(slot),
                });
            }
            Err(refused) => refused,
        };
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.refused += 1;
        let now = Instant::now();
        if open
            .warned
            .is_none_or(|warned| now.duration_since(warned) >= REFUSED_LOG_EVERY)
        {
            tracing::warn!(
                refused = open.refused,
                last_from = %peer,
                last_bound = ?refused,
                open_total = open.total,
                "gRPC client connections refused (--grpc-connections-max, \
                 --grpc-connections-per-ip-max)"
            );
            open.refused = 0;
            open.warned = Some(now);
        }
        None
    }

    /// Connections open, and addresses with one open (for tests).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        (open.total, open.per_ip.len())
    }
}

/// One open connection's place in the count, given back when dropped.
pub struct Slot {
    gate: Arc<Gate>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .gate
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.per_ip.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.per_ip.remove(&self.ip);
            }
        }
    }
}

/// A connection admitted by a [`Gate`]: the stream itself to whoever reads
/// and writes it (TLS, the gRPC server), its place given back when it closes.
pub struct Admitted<S> {
    stream: S,
    _slot: Option<Slot>,
}

impl<S> Admitted<S> {
    /// A connection of a port without a gate (the peer port).
    pub fn ungated(stream: S) -> Admitted<S> {
        Admitted {
            stream,
            _slot: None,
        }
    }
}

impl<S: Connected> Connected for Admitted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Admitted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(context, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Admitted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(context, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(context, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Places are refused past either bound and given back on drop.
    #[test]
    fn admits_within_both_bounds_and_frees_on_drop() {
        let gate = Gate::new(ConnectionLimits {
            connections_max: 3,
            connections_per_ip_max: 2,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = gate.admit((), a).expect("first from a");
        let _second = gate.admit((), a).expect("second from a");
        assert!(gate.admit((), a).is_none(), "a third from a");
        let _third = gate.admit((), b).expect("first from b");
        assert!(gate.admit((), b).is_none(), "a fourth in all");
        drop(first);
        assert!(gate.admit((), a).is_some(), "a's place given back");
        // An IPv4 address mapped into IPv6 is the same address.
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        let _b_again = gate.admit((), mapped).expect("room for b");
        assert!(
            gate.admit((), b).is_none(),
            "b at its bound, either spelling"
        );
    }

    #[test]
    fn limits_are_checked() {
        assert!(ConnectionLimits::default().validate("grpc").is_ok());
        let bad = ConnectionLimits {
            connections_max: 2,
            connections_per_ip_max: 3,
        };
        assert!(
            bad.validate("grpc")
                .unwrap_err()
                .starts_with("grpc_connections_per_ip_max")
        );
    }
}
