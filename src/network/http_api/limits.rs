//! The HTTP port's bounds on its callers, so that no client — slow,
//! unauthenticated or many — can hold or fill a node through it: open
//! connections in total and per peer IP address (one more is refused at
//! once with a JSON 503), the time a request's body may take to arrive
//! (408 after it) and the bytes of request bodies held at once (503 past
//! it). They are node flags (`--http-connections-max`,
//! `--http-connections-per-ip-max`, `--http-body-timeout-ms`,
//! `--http-body-buffer-bytes-max`; docs/http.md, "Limits"), local to each
//! node, never replicated. This module holds the numbers and words a
//! refused connection's answer; the count is `network::connections`'s (the
//! client port's too). It reads and writes nothing on the connections.

use super::body::BODY_BYTES_MAX;
use super::errors::HttpError;
use crate::network::connections::{ConnectionLimits, Gate, Refused, Slot};
use axum::http::StatusCode;
use serde_json::Value as Json;
use std::net::IpAddr;
use std::sync::Arc;
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
/// Largest `--http-connections-max` accepted (as `--grpc-connections-max`).
pub use crate::network::connections::CONNECTIONS_MAX_MAX;
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
        self.connection_limits().validate("http")?;
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

    /// The connection bounds, as the gate counting them takes them.
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            connections_max: self.connections_max,
            connections_per_ip_max: self.connections_per_ip_max,
        }
    }
}

/// Connections open on the HTTP port, counted in total and per peer IP
/// address (by the client port's own [`Gate`]).
pub(super) struct Connections {
    gate: Arc<Gate>,
}

impl Connections {
    pub(super) fn new(limits: HttpLimits) -> Connections {
        Connections {
            gate: Gate::new(limits.connection_limits()),
        }
    }

    /// A place for one more connection from `peer`, or the refusal to
    /// answer it with.
    pub(super) fn open(&self, peer: IpAddr) -> Result<Slot, HttpError> {
        self.gate.place(peer).map_err(|refused| match refused {
            Refused::PerIp { max } => HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!(
                    "{} has {max} HTTP connections open to this node, its most \
                     (--http-connections-per-ip-max): reuse them (keep-alive) or close some",
                    peer.to_canonical()
                ),
            )
            .with("http_connections_per_ip_max", Json::from(max)),
            Refused::Total { max } => HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                format!(
                    "this node has {max} HTTP connections open, its most \
                     (--http-connections-max): try again later, or another node"
                ),
            )
            .with("http_connections_max", Json::from(max)),
        })
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
        assert_eq!(connections.gate.counts(), (3, 2));
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
