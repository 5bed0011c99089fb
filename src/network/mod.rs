//! The network adapter: the node's tonic services (peer RPCs for Raft, the
//! client and admin APIs, the HTTP API), the one write path (`proposer`),
//! TLS and authentication, and the server's failures named as wire reasons
//! (`status`). The wire itself — generated types, conversion, the spelling
//! of a status — is `oncekv_wire`'s; this adapter must not decide new /
//! duplicate / conflict, nor refuse a request before its entry applies
//! (rule 3).

#[cfg(feature = "server")]
pub mod admin_api;
#[cfg(feature = "server")]
pub mod auth;
#[cfg(feature = "server")]
pub mod client_api;
#[cfg(feature = "server")]
pub mod client_wire;
pub mod credentials;
#[cfg(feature = "server")]
pub mod faults;
#[cfg(feature = "server")]
pub mod http_api;
#[cfg(feature = "server")]
pub mod peer;
#[cfg(feature = "server")]
pub mod proposer;
#[cfg(feature = "server")]
pub mod status;
#[cfg(feature = "server")]
pub mod tls;
