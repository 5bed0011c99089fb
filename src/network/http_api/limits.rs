//! The HTTP port's bounds on its callers, so that no client — slow,
//! unauthenticated or many — can hold or fill a node through it: open
//! connections in total and per peer IP address (one more is refused at
//! once with a JSON 503), the time a request's body may take to arrive
//! (408 after it) and the bytes of request bodies held at once (503 past
//! it). They are node flags (`--http-connections-max`,
//! `--http-connections-per-ip-max`, `--http-body-timeout-ms`,
//! `--http-body-buffer-bytes-max`; docs/http.md, "Limits"), local to each
//! node, never replicated. This module holds the numbers and counts the
//! connections; it reads and writes nothing on them.

use super::body::BODY_BYTES_MAX;
use super::errors::HttpError;
use axum::http::StatusCode;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Default of `--http-connections-max`.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Default of `--http-connections-per-ip-max`: as many as requests in
/// flight per node, so one address can use them all, and no more.
pub const CONNECTIONS_PER_IP_MAX_DEFAULT: usize = 64;
/// Default of `--http-body-timeout-ms`: 12 MiB (the largest body) arrive
/// in 10 s at 10 Mbit/s.
pub const BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `--http-body-buffer-bytes-max`: five bodies of the largest
/// size, or thousands of usual ones.
pub const BODY_BUFFER_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Largest `--http-connections-max` accepted.
pub const CONNECTIONS_MAX_MAX: usize = 1 << 20;
/// Largest `--http-body-timeout-ms` accepted: an hour.
pub const BODY_TIMEOUT_MAX: Duration = Duration::from_secs(3_600);
/// Largest `--http-body-buffer-bytes-max` accepted: 64 GiB.
pub const BODY_BUFFER_BYTES_MAX_MAX: usize = 64 << 30;

/// The HTTP port's bounds (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections open at once, all peers together (TLS handshakes and
    /// idle keep-alive connections included).
    pub connections_max: usize,
    /// Connections open at once from one peer IP address.
    pub connections_per_ip_max: usize,
    /// How long a request's body may take to arrive, from when the
    /// request's headers have been read and its caller authenticated.
    pub body_timeout: Duration,
    /// Bytes of request bodies held at once (being read, or read and
    /// waiting for their call to end), all requests together.
    pub body_buffer_bytes_max: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_ip_max: CONNECTIONS_PER_IP_MAX_DEFAULT,
            body_timeout: BODY_TIMEOUT_DEFAULT,
            body_buffer_bytes_max: BODY_BUFFER_BYTES_MAX_DEFAULT,
        }
    }
}

impl HttpLimits {
    /// Why these bounds cannot work, if they cannot: each within its
    /// range, no more per address than in total, and room for one body of
    /// the largest size.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=CONNECTIONS_MAX_MAX).contains(&self.connections_max) {
            return Err(format!(
                "http_connections_max must be in 1..={CONNECTIONS_MAX_MAX}"
            ));
        }
        if !(1..=self.connections_max).contains(&self.connections_per_ip_max) {
            return Err(format!(
                "http_connections_per_ip_max must be in 1..=http_connections_max ({})",
                self.connections_max
            ));
        }
        if self.body_timeout.is_zero() || self.body_timeout > BODY_TIMEOUT_MAX {
            return Err(format!(
                "http_body_timeout_ms must be in 1..={}",
                BODY_TIMEOUT_MAX.as_millis()
            ));
        }
        if !(BODY_BYTES_MAX..=BODY_BUFFER_BYTES_MAX_MAX).contains(&self.body_buffer_bytes_max) {
            return Err(format!(
                "http_body_buffer_bytes_max must be in {BODY_BYTES_MAX}..={BODY_BUFFER_BYTES_MAX_MAX} \
                 (at least one body of the largest size)"
            ));
        }
        Ok(())
    }
}

/// Connections open on the HTTP port, counted in total and per peer IP
/// address.
pub(super) struct Connections {
    limits: HttpLimits,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// Only addresses with a connection open: the map never outgrows
    /// `connections_max`.
    per_ip: BTreeMap<IpAddr, usize>,
}

/// One open connection's place in the count, given back when dropped.
pub(super) struct Slot {
    connections: Arc<Connections>,
    ip: IpAddr,
}

impl Connections {
    pub(super) fn new(limits: HttpLimits) -> Arc<Connections> {
        Arc::new(Connections {
            limits,
            open: Mutex::new(Open::default()),
        })
    }

    /// A place for one more connection from `peer`, or the refusal to
    /// answer it with.
    pub(super) fn open(self: &Arc<Connections>, peer: IpAddr) -> Result<Slot, HttpError> {
        // An IPv4 client of a dual-stack listener is one address either way.
        let ip = peer.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let from_ip = open.per_ip.get(&ip).copied().unwrap_or(0);
        if from_ip >= self.limits.connections_per_ip_max {
            let max = self.limits.connections_per_ip_max;
            return Err(HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!(
                    "{ip} has {max} HTTP connections open to this node, its most \
                     (--http-connections-per-ip-max): reuse them (keep-alive) or close some"
                ),
            )
            .with("http_connections_per_ip_max", Json::from(max)));
        }
        if open.total >= self.limits.connections_max {
            let max = self.limits.connections_max;
            return Err(HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!(
                    "this node has {max} HTTP connections open, its most \
                     (--http-connections-max): try again later, or another node"
                ),
            )
            .with("http_connections_max", Json::from(max)));
        }
        open.total += 1;
        *open.per_ip.entry(ip).or_default() += 1;
        Ok(Slot {
            connections: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .connections
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_ip: usize) -> HttpLimits {
        HttpLimits {
            connections_max: total,
            connections_per_ip_max: per_ip,
            ..HttpLimits::default()
        }
    }

    /// Connections are refused past the bound of their address, or past
    /// the total, each refusal naming its bound; a closed connection gives
    /// its place back, and an address with none open is forgotten.
    #[test]
    fn connections_are_bounded_per_address_and_in_total() {
        let connections = Connections::new(limits(3, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        let first = connections.open(a).unwrap();
        let _second = connections.open(a).unwrap();
        let refused = connections.open(a).err().unwrap();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.body()["http_connections_per_ip_max"], 2);
        let _third = connections.open(b).unwrap();
        let refused = connections.open("10.0.0.2".parse().unwrap()).err().unwrap();
        assert_eq!(refused.body()["http_connections_max"], 3);
        drop(first);
        let _again = connections.open(b).unwrap();
        assert!(connections.open(a).is_err(), "the total is reached again");
        let open = connections.open.lock().unwrap();
        assert_eq!(open.total, 3);
        assert_eq!(open.per_ip.len(), 2);
    }

    /// The defaults are valid; zero, more per address than in total, a
    /// buffer smaller than one largest body and values past their range
    /// are refused.
    #[test]
    fn limits_are_checked() {
        assert_eq!(HttpLimits::default().validate(), Ok(()));
        for bad in [
            limits(0, 1),
            limits(4, 0),
            limits(4, 5),
            limits(CONNECTIONS_MAX_MAX + 1, 1),
            HttpLimits {
                body_timeout: Duration::ZERO,
                ..HttpLimits::default()
            },
            HttpLimits {
                body_timeout: BODY_TIMEOUT_MAX + Duration::from_millis(1),
                ..HttpLimits::default()
            },
            HttpLimits {
                body_buffer_bytes_max: BODY_BYTES_MAX - 1,
                ..HttpLimits::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
